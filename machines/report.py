"""A linear report pipeline: extract key figures → summary → table → conclusion → publish.

Each LLM state turns the model's text into a validated pydantic object with
``step.llm.structured`` (JSON repair, schema validation, one re-ask that
counts against the loop cap and the token budget), retries transient
provider errors with backoff, and has a timeout.  ``summarise`` and
``tabulate`` are skippable with a declared default output; ``conclude``
falls back to a rule-based conclusion; ``publish`` is an exactly-once side
effect under an idempotency key.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import BaseModel, Field

from fsm_engine import Machine, RetryPolicy, State, Step, Transition
from fsm_engine.sinks import deliver

MAX_CHARS = int(os.environ.get("FSM_MAX_INPUT_CHARS", "2400"))


class Figures(BaseModel):
    """Key figures the model extracted."""

    figures: list[str] = Field(default_factory=list, max_length=10)


class Summary(BaseModel):
    """A short summary."""

    summary: str


class Conclusion(BaseModel):
    """The final conclusion."""

    conclusion: str


class Report(BaseModel):
    """Instance context."""

    path: str
    text: str = ""
    figures: list[str] = []
    summary: str = ""
    table: str = ""
    conclusion: str = ""
    delivery: dict[str, Any] | None = None


def _ask(task: str, ctx: Report, shape: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"Answer with ONLY a JSON object like {shape}."},
            {"role": "user", "content": f"{task}\n\nDocument:\n{ctx.text}"}]


def load(ctx: Report) -> dict[str, Any]:
    """Read and truncate the document."""
    with open(ctx.path, encoding="utf-8", errors="replace") as fh:
        return {"text": re.sub(r"\s+", " ", fh.read())[:MAX_CHARS]}


async def extract(ctx: Report, step: Step) -> dict[str, Any]:
    """Ask for up to 10 key figures (numbers, dates, names)."""
    got = await step.llm.structured(_ask("List the key figures (numbers, dates, names).", ctx,
                                         '{"figures": ["..."]}'), Figures, max_tokens=160)
    return {"figures": got.value.figures}


async def summarise(ctx: Report, step: Step) -> dict[str, Any]:
    """One-paragraph summary."""
    got = await step.llm.structured(_ask("Summarise in two sentences.", ctx,
                                         '{"summary": "..."}'), Summary, max_tokens=160)
    return {"summary": got.value.summary}


def tabulate(ctx: Report) -> dict[str, Any]:
    """A Markdown table of the figures (no model call)."""
    rows = "\n".join(f"| {i + 1} | {f} |" for i, f in enumerate(ctx.figures))
    return {"table": "| # | figure |\n|---|---|\n" + rows}


async def conclude(ctx: Report, step: Step) -> dict[str, Any]:
    """The model's conclusion from the summary and the table."""
    got = await step.llm.structured(
        [{"role": "user", "content": f"Summary: {ctx.summary}\nTable:\n{ctx.table}\n"
          'Answer with ONLY {"conclusion": "..."}.'}], Conclusion, max_tokens=120)
    return {"conclusion": got.value.conclusion}


def rule_conclusion(ctx: Report) -> dict[str, Any]:
    """Fallback conclusion when the model cannot give one."""
    return {"conclusion": f"{len(ctx.figures)} key figures extracted; see the summary."}


def publish(ctx: Report, step: Step) -> dict[str, Any]:
    """Deliver the report once, under the step's idempotency key."""
    payload = {"instance_id": step.instance_id, "report": {
        "file": os.path.basename(ctx.path), "summary": ctx.summary, "table": ctx.table,
        "conclusion": ctx.conclusion}}
    return {"delivery": deliver(payload, step.idempotency_key)}


LLM = dict(timeout=120.0, retry=RetryPolicy(max_attempts=3, initial_interval=1.0, max_interval=10.0))

machine = Machine(
    name="report",
    context=Report,
    initial="load",
    max_transitions=20,
    token_budget=8000,
    states=[
        State("load", action=load),
        State("extract", action=extract, skippable=True, default_output={"figures": []}, **LLM),
        State("summarise", action=summarise, skippable=True,
              default_output={"summary": "(no summary: the model failed)"}, **LLM),
        State("tabulate", action=tabulate),
        State("conclude", action=conclude, fallback="rule-conclude", **LLM),
        State("rule-conclude", action=rule_conclusion),
        State("publish", action=publish, side_effect=True, timeout=30.0,
              retry=RetryPolicy(max_attempts=5, initial_interval=0.5, max_interval=5.0)),
        State("done", final=True),
        State("failed", final=True, failure=True),
    ],
    transitions=[
        Transition("loaded", "load", "extract"),
        Transition("extracted", "extract", "summarise"),
        Transition("summarised", "summarise", "tabulate"),
        Transition("tabulated", "tabulate", "conclude"),
        Transition("concluded", "conclude", "publish"),
        Transition("concluded", "rule-conclude", "publish"),
        Transition("published", "publish", "done"),
    ],
)

_DOC = "/usr/share/common-licenses/BSD"
_FIGURES, _SUMMARY, _CONCLUSION = "List the key figures", "Summarise in two", 'ONLY {"conclusion"'

#: Example cases (``fsm test machines/report.py``): every edge — the model's answers, its
#: garbage (skips, then the rule-based conclusion) and a provider that stays down.
CASES = [
    {"name": "the model answers", "input": {"path": _DOC},
     "replies": [{"match": _FIGURES, "text": '{"figures": ["BSD", "Regents"]}'},
                 {"match": _SUMMARY, "text": '{"summary": "A permissive license."}'},
                 {"match": _CONCLUSION, "text": '{"conclusion": "Permissive."}'}],
     "path": ["load", "extract", "summarise", "tabulate", "conclude", "publish", "done"],
     "output": {"figures": ["BSD", "Regents"], "conclusion": "Permissive."}},
    {"name": "garbage: skips and the rule", "input": {"path": _DOC},
     "replies": [{"text": "I cannot do that."}],
     "path": ["load", "extract", "summarise", "tabulate", "conclude", "rule-conclude",
              "publish", "done"],
     "output": {"summary": "(no summary: the model failed)",
                "conclusion": "0 key figures extracted; see the summary."}},
    {"name": "the model is down", "input": {"path": _DOC},
     "replies": [{"error": "http500"}],
     "final": "done", "output": {"figures": []}},
]
