"""Reference machine: moderate a text file with an LLM, durably.

init → collect → preprocess → infer → validate → output → notify → done

- collect reads the file; an unreadable or empty file goes to ``failed``.
- preprocess normalises Unicode and whitespace and truncates the text to
  what a small model needs for a verdict (``FSM_MAX_INPUT_CHARS``, default 1,600
  characters ≈ 400 tokens at ~4 characters per token for English: on the 17 license
  files the same 17 decisions as at 2,400, in 98 s instead of 159 s, ``bench/RESULTS.md``).
- infer asks the model for ``{decision, categories, summary}`` JSON (streamed: watch it
  with ``fsm stream ID``); provider
  errors retry with backoff, and when retries are exhausted, the timeout
  fires, the breaker is open or the budget is spent it falls back to
  degraded-infer.
- validate parses, repairs and validates the answer; an invalid answer is
  re-asked (at most ``MAX_INFER`` model answers, bounded by the loop cap and
  the token budget), then degraded-infer takes over.
- degraded-infer asks again under JSON-schema-constrained decoding; when
  that fails too it applies a keyword rule, so every instance completes.
- infer calls the model named ``primary``, degraded-infer the one named
  ``fallback`` (``fsm run --llm primary=openai:gpt-4o-mini --llm fallback=local``);
  with one unnamed ``--llm`` (or none: the embedded model) both are that one.
  Each has its own circuit breaker, so an open breaker on the primary model
  sends instances to the fallback model, not back to the same one.
- with ``FSM_REVIEW=1`` when an instance starts (or ``"review": true`` in a JSON input), a
  ``review`` verdict, and a verdict the keyword rule gave because the model and the
  constrained decoding both failed, go to ``human-review``: a person approves or rejects
  with the machine's verdict shown as the proposal (``fsm review list/decide``); undecided
  after ``FSM_REVIEW_SLA_S`` (default a day) it is rejected.  Without it every instance
  completes automatically.
- notify delivers the verdict once per instance (a side effect under an
  idempotency key: ``FSM_NOTIFY_URL`` webhook, else ``FSM_NOTIFY_FILE``).
"""

from __future__ import annotations

import os
import re
import unicodedata
from typing import Any, Literal

from pydantic import BaseModel, Field

from fsm_engine import FsmError, Machine, RetryPolicy, Review, State, Step, Transition
from fsm_engine.sinks import deliver
from fsm_engine.structured import parse_structured

MAX_INFER = 2
#: Room for the free answer, tokens.  Good verdicts of Qwen2.5-0.5B-Instruct on 8 license
#: files measured 21–68 tokens (mean 32, Qwen tokenizer); fences and a longer summary from
#: other models need more (1.75x the longest seen); an answer cut at the limit is never
#: repaired, only re-asked, and a model that echoes the prompt runs to the limit every time.
VERDICT_TOKENS = 120
READ_CHARS = 1_000_000  # collect reads at most this much; preprocess truncates further
MAX_CHARS = int(os.environ.get("FSM_MAX_INPUT_CHARS", "1600"))


class Verdict(BaseModel):
    """The model's answer."""

    decision: Literal["approve", "reject", "review"]
    categories: list[str]
    summary: str


class Moderation(BaseModel):
    """Instance context."""

    path: str
    text: str = ""
    truncated: bool = False
    raw: str = ""
    finish_reason: str = ""
    infer_attempts: int = 0
    validation_errors: list[str] = []
    repairs: list[str] = []
    verdict: Verdict | None = None
    verdict_source: str = ""
    result: dict[str, Any] | None = None
    delivery: dict[str, Any] | None = None
    #: Send doubtful verdicts to a person (``FSM_REVIEW=1`` when the instance starts).
    review: bool = Field(default_factory=lambda: os.environ.get("FSM_REVIEW") == "1")


#: The schema used for constrained decoding: Verdict with bounded lengths, so the
#: grammar cannot run past max_tokens (llama.cpp honours maxItems / maxLength).
CONSTRAINED = {
    "type": "object", "additionalProperties": False,
    "required": ["decision", "categories", "summary"],
    "properties": {
        "decision": {"enum": ["approve", "reject", "review"]},
        "categories": {"type": "array", "maxItems": 3,
                       "items": {"type": "string", "maxLength": 24}},
        "summary": {"type": "string", "maxLength": 120},
    },
}

