"""``Review``: a state where a person decides (the declarative part of the review queue).

Entering a state with ``review=Review(...)`` records a *review item* keyed by
(instance, state, visit) and leaves the instance ``waiting``, holding no
worker.  A decision (``Engine.decide``, ``fsm review decide``) fires the chosen
trigger, one of ``choices`` (each a trigger declared from the state), after
applying the reviewer's edit of the ``editable`` fields.  ``sla_s`` seconds after
the item was opened a worker takes ``on_timeout`` instead (a durable timer: the
waiting instance carries its due time, so any worker or ``fsm resume`` fires it,
once, after any restart).

``REVIEW`` is the review kind as the definition layer sees it (``definition.kind``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from .kind import Site
    from .spec import State


@dataclass(frozen=True, slots=True)
class Review:
    """What a reviewer is shown and may do.

    Args:
        prompt: the question put to the reviewer (one line or a paragraph).
        show: context fields shown with the item (their values when it opened).
        editable: a pydantic model whose fields are context fields the reviewer may
            change with the decision; an edit must validate against it (and then
            against the context model).  ``None``: no edits.
        choices: the decisions offered, each a trigger declared from the state.
        sla_s: seconds the item may stay undecided (``None``: no limit).
        on_timeout: the choice taken when ``sla_s`` passes (required with ``sla_s``).
    """

    prompt: str
    show: Sequence[str] = ()
    editable: type[BaseModel] | None = None
    choices: Sequence[str] = ("approve", "reject")
    sla_s: float | None = None
    on_timeout: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "show", tuple(self.show))
        object.__setattr__(self, "choices", tuple(self.choices))

    @property
    def editable_fields(self) -> tuple[str, ...]:
        """The context fields an edit may set (empty without ``editable``)."""
        return tuple(self.editable.model_fields) if self.editable is not None else ()

    def export(self) -> dict[str, object]:
        """A plain-dict view (diagrams, fingerprint)."""
        return {"prompt": self.prompt, "show": list(self.show),
                "editable": list(self.editable_fields), "choices": list(self.choices),
                "sla_s": self.sla_s, "on_timeout": self.on_timeout}

    def problems(self, state: str, fields: Sequence[str], triggers: Sequence[str]) -> list[str]:
        """What is wrong with this review on ``state`` (context ``fields``, the state's
        declared ``triggers``); empty when nothing is."""
        where = f"state {state!r}: review"
        out = [f"{where}: choice {c!r} is not a trigger declared from {state!r}"
               for c in self.choices if c not in triggers]
        if not self.choices:
            out.append(f"{where}: offers no choices")
        out += [f"{where}: show field {f!r} is not a context field"
                for f in self.show if f not in fields]
        out += [f"{where}: editable field {f!r} is not a context field"
                for f in self.editable_fields if f not in fields]
        if self.sla_s is not None and self.sla_s <= 0:
            out.append(f"{where}: sla_s must be > 0 seconds")
        if (self.sla_s is None) != (self.on_timeout is None):
            out.append(f"{where}: sla_s and on_timeout go together")
        if self.on_timeout is not None and self.on_timeout not in self.choices:
            out.append(f"{where}: on_timeout {self.on_timeout!r} is not one of its choices")
        return out


class ReviewKind:
    """``State(review=Review(...))`` on the ``definition.kind.StateKind`` protocol."""

    name, waits = "review", True

    def matches(self, state: State) -> bool:
        return state.review is not None

    def parks(self, state: State) -> bool:
        return True

    def calls_model(self, state: State) -> bool:
        return False

    def problems(self, site: Site) -> list[str]:
        s = site.state
        assert s.review is not None
        out = []
        if s.final or s.wait or s.action is not None:
            out.append(f"{site.where}: a review state has no action and is neither final "
                       "nor wait")
        return out + s.review.problems(s.name, site.fields, site.triggers)

    def export(self, site: Site) -> dict[str, Any]:
        assert site.state.review is not None
        return {"review": site.state.review.export()}

    def notes(self, exported: Mapping[str, Any]) -> list[str]:
        return []  # drawn by its choices' edges


REVIEW = ReviewKind()
