"""What a run here turns its failures into (``runtime.runner``): the error naming its
instance, the refusal of a claim another worker made first, an unexpected exception as
that instance's outcome."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import FsmError, StaleWrite

log = logging.getLogger("fsm_engine")


def for_instance(exc: FsmError, instance_id: str) -> FsmError:
    """``exc`` naming ``instance_id``: a copy when it names another instance (one store
    failure reaches every step of its batch as the same exception object)."""
    if exc.instance_id in (None, instance_id):
        exc.instance_id = instance_id
        return exc
    copy = type(exc).__new__(type(exc))
    copy.args, copy.__dict__ = exc.args, dict(exc.__dict__, instance_id=instance_id)
    copy.__cause__ = exc.__cause__
    return copy


def lost_claim(instance_id: str) -> StaleWrite:
    return StaleWrite(f"instance {instance_id} was claimed by another worker first",
                      instance_id=instance_id)


async def done(value: Any) -> Any:
    return value


def unexpected(iid: str, exc: Exception) -> FsmError:
    log.error("instance %s stopped by an unexpected error", iid, exc_info=True)
    err = FsmError(f"instance {iid} stopped: {type(exc).__name__}: {exc}", instance_id=iid)
    err.__cause__ = exc
    return err