#: The categories are described, not shown as a placeholder value: Qwen2.5-0.5B copied
#: ``[short strings]`` into its answer when shown one.
SYSTEM = ("You are a content moderator. Read the user's text and answer with ONLY a JSON "
          'object, no prose: {"decision": "approve" | "reject" | "review", '
          '"categories": [the text\'s topics, one word each], "summary": "one sentence"}.')
#: The schema as earlier prompts wrote it: small models reproduce these placeholders.
FORMAT = ('{"decision": "approve" | "reject" | "review", "categories": [short strings], '
          '"summary": "one sentence"}')


def collect(ctx: Moderation) -> dict[str, Any]:
    """Read the input file (UTF-8, undecodable bytes replaced)."""
    try:
        with open(ctx.path, encoding="utf-8", errors="replace") as fh:
            return {"text": fh.read(READ_CHARS)}
    except OSError as exc:
        return {"text": "", "validation_errors": [f"cannot read {ctx.path}: {exc.strerror}"]}


def has_text(ctx: Moderation) -> bool:
    """Guard: the collected text is not blank."""
    return bool(ctx.text.strip())


def preprocess(ctx: Moderation) -> dict[str, Any]:
    """NFKC-normalise, collapse whitespace, truncate to ``MAX_CHARS``."""
    text = unicodedata.normalize("NFKC", ctx.text)
    text = re.sub(r"[ \t\f\v]+", " ", text)
    text = re.sub(r"\n\s*\n+", "\n\n", text).strip()
    return {"text": text[:MAX_CHARS], "truncated": len(text) > MAX_CHARS}


def _messages(ctx: Moderation) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Text to moderate:\n\n{ctx.text}\n\nJSON verdict:"}]
    if ctx.validation_errors and ctx.raw:
        msgs += [{"role": "assistant", "content": ctx.raw[:1000]},
                 {"role": "user", "content": "That answer was invalid: "
                  + "; ".join(ctx.validation_errors[:5]) + ". Reply with only the JSON object."}]
    return msgs


async def infer(ctx: Moderation, step: Step) -> dict[str, Any]:
    """Ask the model for a verdict (raw text; validate parses it), streamed: ``fsm stream``,
    ``engine.stream`` and the viewer show it, and the fields it decides, as it is written."""
    out = await step.llm.stream(_messages(ctx), max_tokens=VERDICT_TOKENS, temperature=0.0,
                                json_reply=True).complete()
    return {"raw": out.text, "finish_reason": out.finish_reason,
            "infer_attempts": ctx.infer_attempts + 1}


def _normal(text: str) -> str:
    """Lower case, punctuation as spaces, whitespace collapsed: ``"Short strings."`` and
    ``"one sentence,"`` compare equal to the prompt's ``[short strings]`` / ``"one sentence"``."""
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


#: Every fixed word the model is shown (system prompt and the user turn's frame), normalised.
PROMPT_WORDS = _normal(SYSTEM + " " + FORMAT + " Text to moderate: JSON verdict: That answer "
                       "was invalid: Reply with only the JSON object.")


def echoes_prompt(verdict: Verdict) -> bool:
    """True when a phrase of the verdict only repeats the instructions (a model too small to
    follow them copies the prompt's placeholders, e.g. ``"summary": "one sentence"``).

    Phrases are compared normalised (case, punctuation, whitespace: :func:`_normal`); a
    phrase of two or more words that stands whole in the prompt is an echo.
    """
    phrases = (_normal(t) for t in (verdict.summary, *verdict.categories))
    return any(len(p.split()) >= 2 and f" {p} " in f" {PROMPT_WORDS} " for p in phrases)


ECHO = "the answer repeats the instructions instead of judging the text"


def validate(ctx: Moderation) -> dict[str, Any]:
    """Parse, repair and validate the raw answer into a ``Verdict``."""
    try:
        parsed = parse_structured(ctx.raw, Verdict, finish_reason=ctx.finish_reason)
    except FsmError as exc:
        errors = getattr(exc, "errors", None) or [str(exc)]
        return {"verdict": None, "validation_errors": errors,
                "repairs": list(getattr(exc, "repairs", []))}
    if echoes_prompt(parsed.value):
        return {"verdict": None, "validation_errors": [ECHO], "repairs": list(parsed.repairs)}
    return {"verdict": parsed.value, "validation_errors": [], "repairs": list(parsed.repairs),
            "verdict_source": "model"}


def verdict_ok(ctx: Moderation) -> bool:
    """Guard: validate produced a verdict."""
    return ctx.verdict is not None


def can_reask(ctx: Moderation, run: Any) -> bool:
    """Guard: another model answer is allowed (attempts and budget left)."""
    left = run.tokens_remaining
    return ctx.infer_attempts < MAX_INFER and (left is None or left > 400)


