"""A digest of one license file: split into sections, summarise each in parallel, compose.

``split`` cuts the file into up to ``MAX_SECTIONS`` sections (blank-line separated
paragraphs, merged to at most ``SECTION_CHARS`` characters each).  ``summarise``
is a ``Map``: one child instance per section, each running the ``section``
machine — the model answers under structured output (``SectionNote``: a title
and one sentence, JSON repaired, one re-ask), retried on transient errors,
with a rule-based note as fallback, so one bad section never sinks the
digest (``tolerated_failure_ratio=0.5``).  The join collects the notes in
section order; ``compose`` writes the digest.  Every section shares the
parent's token budget.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import BaseModel, Field

from fsm_engine import Completion, Machine, Map, RetryPolicy, State, Step, Transition

#: At most this many sections (``FSM_DIGEST_SECTIONS``, read when a file is split).
MAX_SECTIONS = 4
#: At most this many characters per section (``FSM_DIGEST_SECTION_CHARS``).
SECTION_CHARS = 600


class SectionNote(BaseModel):
    """What the model says about one section."""

    title: str = Field(max_length=80)
    gist: str = Field(max_length=300)


class Section(BaseModel):
    """A child's context: one section and its note."""

    index: int
    text: str
    title: str = ""
    gist: str = ""
    note_source: str = ""


async def note(ctx: Section, step: Step) -> dict[str, Any]:
    """Ask for a short title and a one-sentence gist of the section."""
    got = await step.llm.structured(
        [{"role": "system", "content": 'Answer with ONLY a JSON object like '
                                       '{"title": "...", "gist": "..."}.'},
         {"role": "user", "content": f"Give a title and a one-sentence gist of:\n\n{ctx.text}"}],
        SectionNote, max_tokens=80)
    return {"title": got.value.title, "gist": got.value.gist, "note_source": "model"}


def rule_note(ctx: Section) -> dict[str, Any]:
    """Without the model: the first words as the title, the first sentence as the gist."""
    words = ctx.text.split()
    first = re.split(r"(?<=[.!?])\s", ctx.text, maxsplit=1)[0]
    return {"title": " ".join(words[:6])[:80] or f"section {ctx.index + 1}",
            "gist": first[:300], "note_source": "rules"}


section = Machine(
    name="digest-section", context=Section, initial="note", max_transitions=6,
    description="Summarise one section under structured output; a rule note as fallback.",
    states=[
        State("note", action=note, timeout=120, retry=RetryPolicy(max_attempts=2),
              fallback="rule-note"),
        State("rule-note", action=rule_note),
        State("done", final=True),
        State("failed", final=True, failure=True),
    ],
    transitions=[Transition("ok", "note", "done"), Transition("ok", "rule-note", "done")])


class Digest(BaseModel):
    """The parent's context."""

    path: str
    sections: list[dict[str, Any]] = []
    notes: list[dict[str, Any] | None] = []
    digest: str = ""


def split(ctx: Digest) -> dict[str, Any]:
    """Read the file; cut it into at most MAX_SECTIONS sections of at most SECTION_CHARS."""
    most = int(os.environ.get("FSM_DIGEST_SECTIONS", MAX_SECTIONS))
    size = int(os.environ.get("FSM_DIGEST_SECTION_CHARS", SECTION_CHARS))
    with open(ctx.path, encoding="utf-8", errors="replace") as fh:
        paragraphs = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", fh.read())]
    sections: list[str] = []
    for para in filter(None, paragraphs):
        if sections and len(sections[-1]) + len(para) < size:
            sections[-1] += " " + para
        elif len(sections) < most:
            sections.append(para[:size])
    return {"sections": [{"index": i, "text": s} for i, s in enumerate(sections)]}


def keep_notes(outputs: list[dict[str, Any] | None]) -> list[dict[str, Any] | None]:
    """The reducer: each section's note (title, gist, source) in section order."""
    return [None if o is None else {k: o[k] for k in ("index", "title", "gist", "note_source")}
            for o in outputs]


def compose(ctx: Digest) -> dict[str, Any]:
    """The digest: one line per section that has a note."""
    lines = [f"{n['index'] + 1}. {n['title']}: {n['gist']}" for n in ctx.notes if n]
    return {"digest": f"{os.path.basename(ctx.path)}\n" + "\n".join(lines)}


machine = Machine(
    name="digest", context=Digest, initial="split", max_transitions=10, token_budget=4000,
    description="Map over a file's sections, one child each, then compose a digest.",
    states=[
        State("split", action=split),
        State("summarise", fan_out=Map(items="sections", machine=section, into="notes",
                                       reducer=keep_notes, max_concurrency=2,
                                       completion=Completion(tolerated_failure_ratio=0.5))),
        State("compose", action=compose),
        State("done", final=True),
        State("failed", final=True, failure=True),
    ],
    transitions=[
        Transition("ok", "split", "summarise"),
        Transition("joined", "summarise", "compose"),
        Transition("branch_failed", "summarise", "failed"),
        Transition("ok", "compose", "done"),
    ])

_DOC = "/usr/share/common-licenses/BSD"

#: Example cases (``fsm test machines/digest.py``): every edge of the parent — the sections
#: noted by the model, and every section failing (a refused call: no fallback) so the join
#: takes ``branch_failed``.
CASES = [
    {"name": "every section noted", "input": {"path": _DOC},
     "replies": [{"text": '{"title": "Terms", "gist": "What may be done."}'}],
     "path": ["split", "summarise", "compose", "done"]},
    {"name": "every section refused", "input": {"path": _DOC},
     "replies": [{"error": "http400"}],
     "path": ["split", "summarise", "failed"], "status": "failed"},
]
