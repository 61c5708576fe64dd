"""Token budgets checked before the call (issue 10, item 7): a prompt that does not fit
what is left is refused with 0 tokens spent and the budget transition taken; a reply
billed past the budget is recorded as ``budget_overrun``; a per-state budget per visit
(failed attempts included) is checked the same way and readable by guards."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import MACHINES, license_files, scripted
from pydantic import BaseModel
from typer.testing import CliRunner

from fsm_engine import BudgetExhausted, DefinitionError, Engine, Machine, RetryPolicy, State, Transition, fire
from fsm_engine.cli import app
from fsm_engine.llm import Scripted
from fsm_engine.llm.base import estimate_prompt_tokens, estimate_tokens
from fsm_engine.runtime.compiled import compile_machine

LONG = [{"role": "user", "content": "Summarise this text. " * 20}]  # ~140 tokens estimated


class Ctx(BaseModel):
    n: int = 0
    text: str = ""


async def ask(ctx: Ctx, step) -> Any:
    out = await step.llm.complete(LONG, max_tokens=64)
    return fire("again", n=ctx.n + 1, text=out.text)


ASKING = Machine(
    name="asking", context=Ctx, initial="ask",
    states=[State("ask", action=ask), State("broke", final=True),
            State("failed", final=True, failure=True)],
    transitions=[Transition("again", "ask", "ask"),
                 Transition("budget_exhausted", "ask", "broke")])

REPLY = {"text": "ok", "prompt_tokens": 150, "completion_tokens": 10}


def test_the_estimate_is_conservative_and_documented() -> None:
    assert estimate_tokens("") == 0 and estimate_tokens("abc") == 1 and estimate_tokens("abcd") == 2
    assert estimate_tokens("\u6f22\u5b57") == 2  # one token per CJK character (3 bytes)
    assert estimate_prompt_tokens(LONG) > len(LONG[0]["content"]) // 4  # above ~4 chars/token


def test_a_prompt_larger_than_the_budget_is_refused_spending_nothing(db_path: str) -> None:
    llm = scripted(REPLY)
    eng = Engine(db_path, llm=llm)
    rec = asyncio.run(eng.run(eng.start(ASKING, {}, token_budget=100)))
    assert (rec.state, rec.status, rec.tokens_used, llm.calls) == ("broke", "completed", 0, 0)
    (row,) = eng.store.history(rec.id)
    assert (row.trigger, row.kind, row.reason, row.tokens) == ("budget_exhausted", "fallback",
                                                               "token_budget", 0)
    assert "the prompt needs ~" in row.error and "100 of 100 left" in row.error
    eng.close()


def test_the_call_that_fits_runs_and_the_next_is_refused(db_path: str) -> None:
    llm = scripted(REPLY)
    eng = Engine(db_path, llm=llm)
    rec = asyncio.run(eng.run(eng.start(ASKING, {}, token_budget=400)))
    assert (rec.state, rec.tokens_used, llm.calls) == ("broke", 320, 2)
    rows = eng.store.history(rec.id)
    assert [r.trigger for r in rows] == ["again", "again", "budget_exhausted"]
    assert rows[-1].tokens == 0
    assert all(c["model"] == f"scripted:{llm.model}" for r in rows[:2] for c in r.detail["llm_calls"])
    eng.close()


def test_a_reply_billed_past_the_budget_is_recorded_as_an_overrun(db_path: str) -> None:
    llm = scripted({"text": "ok", "prompt_tokens": 900, "completion_tokens": 50})
    eng = Engine(db_path, llm=llm)
    rec = asyncio.run(eng.run(eng.start(ASKING, {}, token_budget=500)))
    first = eng.store.history(rec.id)[0]
    (call,) = first.detail["llm_calls"]
    assert call["budget_overrun"] is True and call["overrun_tokens"] == 450
    assert call["prompt_estimate"] == estimate_prompt_tokens(LONG)
    assert (rec.state, rec.tokens_used, llm.calls) == ("broke", 950, 1)  # kept, then refused
    eng.close()


class Counting(Scripted):
    """A scripted model with a tokenizer that says every prompt is 1,000 tokens."""

    def __init__(self, asynchronous: bool) -> None:
        self._init([Scripted.from_replies([REPLY]).replies[0]], "counting", "<test>")
        self.asynchronous = asynchronous

    def count_tokens(self, messages: list[dict[str, str]]) -> Any:
        if not self.asynchronous:
            return 1000

        async def count() -> int:
            return 1000
        return count()


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_providers_tokenizer_decides(db_path: str, asynchronous: bool) -> None:
    llm = Counting(asynchronous)
    eng = Engine(db_path, llm=llm)
    rec = asyncio.run(eng.run(eng.start(ASKING, {}, token_budget=999)))
    assert (rec.state, rec.tokens_used, llm.calls) == ("broke", 0, 0)
    assert "~1000 tokens" in eng.store.history(rec.id)[0].error
    eng.close()


def test_budget_1_on_the_reference_machine_spends_nothing(tmp_path: Path, db_path: str,
                                                          notify_file: Path) -> None:
    files = license_files(2)
    if len(files) < 2:
        pytest.skip("needs /usr/share/common-licenses")
    script = tmp_path / "replies.jsonl"
    script.write_text(json.dumps({"text": json.dumps({"decision": "approve", "categories": [],
                                                      "summary": "fine"}),
                                  "prompt_tokens": 300, "completion_tokens": 72}) + "\n")
    result = CliRunner().invoke(app, ["run", str(MACHINES / "moderation.py"), "--input", *files,
                                      "--db", db_path, "--budget", "1",
                                      "--llm", f"scripted:{script}", "--json", "-q"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert [r["tokens_used"] for r in records] == [0, 0]
    assert {r["context"]["verdict_source"] for r in records} == {"rules"}
    eng = Engine(db_path)
    for r in records:
        rows = eng.store.history(r["id"])
        budget = [h for h in rows if h.source == "infer"]
        assert [(h.trigger, h.tokens, h.reason) for h in budget] == [
            ("budget_exhausted", 0, "token_budget")]
        assert sum(h.tokens for h in rows) == 0
    eng.close()


# -- per-state budgets ------------------------------------------------------------------------

SEEN: list[Any] = []


async def ask_short(ctx: Ctx, step) -> Any:
    messages = [{"role": "user", "content": "go"}] if step.attempt == 1 else LONG
    out = await step.llm.complete(messages, max_tokens=20)
    return {"text": out.text}


def saw_room(ctx: Ctx, run: Any) -> bool:
    SEEN.append((run.state_tokens_used, run.state_token_budget, run.state_tokens_remaining))
    return True


STATED = Machine(
    name="stated", context=Ctx, initial="ask",
    states=[State("ask", action=ask_short, token_budget=100,
                  retry=RetryPolicy(max_attempts=3, initial_interval=0.001, jitter=0)),
            State("done", final=True), State("broke", final=True),
            State("failed", final=True, failure=True)],
    transitions=[Transition("ok", "ask", "done", conditions=saw_room),
                 Transition("budget_exhausted", "ask", "broke")])


def test_a_state_budget_counts_failed_attempts_of_the_visit(db_path: str) -> None:
    """Attempt 1 is billed 70 tokens and fails; attempt 2's prompt (~150) does not fit the
    30 left of the state's 100: refused, the budget transition taken."""
    llm = scripted({"error": "http500", "prompt_tokens": 40, "completion_tokens": 30}, REPLY)
    eng = Engine(db_path, llm=llm)
    rec = asyncio.run(eng.run(eng.start(STATED, {})))
    assert (rec.state, rec.tokens_used, llm.calls) == ("broke", 70, 1)
    row = eng.store.history(rec.id)[-1]
    assert row.trigger == "budget_exhausted" and "state token budget exhausted" in row.error
    eng.close()


def test_guards_read_the_state_budget(db_path: str) -> None:
    SEEN.clear()
    llm = scripted({"text": "ok", "prompt_tokens": 30, "completion_tokens": 12})
    eng = Engine(db_path, llm=llm)
    rec = asyncio.run(eng.run(eng.start(STATED, {}, token_budget=10_000)))
    assert (rec.state, rec.tokens_used) == ("done", 42)
    assert SEEN == [(42, 100, 58)]
    eng.close()


def test_a_state_budget_must_be_a_count() -> None:
    bad = Machine(name="bad_budget", context=Ctx, initial="ask",
                  states=[State("ask", action=ask_short, token_budget=-1),
                          State("done", final=True)],
                  transitions=[Transition("ok", "ask", "done")])
    with pytest.raises(DefinitionError, match="token_budget must be an int >= 0"):
        compile_machine(bad)


def test_budget_exhausted_carries_its_scope() -> None:
    exc = BudgetExhausted(10, 100, scope="state", needed=120)
    assert (exc.scope, exc.needed) == ("state", 120) and "state token budget" in str(exc)
