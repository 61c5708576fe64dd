"""Migration of stored instances to a newer machine version (pure, no I/O).

A machine declares ``version=N``, upcasters ``migrations={k: fn}`` (the context
JSON dict of version ``k - 1`` → that of version ``k``) and
``renamed_states={old: new}``.  An instance records the version and
fingerprint it was written under.  Against the code's machine it is:

- **current**: same version and fingerprint — runs as it is;
- **older**: a lower version — ``plan`` upcasts it: its state mapped through
  ``renamed_states``, its context through every upcaster from its version + 1
  to N, the result validated by the context model; the move is one history row
  (``kind="migration"``, ``detail``: from/to version and fingerprint, the rename,
  the fields removed; ``delta``: the fields added or changed), committed with the
  instance's next step (``attach``) or by ``fsm migrate --yes``;
- **same version, other fingerprint**: refused (``FingerprintMismatch``): the
  structure changed without a version bump, and nothing says how the stored
  context maps — bump ``version`` (with ``migrations={N: None}`` when the
  context did not change);
- **newer**: refused (``VersionTooNew``, both versions named), the row untouched;
- **not migratable** (state gone and not renamed, an upcaster raising, a result
  the model rejects): ``NeedsMigration`` with the cause; the caller leaves the
  row where it is, with reason ``needs_migration``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ...errors import FingerprintMismatch, InvalidInput, NeedsMigration, VersionTooNew
from ...store.records import MIGRATION, HistoryRow, InstanceRecord, StepCommit
from .. import values
from ..compiled import CompiledMachine

#: The reason an instance that cannot be upcast is left with (``fsm list --reason``).
NEEDS_MIGRATION = "needs_migration"


@dataclass(frozen=True, slots=True)
class Upcast:
    """An instance as stored (``before``), as upcast (``record``: same ``version``, its
    ``seq`` counting ``row``) and the history row recording the move."""

    before: InstanceRecord
    record: InstanceRecord
    row: HistoryRow

    @property
    def diff(self) -> dict[str, Any]:
        """``{"from_version", "to_version", "state": [old, new], "added": {…}, "changed":
        {field: [old, new]}, "removed": [...]}`` for a report."""
        old, new = self.before.context, self.record.context
        return {"from_version": self.before.machine_version,
                "to_version": self.record.machine_version,
                "state": [self.before.state, self.record.state],
                "added": {k: v for k, v in new.items() if k not in old},
                "changed": {k: [old[k], v] for k, v in new.items()
                            if k in old and old[k] != v},
                "removed": sorted(k for k in old if k not in new)}


def _where(rec: InstanceRecord) -> str:
    return f"instance {rec.id} of machine {rec.machine!r}"


def refusal(cm: CompiledMachine, rec: InstanceRecord) -> FingerprintMismatch | None:
    """Why ``rec`` cannot be run or upcast by ``cm`` whatever its context holds: a newer
    stored version, or a changed fingerprint under the same version (``None``: fine)."""
    stored, code = rec.machine_version, cm.spec.version
    if stored > code:
        return VersionTooNew(
            f"{_where(rec)} was stored by machine version {stored}; this code has version "
            f"{code}: run it with the newer code (the instance is left as it is)",
            stored=stored, code=code, instance_id=rec.id)
    if stored == code and rec.fingerprint != cm.fingerprint:
        return FingerprintMismatch(
            f"{_where(rec)} was started from another definition under the same version "
            f"{code} (fingerprint {rec.fingerprint}, now {cm.fingerprint}): bump the "
            f"machine's version to {code + 1} (with migrations / renamed_states) to "
            "migrate it", instance_id=rec.id)
    return None


def needed(cm: CompiledMachine, rec: InstanceRecord) -> bool:
    """True when ``rec`` was written under an older version of ``cm``'s machine."""
    return rec.machine_version < cm.spec.version


def _stuck(rec: InstanceRecord, cause: str) -> NeedsMigration:
    return NeedsMigration(f"{_where(rec)} needs migration from version {rec.machine_version}: "
                          f"{cause}", cause=cause, instance_id=rec.id, state=rec.state)


def _state(cm: CompiledMachine, rec: InstanceRecord) -> str:
    name = rec.state
    if name not in cm.states:
        name = cm.spec.renamed_states.get(name, name)
    if name not in cm.states:
        raise _stuck(rec, f"state {rec.state!r} no longer exists and renamed_states does "
                     "not map it")
    return name


