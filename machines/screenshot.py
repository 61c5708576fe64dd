"""The design's DAG: a screenshot analysed for UI structure and for copy, then suggestions.

``analyze_ui`` and ``analyze_copy`` do not depend on each other, so ``dag``
puts them in one ``Parallel`` layer (each a child instance, run at the same
time); ``suggest`` depends on both and runs once they have joined.  The input
is a text rendering of the screen (what an OCR / accessibility-tree step would
give).  ``analyze_copy`` is skippable (a screen without text still gets UI
suggestions); ``analyze_ui`` and ``suggest`` fall back to rules when the model fails.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from fsm_engine import Node, RetryPolicy, Step, dag


class UiReport(BaseModel):
    """The layout as the model sees it."""

    layout: str = Field(max_length=300)
    issues: list[str] = Field(default_factory=list, max_length=5)


class CopyReport(BaseModel):
    """The text on the screen as the model judges it."""

    tone: str = Field(max_length=80)
    issues: list[str] = Field(default_factory=list, max_length=5)


class Suggestions(BaseModel):
    """What to change."""

    suggestions: list[str] = Field(default_factory=list, max_length=5)


class Screen(BaseModel):
    """The instance context."""

    screen: str
    ui: dict[str, Any] = {}
    copy_report: dict[str, Any] = {}
    suggestions: list[str] = []
    suggestions_source: str = ""


def _ask(task: str, ctx: Screen, shape: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"Answer with ONLY a JSON object like {shape}."},
            {"role": "user", "content": f"{task}\n\nScreen:\n{ctx.screen}"}]


async def analyze_ui(ctx: Screen, step: Step) -> dict[str, Any]:
    """Describe the layout and list layout issues."""
    got = await step.llm.structured(_ask("Describe the layout; list issues.", ctx,
                                         '{"layout": "...", "issues": ["..."]}'),
                                    UiReport, max_tokens=96)
    return {"ui": got.value.model_dump()}


def rule_ui(ctx: Screen) -> dict[str, Any]:
    """Without the model: the screen's bracketed elements, in order, as the layout."""
    parts = re.findall(r"\[([a-z]+)", ctx.screen)
    return {"ui": {"layout": ", ".join(parts)[:300] or "unknown", "issues": []}}


async def analyze_copy(ctx: Screen, step: Step) -> dict[str, Any]:
    """Judge the tone of the text and list copy issues."""
    got = await step.llm.structured(_ask("Judge the tone of the text; list issues.", ctx,
                                         '{"tone": "...", "issues": ["..."]}'),
                                    CopyReport, max_tokens=96)
    return {"copy_report": got.value.model_dump()}


async def suggest(ctx: Screen, step: Step) -> dict[str, Any]:
    """Suggest changes from both analyses."""
    facts = f"Layout: {ctx.ui}\nCopy: {ctx.copy_report}"
    got = await step.llm.structured(
        [{"role": "system", "content": 'Answer with ONLY a JSON object like {"suggestions": ["..."]}.'},
         {"role": "user", "content": f"Suggest up to three changes.\n\n{facts}"}],
        Suggestions, max_tokens=96)
    return {"suggestions": got.value.suggestions, "suggestions_source": "model"}


def rule_suggest(ctx: Screen) -> dict[str, Any]:
    """Without the model: the issues both analyses found, as they are."""
    found = [*ctx.ui.get("issues", []), *ctx.copy_report.get("issues", [])]
    return {"suggestions": found[:3] or ["no issues found"], "suggestions_source": "rules"}


machine = dag("screenshot", Screen, [
    Node("analyze_ui", analyze_ui, timeout=120, retry=RetryPolicy(max_attempts=2),
         fallback=rule_ui),
    Node("analyze_copy", analyze_copy, timeout=120, retry=RetryPolicy(max_attempts=2),
         skippable=True, default_output={"copy_report": {"tone": "unknown", "issues": []}}),
    Node("suggest", suggest, depends_on=["analyze_ui", "analyze_copy"], timeout=120,
         fallback=rule_suggest),
], max_transitions=10, token_budget=3000,
    description="Two independent analyses in parallel, then a dependent suggestion step.")

_SCREEN = "[header Shop] [button BUY NOW!!!] [text Cheapest prices, guaranteed]"

#: Example cases (``fsm test machines/screenshot.py``): every edge — the model answering
#: each node, its garbage (rules, a skip and the fallback node), and a refused call that
#: fails the UI branch so the join takes ``branch_failed``.
CASES = [
    {"name": "the model answers", "input": {"screen": _SCREEN},
     "replies": [{"match": "Describe the layout", "text": '{"layout": "header, button"}'},
                 {"match": "Judge the tone", "text": '{"tone": "pushy", "issues": ["caps"]}'},
                 {"match": "Suggest up to three", "text": '{"suggestions": ["calmer copy"]}'}],
     "path": ["analyze_ui & analyze_copy", "suggest", "done"],
     "output": {"suggestions": ["calmer copy"], "suggestions_source": "model"}},
    {"name": "garbage: rules, a skip, the fallback", "input": {"screen": _SCREEN},
     "replies": [{"text": "I am not sure."}],
     "path": ["analyze_ui & analyze_copy", "suggest", "suggest (fallback)", "done"],
     "output": {"suggestions_source": "rules"}},
    {"name": "a refused call fails the UI branch", "input": {"screen": _SCREEN},
     "replies": [{"error": "http400"}],
     "path": ["analyze_ui & analyze_copy", "failed"], "status": "failed"},
]
