"""The compiled-definition registry: machines by name, the module each came from, load
under ``Trust``, and the stored definitions (``Store.put_definitions``: what the viewer
draws).  The client and the runner read machines only through it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..definition import Machine
from ..errors import DefinitionError
from ..store import Store, definitions
from ..store.records import InstanceRecord
from .compiled import CompiledMachine, compile_machine
from .kinds import migration
from .loader import Trust, load_machine, reference
from .model_registry import Models


def _no_branch(rec: InstanceRecord) -> CompiledMachine:
    raise DefinitionError(rec.machine, [f"module {rec.module} defines no branch machine "
                                        f"{rec.machine!r} (instance {rec.id})"])


def module_ref(machine: Machine) -> str:
    """Where ``machine`` can be loaded again on any host (``loader.reference``)."""
    ns = machine.namespace or {}
    path = ns.get("__file__")
    return reference(path) if path else str(ns.get("__name__", ""))


class Registry:
    """Compiled machines by name (a family's branch machines with their parent), with the
    module each loads from.

    Args:
        store: where ``register`` keeps each machine's export.
        models: checks every state's model name (``Models.check``).
        trust: which modules stored instances name may be imported.
        clock: seconds since the epoch (the stored definitions' time, migration plans).
        upcasts: the driver's pending upcasts by instance id (``upcast`` fills it).
        keep_definitions: False: ``register`` writes no ``definitions`` row (a dry run's
            engine: it writes nothing).
    """

    def __init__(self, store: Store, models: Models, trust: Trust,
                 clock: Callable[[], float],
                 upcasts: dict[str, migration.Upcast], *, keep_definitions: bool = True) -> None:
        self.store, self.models, self.trust, self.clock = store, models, trust, clock
        self.keep_definitions = keep_definitions
        self.machines: dict[str, CompiledMachine] = {}
        self.modules: dict[str, str] = {}
        self.upcasts = upcasts

    def register(self, machine: Machine, module: str | None = None) -> CompiledMachine:
        """Check and compile ``machine``, remember where it came from, and keep its export
        in the store (unless ``keep_definitions`` is off).  Raises ``DefinitionError``
        listing every problem."""
        cm = compile_machine(machine)
        if module is None and self.machines.get(machine.name) is cm:
            return cm  # already registered (start_many calls this for every batch)
        ref = module or module_ref(machine)
        self.models.need(cm.model_use())  # deferred providers (``Models.defer``): built now
        for member in cm.family():  # branch machines load from the parent's module
            self.models.check(member.states)
            self.machines[member.name] = member
            self.modules[member.name] = ref
        if self.keep_definitions:
            self.store.put_definitions(definitions.rows(cm.family(), self.clock()))
        return cm

    def load(self, ref: str, *, named: bool = True) -> CompiledMachine:
        """Load, check and register the machine in module ``ref`` (path or dotted name),
        which is then trusted wherever an instance names it.  ``named``: given by the user,
        not read from the store (``load_machine``: its folder joins ``sys.path``)."""
        machine, canonical = load_machine(ref, named=named)
        self.trust.allow(canonical)
        return self.register(machine, canonical)

    def check_module(self, rec: InstanceRecord) -> None:
        """Return when ``rec``'s machine is registered or its module may be imported here;
        else ``MachineRefused`` naming the instance and the module."""
        if rec.machine not in self.machines:
            self.trust.check(rec.module, rec.id)

    def definition(self, rec: InstanceRecord) -> CompiledMachine:
        """The compiled machine ``rec`` names (loaded from its module when not registered,
        if trusted), whatever version it has; ``DefinitionError`` when it cannot."""
        cm = self.machines.get(rec.machine)
        if cm is None:
            self.check_module(rec)
            cm = self.load(rec.module, named=False)  # stored data: no folder on sys.path
            if cm.name != rec.machine:  # a branch machine: registered with its parent
                cm = self.machines.get(rec.machine) or _no_branch(rec)
        return cm

    def runnable(self, rec: InstanceRecord) -> CompiledMachine:
        """``rec``'s machine, when it can run ``rec`` (at once, or after an upcast: see
        ``migration``); else ``VersionTooNew``, ``FingerprintMismatch`` or
        ``NeedsMigration``."""
        cm = self.definition(rec)
        migration.plan(cm, rec, self.clock())
        return cm

    def upcast(self, cm: CompiledMachine, rec: InstanceRecord) -> InstanceRecord:
        """``rec`` upcast to ``cm``'s version, in memory: the driver writes the upcast with
        the instance's next commit (one transaction).  ``rec`` itself when current."""
        self.upcasts.pop(rec.id, None)
        up = migration.plan(cm, rec, self.clock())
        if up is None:
            return rec
        self.upcasts[rec.id] = up
        return up.record
