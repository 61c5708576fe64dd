"""The review queue: review states, decisions and their refusals, the durable SLA timer,
loop caps routed to review, and ``fsm review``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsm_engine import DefinitionError, Engine, Machine, State, Transition
from fsm_engine.definition.review import Review
from fsm_engine.errors import ReviewRefused

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
sys.path.insert(0, str(HELPERS))
import review_machine  # noqa: E402

MODULE = str(HELPERS / "review_machine.py")
#: The machines call no model; the worker still wants a provider.
SCRIPT = str(HELPERS / "review_script.jsonl")


def _to_review(engine: Engine, text: str = "hello") -> str:
    iid = engine.start(review_machine.machine, {"text": text})
    rec = asyncio.run(engine.run(iid))
    assert (rec.state, rec.status, rec.owner) == ("human-review", "waiting", None)
    return iid


def test_decide_records_who_what_and_the_edit_then_the_instance_continues(engine_factory) -> None:
    engine = engine_factory()
    iid = _to_review(engine)
    [item] = engine.reviews()
    assert (item.instance_id, item.state, item.visit, item.status) == (iid, "human-review", 1, "open")
    assert item.show == {"text": "hello", "label": "unsure", "score": 5}
    assert item.choices == ["approve", "reject"] and item.editable == ["label"]
    assert engine.claim_review(item.id[:6], "ann").claimed_by == "ann"
    rec = engine.decide(item, "approve", by="ann", update={"label": "ok"}, note="fine")
    assert (rec.state, rec.status, rec.context["label"]) == ("publish", "running", "ok")
    row = engine.store.history(iid)[-1]
    assert (row.kind, row.trigger, row.source, row.dest, row.delta) == \
        ("review", "approve", "human-review", "publish", {"label": "ok"})
    assert row.detail["review"] == {"item": item.id, "by": "ann", "note": "fine",
                                    "edit": {"label": "ok"}}
    done = asyncio.run(engine.run(iid))
    assert (done.status, done.context["published"]) == ("completed", ["ok"])
    decided = engine.review(item.id)
    assert (decided.status, decided.decided_by, decided.choice) == ("decided", "ann", "approve")
    assert engine.reviews() == []


def _unchanged(engine: Engine, iid: str, before: int) -> None:
    assert len(engine.store.history(iid)) == before
    assert engine.store.get(iid).state in ("human-review",)


def test_refusals_write_nothing(tmp_path) -> None:
    engine = Engine(str(tmp_path / "fsm.db"))
    iid = _to_review(engine)
    [item] = engine.reviews()
    n = len(engine.store.history(iid))
    cases = [
        (dict(choice="maybe"), "not offered"),
        (dict(choice="approve", update={"label": "perhaps"}), "edit rejected by Edit"),
        (dict(choice="approve", update={"score": 1}), "not editable"),
    ]
    for kwargs, why in cases:
        with pytest.raises(ReviewRefused, match=why):
            engine.decide(item, by="ann", **kwargs)  # type: ignore[arg-type]
        _unchanged(engine, iid, n)
    engine.claim_review(item, "ann")
    with pytest.raises(ReviewRefused, match="claimed by ann"):
        engine.decide(item, "approve", by="bob")
    with pytest.raises(ReviewRefused, match="claimed by ann"):
        engine.claim_review(item, "bob")
    _unchanged(engine, iid, n)
    assert engine.review(item).status == "open"
    engine.decide(item, "reject", by="ann")
    with pytest.raises(ReviewRefused, match="already decided: reject by ann"):
        engine.decide(item, "approve", by="ann")
    assert engine.store.get(iid).state == "rejected"
    engine.close()


def test_a_stale_answer_is_refused(tmp_path) -> None:
    engine = Engine(str(tmp_path / "fsm.db"))
    iid = _to_review(engine)
    [item] = engine.reviews()
    assert asyncio.run(engine.client.send(iid, "reject", operator="ops")).state == "rejected"
    n = len(engine.store.history(iid))
    with pytest.raises(ReviewRefused, match="closed undecided by ops: instance sent 'reject'"):
        engine.decide(item, "approve", by="ann")
    assert len(engine.store.history(iid)) == n
    engine.close()


def test_cancel_and_send_close_the_open_item_in_their_own_write(tmp_path) -> None:
    """Issue 36 (friction): ``fsm cancel`` and ``fsm send`` left the instance's review item
    ``open`` for good (listed, claimable, never decidable); each now closes it undecided,
    saying why, in the same write."""
    engine = Engine(str(tmp_path / "fsm.db"))
    cancelled, sent = _to_review(engine), _to_review(engine, "other")
    engine.cancel(cancelled, operator="ops", reason="duplicate")
    asyncio.run(engine.client.send(sent, "approve", operator="bob"))  # as `fsm send` does
    assert engine.reviews() == []  # none left open
    by_instance = {r.instance_id: r for r in engine.reviews(status=None)}
    one, two = by_instance[cancelled], by_instance[sent]
    assert (one.status, one.decided_by, one.choice, one.note) == (
        "closed", "ops", None, "instance cancelled: duplicate")
    assert (two.status, two.decided_by, two.note) == ("closed", "bob", "instance sent 'approve'")
    engine.close()


def test_deciding_a_paused_instance_says_it_is_paused(tmp_path) -> None:
    """Issue 36 (friction): an item of a paused instance is refused as paused (unpause it
    first), not as "stale ... moved on"; once unpaused it is decided as usual."""
    engine = Engine(str(tmp_path / "fsm.db"))
    iid = _to_review(engine)
    [item] = engine.reviews()
    engine.pause(iid, by="ops", reason="audit")
    for act in (lambda: engine.decide(item, "approve", by="ann"),
                lambda: engine.claim_review(item, "ann")):
        with pytest.raises(ReviewRefused, match=f"instance {iid} is paused \\(audit\\): "
                                                "unpause it first") as refused:
            act()
        assert "stale" not in str(refused.value)
    engine.unpause(iid, by="ops")
    assert engine.decide(item, "approve", by="ann").state == "publish"
    engine.close()


def test_loop_cap_routes_to_review_and_the_decision_grants_more(tmp_path) -> None:
    engine = Engine(str(tmp_path / "fsm.db"))
    iid = engine.start(review_machine.spinner, {})
    rec = asyncio.run(engine.run(iid))
    assert (rec.state, rec.status, rec.reason, rec.loop_count) == ("stuck", "waiting", "loop_limit", 5)
    assert engine.store.history(iid)[-1].kind == "loop_limit"
    [item] = engine.reviews()
    assert item.show == {"n": 5}
    engine.decide(item, "go_on", by="ann")
    done = asyncio.run(engine.run(iid))
    assert (done.status, done.state, done.context["n"]) == ("completed", "done", 8)
    seqs = [h.seq for h in engine.store.history(iid)]
    assert seqs == list(range(1, len(seqs) + 1))
    engine.close()


def test_review_definitions_are_checked() -> None:
    from pydantic import BaseModel

    class C(BaseModel):
        a: str = ""
    bad = Machine(name="bad", context=C, initial="r", on_loop_limit="x", states=[
        State("r", review=Review(prompt="?", show=["zz"], choices=["yes", "no"], sla_s=5,
                                 on_timeout="later")),
        State("d", final=True)], transitions=[Transition("yes", "r", "d")])
    with pytest.raises(DefinitionError) as err:
        Engine(":memory:").register(bad)
    text = str(err.value)
    for part in ("choice 'no' is not a trigger", "show field 'zz'",
                 "on_timeout 'later' is not one of its choices", "on_loop_limit 'x'"):
        assert part in text


def _fsm(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fsm_engine.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=check)


def _poll(pred, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_sla_timer_survives_sigkill_and_fires_once(tmp_path) -> None:
    db = str(tmp_path / "fsm.db")
    env = {**os.environ, "REVIEW_SLA_S": "2", "FSM_DB": db}
    (tmp_path / "in.json").write_text(json.dumps({"text": "x"}))
    iid = _fsm("start", MODULE, "--input", str(tmp_path / "in.json"), env=env).stdout.strip()
    os.environ["REVIEW_SLA_S"] = "2"
    worker = subprocess.Popen([sys.executable, "-m", "fsm_engine.cli", "worker", "--lease", "1",
                               "--llm", "scripted:" + SCRIPT],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from fsm_engine.store import open_store
        store = open_store(db)
        _poll(lambda: store.get(iid).status == "waiting")
        worker.send_signal(signal.SIGKILL)  # killed while the timer runs
        worker.wait(10)
        assert store.get(iid).state == "human-review"
        worker = subprocess.Popen([sys.executable, "-m", "fsm_engine.cli", "worker", "--lease",
                                   "1", "--llm", "scripted:" + SCRIPT], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        rec = _poll(lambda: (r := store.get(iid)).final and r)
        assert (rec.state, rec.status) == ("rejected", "completed")
        _fsm("resume", "--llm", "scripted:" + SCRIPT, env=env, check=False)  # nothing left to fire
        rows = [h for h in store.history(iid) if h.kind == "review"]
        assert len(rows) == 1 and rows[0].detail["review"]["by"] == "sla-timer"
        [item] = store.reviews()
        assert (item.status, item.choice, item.decided_by) == ("decided", "reject", "sla-timer")
        store.close()
    finally:
        worker.kill()
        worker.wait(10)
        os.environ.pop("REVIEW_SLA_S", None)


def test_cli_review_list_show_claim_decide(tmp_path) -> None:
    db = str(tmp_path / "fsm.db")
    env = {**os.environ, "FSM_DB": db}
    (tmp_path / "in.json").write_text(json.dumps({"text": "héllo"}))
    run = _fsm("run", MODULE, "--input", str(tmp_path / "in.json"), "--llm", "scripted:" + SCRIPT,
               env=env, check=False)
    assert run.returncode == 3, run.stderr
    [item] = json.loads(_fsm("review", "list", "--json", env=env).stdout)
    assert item["show"]["text"] == "héllo"
    assert item["id"] in _fsm("review", "list", env=env).stdout
    assert "Is this label right?" in _fsm("review", "show", item["id"][:5], env=env).stdout
    _fsm("review", "claim", item["id"], "--as", "ann", env=env)
    refused = _fsm("review", "decide", item["id"], "approve", "--as", "bob", env=env, check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("fsm: error: review") and "claimed by ann" in refused.stderr
    bad = _fsm("review", "decide", item["id"], "approve", "--as", "ann", "--set", "label=meh",
               env=env, check=False)
    assert bad.returncode == 2 and "edit rejected" in bad.stderr
    ok = _fsm("review", "decide", item["id"], "approve", "--as", "ann", "--set", "label=ok",
              "--note", "checked", env=env)
    assert "instance" in ok.stdout and "publish" in ok.stdout
    again = _fsm("review", "decide", item["id"], "reject", "--as", "ann", env=env, check=False)
    assert again.returncode == 2 and "already decided" in again.stderr


MODERATION = str(Path(__file__).resolve().parents[3] / "machines" / "moderation.py")


def _moderate(tmp_path, monkeypatch, lines: list[dict], review: bool) -> tuple[Engine, str]:
    from fsm_engine.llm.scripted import Scripted
    script = tmp_path / "replies.jsonl"
    script.write_text("".join(json.dumps(line) + "\n" for line in lines))
    text = tmp_path / "post.txt"
    text.write_text("Selling a weapon cheap.")
    monkeypatch.setenv("FSM_NOTIFY_FILE", str(tmp_path / "notify.jsonl"))
    monkeypatch.delenv("FSM_NOTIFY_URL", raising=False)
    if review:
        monkeypatch.setenv("FSM_REVIEW", "1")
    else:
        monkeypatch.delenv("FSM_REVIEW", raising=False)
    engine = Engine(str(tmp_path / "fsm.db"), llm=Scripted(script))
    iid = engine.start(MODERATION, {"path": str(text)})
    asyncio.run(engine.run(iid))
    return engine, iid


REVIEW_VERDICT = {"text": json.dumps({"decision": "review", "categories": ["weapons"],
                                      "summary": "sale of a weapon"})}


def test_moderation_sends_review_verdicts_to_a_person_when_asked(tmp_path, monkeypatch) -> None:
    engine, iid = _moderate(tmp_path, monkeypatch, [REVIEW_VERDICT], review=True)
    rec = engine.store.get(iid)
    assert (rec.state, rec.status) == ("human-review", "waiting")
    [item] = engine.reviews(machine="moderation")
    assert item.show["verdict"]["decision"] == "review" and item.show["verdict_source"] == "model"
    engine.decide(item, "reject", by="mod", note="no weapon sales")
    done = asyncio.run(engine.run(iid))
    assert (done.status, done.context["verdict"]["decision"], done.context["verdict_source"]) == \
        ("completed", "reject", "human")
    engine.close()


def test_moderation_stays_automatic_by_default(tmp_path, monkeypatch) -> None:
    engine, iid = _moderate(tmp_path, monkeypatch, [REVIEW_VERDICT], review=False)
    rec = engine.store.get(iid)
    assert (rec.status, rec.context["verdict"]["decision"]) == ("completed", "review")
    assert engine.reviews() == []
    engine.close()


def test_moderation_reviews_rule_verdicts_after_model_and_constrained_fail(tmp_path,
                                                                          monkeypatch) -> None:
    junk = {"text": "no json here at all"}
    engine, iid = _moderate(tmp_path, monkeypatch, [junk], review=True)
    rec = engine.store.get(iid)
    assert (rec.state, rec.context["verdict_source"]) == ("human-review", "rules")
    [item] = engine.reviews()
    assert item.show["verdict"]["summary"].startswith("rule-based")  # the rule's proposal
    engine.close()
