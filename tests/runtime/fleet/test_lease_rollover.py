"""A worker that lost its lease starts nothing of what it held, also while it is between
its old id and its new one (matrix finding M5).

``Ownership.rollover`` drops the old id and registers a new one. Until that registration
lands (it may meet a store error, and it always takes a write), the worker is
unregistered, and ``lease_current`` used to answer True for any owner then: a sync
action or a side effect dispatched before the worker stalled passed its fence after it
was let go on and ran after another worker had taken the instance over and finished it
(``plain-stop-*-2-sqlite`` in the full matrix, most runs). Both backends, the store's own
calls; one refused renewal and one failed registration are simulated.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from fsm_engine import Machine, State, Transition
from fsm_engine.errors import StoreError


class Ctx(BaseModel):
    n: int = 0


def _go(ctx: Ctx) -> dict[str, int]:
    return {"n": 1}


FLOW = Machine("rollover_flow", context=Ctx,
               states=[State("init", action=_go), State("done", final=True)],
               transitions=[Transition("go", "init", "done")], initial="init")


def test_a_claim_of_the_old_id_is_not_current_while_the_new_one_registers(
        engine_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engine_factory()
    own, store = engine.ownership, engine.store
    own.register()
    (iid,) = engine.start_many(FLOW, [{}], enqueue=True)
    (rec,) = own.claim(10)
    old = own.id
    assert rec.owner == old and own.lease_current(old)

    def unreachable(*args: object) -> None:
        raise StoreError("database restarting")
    monkeypatch.setattr(store, "renew_worker", lambda worker, now: False)  # lease lost
    monkeypatch.setattr(store, "put_worker", unreachable)  # the new id not yet registered
    with pytest.raises(StoreError):
        own.renew()
    assert own.id != old and not own.registered
    assert not own.lease_current(old), "a lost claim passed the fence"
    assert own.lease_current(None)  # an unclaimed instance (``fsm run``) is not fenced