RULES = {"reject": ("kill", "bomb", "terror", "slur"), "review": ("weapon", "drug", "violence")}


def rule_verdict(text: str) -> Verdict:
    """Keyword rule used when the model cannot produce a valid verdict."""
    low = text.lower()
    for decision in ("reject", "review"):
        hits = [w for w in RULES[decision] if w in low]
        if hits:
            return Verdict(decision=decision, categories=hits,  # type: ignore[arg-type]
                           summary=f"rule-based: matched {', '.join(hits)}")
    return Verdict(decision="approve", categories=[], summary="rule-based: no flagged terms")


async def degraded_infer(ctx: Moderation, step: Step) -> dict[str, Any]:
    """Schema-constrained decoding; keyword rule when that fails or the budget is spent."""
    try:
        if step.tokens_remaining is None or step.tokens_remaining > 300:
            out = await step.llm.complete(_messages(ctx)[:2], max_tokens=120,
                                          json_schema=CONSTRAINED)
            parsed = parse_structured(out.text, Verdict, finish_reason=out.finish_reason)
            if not echoes_prompt(parsed.value):
                return {"verdict": parsed.value, "verdict_source": "constrained"}
            step.notes["constrained_error"] = ECHO
    except FsmError as exc:
        step.notes["constrained_error"] = str(exc)[:300]
    return {"verdict": rule_verdict(ctx.text), "verdict_source": "rules"}


def rule_infer(ctx: Moderation) -> dict[str, Any]:
    """Last resort when constrained decoding timed out: the keyword rule."""
    return {"verdict": rule_verdict(ctx.text), "verdict_source": "rules"}


def output(ctx: Moderation) -> dict[str, Any]:
    """Shape the published record."""
    assert ctx.verdict is not None
    return {"result": {"file": os.path.basename(ctx.path), "source": ctx.verdict_source,
                       **ctx.verdict.model_dump()}}


def notify(ctx: Moderation, step: Step) -> dict[str, Any]:
    """Deliver the result once, under the step's idempotency key."""
    payload = {"instance_id": step.instance_id, "result": ctx.result}
    return {"delivery": deliver(payload, step.idempotency_key)}


def doubtful(ctx: Moderation) -> bool:
    """Guard: a person should decide (review asked for, and a ``review`` verdict or one the
    keyword rule gave after the model and the constrained decoding both failed)."""
    return ctx.review and ctx.verdict is not None and (
        ctx.verdict.decision == "review" or ctx.verdict_source == "rules")


def _human(ctx: Moderation, decision: str) -> dict[str, Any]:
    proposal = ctx.verdict or Verdict(decision="review", categories=[], summary="")
    verdict = proposal.model_copy(update={"decision": decision})
    return {"verdict": verdict, "verdict_source": "human"}


def human_approved(ctx: Moderation) -> dict[str, Any]:
    """The reviewer approved: the verdict becomes ``approve`` (source ``human``)."""
    return _human(ctx, "approve")


def human_rejected(ctx: Moderation) -> dict[str, Any]:
    """The reviewer rejected (or the SLA passed): the verdict becomes ``reject``."""
    return _human(ctx, "reject")


REVIEW = Review(prompt="Approve or reject this text? The machine's verdict is the proposal.",
                show=["path", "verdict", "verdict_source", "text"],
                choices=["approve", "reject"],
                sla_s=float(os.environ.get("FSM_REVIEW_SLA_S", "86400")), on_timeout="reject")

LLM_RETRY = RetryPolicy(max_attempts=3, initial_interval=1.0, backoff_rate=2.0, max_interval=10.0)