def _fit(model: type[BaseModel], raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` validated by ``model``, as JSON; ``InvalidInput`` naming the first problem."""
    try:
        values.check_values(model, raw)
        ctx = values.dump(model.model_validate(raw), raw)
        values.check_json(ctx)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(f"{first['msg']} at "
                           f"{'.'.join(map(str, first['loc'])) or '(root)'}") from None
    return ctx


def upcast_context(cm: CompiledMachine, rec: InstanceRecord) -> dict[str, Any]:
    """``rec.context`` through each upcaster after its version, validated by the model;
    ``NeedsMigration`` naming the upcaster that raised or the field the model refused."""
    ctx = dict(rec.context)
    for k in range(rec.machine_version + 1, cm.spec.version + 1):
        fn = cm.spec.migrations.get(k)
        if fn is None:
            continue
        try:
            out = fn(dict(ctx))
        except Exception as exc:  # noqa: BLE001 - user code: reported, never raised on
            raise _stuck(rec, f"upcaster migrations[{k}] raised {type(exc).__name__}: "
                         f"{exc}") from None
        if not isinstance(out, dict):
            raise _stuck(rec, f"upcaster migrations[{k}] returned {type(out).__name__}, "
                         "not a dict")
        ctx = out
    try:
        return _fit(cm.spec.context, ctx)
    except InvalidInput as exc:
        raise _stuck(rec, f"the upcast context fails {cm.spec.context.__name__}: "
                     f"{exc}") from None


def plan(cm: CompiledMachine, rec: InstanceRecord, now: float) -> Upcast | None:
    """The upcast of ``rec`` to ``cm``'s version (``None``: it is current).

    Raises ``VersionTooNew`` / ``FingerprintMismatch`` (see ``refusal``) or
    ``NeedsMigration`` (with ``cause``); nothing is written either way.
    """
    refused = refusal(cm, rec)
    if refused is not None:
        raise refused
    if not needed(cm, rec):
        return None
    from ..outcome import clone
    state, context = _state(cm, rec), upcast_context(cm, rec)
    new = clone(rec)
    new.state, new.context = state, context
    new.machine_version, new.fingerprint = cm.spec.version, cm.fingerprint
    if state != rec.state:
        new.visits[state] = new.visits.pop(rec.state, 1) + new.visits.get(state, 0)
    new.seq += 1
    new.updated_at = now
    delta = {k: v for k, v in context.items() if rec.context.get(k, _MISSING) != v}
    row = HistoryRow(
        instance_id=rec.id, seq=new.seq, source=rec.state, dest=state, trigger=MIGRATION,
        at=now, kind=MIGRATION, delta=delta, machine_version=cm.spec.version,
        detail={"from_version": rec.machine_version, "to_version": cm.spec.version,
                "from_fingerprint": rec.fingerprint, "to_fingerprint": cm.fingerprint,
                "renamed": [rec.state, state] if state != rec.state else None,
                "removed": sorted(k for k in rec.context if k not in context)})
    if new.reason == NEEDS_MIGRATION:
        new.reason = None
    return Upcast(rec, new, row)


_MISSING = object()


def attach(step: StepCommit, up: Upcast) -> bool:
    """Make ``step`` (built from ``up.record``) also write the upcast, in its transaction:
    the migration row first, the columns diffed against the stored record.  False (step
    unchanged) when ``step`` does not continue from ``up`` (another version, or it
    already carries the row)."""
    if step.expected_version != up.before.version or step.record.id != up.before.id:
        return False
    if step.history and step.history[0] is up.row:
        return False
    first = step.history[0].seq if step.history else step.record.seq + 1
    derived = (step.record.machine_version, step.record.fingerprint) == (
        up.record.machine_version, up.record.fingerprint)
    if not derived or first != up.row.seq + 1:  # built from the stored record, not the upcast
        return False
    step.before = up.before
    step.history[:0] = [up.row]
    if step.record.reason == NEEDS_MIGRATION:
        step.record.reason = None
    return True


def alone(up: Upcast) -> StepCommit:
    """The upcast as a commit of its own (``fsm migrate --yes``): compare-and-set on the
    stored version."""
    return StepCommit(up.record, up.before.version, [up.row], before=up.before)


class Pending(dict[str, Upcast]):
    """The upcasts of instances loaded to step (instance id -> ``Upcast``; the machine
    registry's ``upcast`` fills it), each written with its instance's next commit: the
    migration's hooks on a step's commit (the driver calls ``attach`` before, ``settled``
    after, only while some are pending)."""

    def attach(self, step: StepCommit) -> StepCommit:
        """``step`` carrying its instance's pending upcast, if it continues from it."""
        up = self.get(step.record.id)
        if up is not None:
            attach(step, up)
        return step

    def settled(self, step: StepCommit) -> None:
        """``step`` committed: forget the upcast it wrote."""
        up = self.get(step.record.id)
        if up is not None and step.history and step.history[0] is up.row:
            del self[step.record.id]
