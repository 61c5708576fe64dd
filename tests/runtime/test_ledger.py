"""The one writer (issue 20, step 2; issue 37): only ``runtime/ledger.py`` calls a store's
``commit``, ``create``, ``claim``, ``release`` or ``delete``.

An AST scan of the package: any attribute ``commit``, ``create``, ``claim``, ``release`` or
``delete`` read on an expression
naming a store (``store.commit``, ``self.store.delete``, ``engine.store.commit``, passed or
called) outside the ledger, the store backends themselves and the shipped contract suite
fails the test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import fsm_engine

PACKAGE = Path(fsm_engine.__file__).resolve().parent
#: Where ``commit`` and ``delete`` may be reached: the ledger; the backends (their own
#: methods); the contract suite, which tests the store's verbs themselves.
ALLOWED = {PACKAGE / "runtime" / "ledger.py"}
EXEMPT_DIRS = (PACKAGE / "store", PACKAGE / "testing")
#: The store's instance writes only the ledger makes.
VERBS = frozenset({"commit", "create", "debounce", "claim", "release", "delete"})


def _names_store(node: ast.expr) -> bool:
    """True for ``store``, ``x.store``, ``x.y.store``, ``_store`` …"""
    if isinstance(node, ast.Name):
        return node.id.endswith("store")
    return isinstance(node, ast.Attribute) and node.attr.endswith("store")


def _store_commits(path: Path, name: str) -> list[str]:
    """``name:line`` of each store write (``VERBS``) reached in the module at ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [f"{name}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in VERBS
            and _names_store(node.value)]


def test_only_the_ledger_commits() -> None:
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in ALLOWED or any(d in path.parents for d in EXEMPT_DIRS):
            continue
        found += _store_commits(path, str(path.relative_to(PACKAGE.parent)))
    assert found == [], ("Store.commit, create, claim, release or delete called outside "
                         "runtime/ledger.py: "
                         + ", ".join(found))


def test_the_scan_sees_a_commit(tmp_path: Path) -> None:
    """The scan itself finds each form it must refuse (so an empty result means something)."""
    sample = tmp_path / "sample.py"
    sample.write_text("store.commit([s])\nself.store.commit([s])\n"
                      "to_thread(engine.store.commit, [s])\nconn.commit()\n"
                      "store.delete(ids)\nstore.delete_worker(w)\nself.store.create(r)\n"
                      "self.store.claim(req)\nto_thread(runner.store.release, w, ids)\n"
                      "store.claim_review(i, by, now)\n")
    assert _store_commits(sample, "x") == ["x:1", "x:2", "x:3", "x:5", "x:7", "x:8", "x:9"]


def test_the_engine_writes_through_its_ledger(tmp_path: Path) -> None:
    """Every engine commit reaches the store through ``Engine.ledger`` (its group committer
    included): a counting ledger sees the steps of a run and a cancel."""
    import asyncio

    from pydantic import BaseModel

    from fsm_engine import Engine, Machine, State, Transition

    class Ctx(BaseModel):
        n: int = 0

    machine = Machine(name="ledger_t", context=Ctx, initial="a", states=[
        State("a", action=lambda ctx: {"n": ctx.n + 1}), State("done", final=True)],
        transitions=[Transition("ok", "a", "done")])
    eng = Engine(str(tmp_path / "fsm.db"))
    written: list[str] = []
    write = eng.ledger.write

    def counting(steps):  # type: ignore[no-untyped-def]
        written.extend(s.record.id for s in steps)
        return write(steps)
    eng.ledger.write = counting  # type: ignore[method-assign]
    try:
        first = eng.start(machine, {})
        asyncio.run(eng.run(first))
        second = eng.start(machine, {})
        eng.cancel(second)
    finally:
        eng.close()
    assert written.count(first) == 1 and written.count(second) == 1  # a→done; the cancel


#: The only writers of ``fsm_meta`` in the package, and what they keep there: the review
#: links' signing key and spent links (no instance's state: issue 37).
META_WRITERS = {PACKAGE / "runtime" / "kinds" / "review_links.py"}


def test_no_instance_state_in_fsm_meta() -> None:
    """``put_meta`` / ``add_meta`` are reached only from ``META_WRITERS`` (a pause request
    was kept there, apart from its instance's version: issue 36 item 8)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in META_WRITERS or any(d in path.parents for d in EXEMPT_DIRS):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr in ("put_meta", "add_meta")]
    assert found == [], "fsm_meta written outside the known writers: " + ", ".join(found)


def test_claims_releases_and_takeovers_write_the_engines_clock(tmp_path: Path) -> None:
    """With a virtual clock, a claim, a release and a takeover stamp the engine's time
    (``updated_at``, the lease, the recovery row's ``at``), never the wall clock (issue 37:
    ``Store.release`` stamped ``time.time()``, so one run mixed two times)."""
    from pydantic import BaseModel

    from fsm_engine import Machine, State, Transition
    from fsm_engine.store.records import RECOVERY
    from fsm_engine.testing.clock import VirtualClock

    class Ctx(BaseModel):
        n: int = 0

    machine = Machine(name="ledger_clock", context=Ctx, initial="a", states=[
        State("a", action=lambda ctx: {"n": 1}), State("done", final=True)],
        transitions=[Transition("ok", "a", "done")])
    vc = VirtualClock(start=1_000_000.0)
    first, second = vc.engine(tmp_path / "fsm.db"), vc.engine(tmp_path / "fsm.db")
    try:
        iid = first.start(machine, {})  # owned by its starter
        vc.advance(5)
        first.ownership.release([iid])
        assert first.store.get(iid).updated_at == vc.now()
        vc.advance(5)
        [claimed] = first.ownership.claim(5)
        assert claimed.updated_at == vc.now()
        first.ownership.close(keep=[iid])  # gone, still owning it: the next claim takes over
        vc.advance(5)
        [taken] = second.ownership.claim(5)
        assert taken.updated_at == vc.now() and taken.owner == second.worker.id
        [row] = [h for h in second.store.history(iid) if h.kind == RECOVERY]
        assert row.at == vc.now()
        second.ownership.close()
        assert second.store.get(iid).updated_at == vc.now()  # the close's release
    finally:
        first.close()
        second.close()