machine = Machine(
    name="moderation",
    context=Moderation,
    initial="init",
    max_transitions=30,
    token_budget=6000,
    tally=("verdict_source",),
    outcome=("verdict.decision", "verdict_source"),
    states=[
        State("init"),
        State("collect", action=collect, queue="io"),
        State("preprocess", action=preprocess),
        State("infer", action=infer, timeout=120.0, retry=LLM_RETRY, fallback="degraded-infer",
              llm="primary", queue="llm"),
        State("degraded-infer", action=degraded_infer, timeout=120.0, fallback="rule-verdict",
              llm="fallback", queue="llm"),
        State("rule-verdict", action=rule_infer),
        State("validate", action=validate),
        State("human-review", review=REVIEW),
        State("human-approved", action=human_approved),
        State("human-rejected", action=human_rejected),
        State("output", action=output),
        State("notify", action=notify, side_effect=True, timeout=30.0, queue="io",
              retry=RetryPolicy(max_attempts=5, initial_interval=0.5, max_interval=5.0)),
        State("done", final=True),
        State("failed", final=True, failure=True),
    ],
    transitions=[
        Transition("start", "init", "collect"),
        Transition("collected", "collect", "preprocess", conditions=has_text),
        Transition("unreadable", "collect", "failed", unless=has_text),
        Transition("prepared", "preprocess", "infer"),
        Transition("answered", "infer", "validate"),
        Transition("budget_exhausted", "infer", "degraded-infer"),
        Transition("doubtful", "validate", "human-review", conditions=[verdict_ok, doubtful]),
        Transition("valid", "validate", "output", conditions=verdict_ok),
        Transition("reask", "validate", "infer", conditions=can_reask),
        Transition("give_up", "validate", "degraded-infer"),
        Transition("doubtful", "degraded-infer", "human-review", conditions=doubtful),
        Transition("degraded", "degraded-infer", "output"),
        Transition("doubtful", "rule-verdict", "human-review", conditions=doubtful),
        Transition("ruled", "rule-verdict", "output"),
        Transition("approve", "human-review", "human-approved"),
        Transition("reject", "human-review", "human-rejected"),
        Transition("approved", "human-approved", "output"),
        Transition("rejected", "human-rejected", "output"),
        Transition("publish", "output", "notify"),
        Transition("notified", "notify", "done"),
    ],
)

_DOC, _MISSING = "/usr/share/common-licenses/BSD", "/nonexistent/moderation-case.txt"
_GOOD = {"text": '{"decision": "approve", "categories": ["license"], "summary": "fine"}'}
_DOUBT = {"text": '{"decision": "review", "categories": ["law"], "summary": "needs a person"}'}
_BAD = {"text": "This text looks fine to me."}
_TAIL = ["output", "notify", "done"]

#: Example cases (``fsm test machines/moderation.py``): every edge — the re-ask, the
#: constrained decoding and the keyword rule, the budget edge, both fallbacks, and the
#: human review (approved, and rejected by its SLA timer); backoffs, the 120 s timeout
#: and the day-long SLA pass on the virtual clock.
CASES = [
    {"name": "approved by the model", "input": {"path": _DOC}, "replies": [_GOOD],
     "path": ["init", "collect", "preprocess", "infer", "validate", *_TAIL],
     "output": {"verdict_source": "model"}},
    {"name": "unreadable file", "input": {"path": _MISSING},
     "path": ["init", "collect", "failed"], "status": "failed"},
    {"name": "re-asked, then the keyword rule", "input": {"path": _DOC}, "replies": [_BAD],
     "path": ["init", "collect", "preprocess", "infer", "validate", "infer", "validate",
              "degraded-infer", *_TAIL], "output": {"verdict_source": "rules"}},
    {"name": "a doubtful verdict approved by a person", "input": {"path": _DOC, "review": True},
     "replies": [_DOUBT], "decisions": [{"choice": "approve", "by": "ann"}],
     "path": ["init", "collect", "preprocess", "infer", "validate", "human-review",
              "human-approved", *_TAIL], "output": {"verdict_source": "human"}},
    {"name": "model down, the rule's verdict rejected by the SLA",
     "input": {"path": _DOC, "review": True}, "replies": [{"error": "unavailable"}],
     "decisions": ["timeout"],
     "path": ["init", "collect", "preprocess", "infer", "degraded-infer", "human-review",
              "human-rejected", *_TAIL]},
    {"name": "constrained decoding too slow: the rule", "input": {"path": _DOC},
     "replies": [_BAD, _BAD, {**_GOOD, "delay_s": 121}],
     "path": ["init", "collect", "preprocess", "infer", "validate", "infer", "validate",
              "degraded-infer", "rule-verdict", *_TAIL]},
    {"name": "the rule's verdict goes to a person", "input": {"path": _DOC, "review": True},
     "replies": [_BAD, _BAD, {**_GOOD, "delay_s": 121}],
     "decisions": [{"choice": "approve", "by": "ann"}],
     "path": ["init", "collect", "preprocess", "infer", "validate", "infer", "validate",
              "degraded-infer", "rule-verdict", "human-review", "human-approved", *_TAIL]},
    {"name": "no budget for the prompt", "input": {"path": _DOC}, "token_budget": 50,
     "path": ["init", "collect", "preprocess", "infer", "degraded-infer", *_TAIL],
     "output": {"verdict_source": "rules"}},
]
