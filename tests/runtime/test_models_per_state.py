"""Models chosen per state: names in the machine, providers at run time, a breaker per model."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import MACHINES, license_files, scripted
from pydantic import BaseModel

from fsm_engine import BreakerPolicy, Engine, FsmError, Machine, RetryPolicy, State, Step, Transition
from fsm_engine.errors import DefinitionError, InvalidInput
from fsm_engine.llm import Scripted
from fsm_engine.llm.select import providers_from_specs
from fsm_engine.runtime.model_registry import DEFAULT

VERDICT = '{"decision": "approve", "categories": [], "summary": "a license text"}'


class Ctx(BaseModel):
    answer: str = ""
    by: str = ""


async def ask(ctx: Ctx, step: Step) -> dict:
    out = await step.llm.complete([{"role": "user", "content": "hi"}], max_tokens=8)
    return {"answer": out.text, "by": out.model}


class Answer(BaseModel):
    word: str


async def ask_structured(ctx: Ctx, step: Step) -> dict:
    parsed = await step.llm.structured([{"role": "user", "content": "hi"}], Answer, max_tokens=8)
    return {"answer": parsed.value.word}


def two_model_machine(**infer) -> Machine:
    return Machine(
        name="two-models", context=Ctx, initial="infer", max_transitions=20,
        states=[State("infer", action=ask, llm="primary", fallback="degraded", **infer),
                State("degraded", action=ask, llm="fallback"),
                State("done", final=True), State("failed", final=True, failure=True)],
        transitions=[Transition("ok", "infer", "done"), Transition("ok", "degraded", "done")])


def test_each_state_calls_its_own_model(db_path):
    primary = Scripted.from_replies([{"text": "from primary", "prompt_tokens": 3}], model="big")
    fallback = Scripted.from_replies([{"text": "from fallback"}], model="small")
    eng = Engine(db_path, llm={"primary": primary, "fallback": fallback})
    iid = eng.start(two_model_machine(), {})
    rec = asyncio.run(eng.run(iid))
    assert (rec.state, rec.context["answer"], rec.context["by"]) == ("done", "from primary", "big")
    calls = eng.store.history(iid)[0].detail["llm_calls"]
    assert [c["model"] for c in calls] == ["scripted:big"]


def test_an_open_breaker_on_the_primary_sends_instances_to_the_fallback_model(db_path):
    primary = Scripted.from_replies([{"text": "", "error": "http500"}], model="big")
    fallback = Scripted.from_replies([{"text": "from fallback"}], model="small")
    eng = Engine(db_path, llm={"primary": primary, "fallback": fallback},
                 breaker=BreakerPolicy(min_calls=2, failure_rate=0.5, cooldown=60))
    machine = two_model_machine(retry=RetryPolicy(max_attempts=2, initial_interval=0.0, jitter=0.0))
    ids = eng.start_many(machine, [{}] * 6)
    records = asyncio.run(eng.run_many(ids))
    assert [r.context["by"] for r in records] == ["small"] * 6
    assert eng.store.get_breaker("scripted:big").state == "open"
    assert eng.store.get_breaker("scripted:small").state == "closed"  # its own breaker
    reasons = {h.reason for r in records for h in eng.store.history(r.id) if h.kind == "fallback"}
    assert "circuit_open" in reasons  # later instances never called the primary at all


def test_a_name_without_a_provider_uses_the_default(db_path):
    only = Scripted.from_replies([{"text": "one"}], model="only")
    eng = Engine(db_path, llm=only)
    rec = asyncio.run(eng.run(eng.start(two_model_machine(), {})))
    assert rec.context["by"] == "only"


def test_a_mapping_without_default_must_cover_every_name(db_path):
    eng = Engine(db_path, llm={"primary": scripted({"text": "x"})})
    with pytest.raises(FsmError, match="no provider for model name.* 'fallback'"):
        eng.start(two_model_machine(), {})
    assert eng.store.list() == []  # nothing created


def test_repair_model_answers_the_reask(db_path):
    main = Scripted.from_replies([{"text": "not json", "prompt_tokens": 5}], model="main")
    fixer = Scripted.from_replies([{"text": '{"word": "fixed"}', "prompt_tokens": 7}], model="fixer")
    machine = Machine(
        name="repairing", context=Ctx, initial="infer",
        states=[State("infer", action=ask_structured, llm="main", repair_llm="fixer"),
                State("done", final=True)],
        transitions=[Transition("ok", "infer", "done")])
    eng = Engine(db_path, llm={"main": main, "fixer": fixer})
    iid = eng.start(machine, {})
    rec = asyncio.run(eng.run(iid))
    assert rec.context["answer"] == "fixed" and rec.tokens_used == 12
    calls = eng.store.history(iid)[0].detail["llm_calls"]
    assert [c["model"] for c in calls] == ["scripted:main", "scripted:fixer"]


@pytest.mark.parametrize("bad", ["", "9lives", "with space", 3])
def test_a_model_name_must_be_a_name(bad):
    with pytest.raises(DefinitionError, match="llm must be a model name"):
        Engine(":memory:").register(Machine(
            name="bad", context=Ctx, initial="a",
            states=[State("a", action=ask, llm=bad), State("done", final=True)],
            transitions=[Transition("ok", "a", "done")]))


def test_specs_by_name(tmp_path, monkeypatch):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"text": "a"}\n')
    b.write_text('{"text": "b"}\n')
    env = {"FSM_LLM_FALLBACK": f"scripted:{b}", "FSM_LLM_CONCURRENCY": "1"}
    got = providers_from_specs([f"scripted:{a}", f"primary=scripted:{a}"], environ=env)
    assert set(got) == {DEFAULT, "primary", "fallback"}  # FSM_LLM_CONCURRENCY is no name
    assert got["primary"] is got[DEFAULT]  # equal specs share one provider (one model process)
    assert got["fallback"] is not got[DEFAULT]
    with pytest.raises(InvalidInput, match="twice"):
        providers_from_specs([f"x=scripted:{a}", f"x=scripted:{b}"], environ={})
    with pytest.raises(InvalidInput, match="not a model name"):
        providers_from_specs([f"9x=scripted:{a}"], environ={})


def test_cli_maps_names_to_providers(tmp_path, capsys, monkeypatch):
    from fsm_engine.cli import main
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(json.dumps({"text": VERDICT, "prompt_tokens": 5, "completion_tokens": 5}))
    bad.write_text('{"text": "", "error": "http500"}\n')  # retried, then the fallback model
    monkeypatch.setenv("FSM_NOTIFY_FILE", str(tmp_path / "n.jsonl"))
    monkeypatch.setattr("sys.argv", [
        "fsm", "run", str(MACHINES / "moderation.py"), "--input", *license_files(2),
        "--db", str(tmp_path / "m.db"), "--llm", f"primary=scripted:{bad}",
        "--llm", f"fallback=scripted:{good}", "--json", "-q"])
    with pytest.raises(SystemExit) as code:
        main()
    assert code.value.code == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["context"]["verdict_source"] for r in records] == ["constrained", "constrained"]


def test_fsm_run_prints_where_the_verdicts_came_from(tmp_path, capsys, monkeypatch):
    from fsm_engine.cli import main
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": VERDICT, "prompt_tokens": 5, "completion_tokens": 5}))
    monkeypatch.setenv("FSM_NOTIFY_FILE", str(tmp_path / "n.jsonl"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr("sys.argv", [
        "fsm", "run", str(MACHINES / "moderation.py"), "--input", *license_files(3),
        "--db", str(tmp_path / "m.db"), "--llm", f"scripted:{good}", "-q"])
    with pytest.raises(SystemExit) as code:
        main()
    assert code.value.code == 0
    assert "verdict_source: 3 model" in capsys.readouterr().out


def test_a_store_fault_in_the_breaker_never_fails_the_call(db_path, monkeypatch):
    """The database restarting under a step: the breaker's shared row cannot be read or
    written, and the model call goes ahead (only the step's own commit needs the store)."""
    from fsm_engine.errors import StoreError

    eng = Engine(db_path, llm=Scripted.from_replies([{"text": "fine"}], model="m"))
    iid = eng.start(two_model_machine(), {})

    def down(*args, **kwargs):
        raise StoreError("database postgresql://…: server closed the connection unexpectedly")
    monkeypatch.setattr(eng.store, "get_breaker", down)
    monkeypatch.setattr(eng.store, "put_breaker", down)
    rec = asyncio.run(eng.run(iid))
    assert (rec.status, rec.context["answer"]) == ("completed", "fine")
