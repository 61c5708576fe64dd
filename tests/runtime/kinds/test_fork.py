"""Fork: copied history prefix, lineage, side effects never repeated, bulk dry run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fsm_engine import Engine, InvalidInput

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
sys.path.insert(0, str(HELPERS))
import review_machine  # noqa: E402

MODULE = str(HELPERS / "review_machine.py")


def _completed(engine: Engine) -> str:
    iid = engine.start(review_machine.machine, {"text": "hello"})
    asyncio.run(engine.run(iid))
    engine.decide(engine.reviews(instance_id=iid)[0], "approve", by="ann", update={"label": "ok"})
    assert asyncio.run(engine.run(iid)).status == "completed"
    return iid


def test_fork_copies_the_prefix_and_never_repeats_a_delivered_side_effect(
        engine_factory, backend, tmp_path, monkeypatch) -> None:
    sink = tmp_path / "sink.txt"
    monkeypatch.setenv("REVIEW_SINK", str(sink))
    engine = engine_factory()
    iid = _completed(engine)
    original = engine.store.history(iid)
    new = engine.fork(iid, from_seq=1)
    rec = engine.store.get(new)
    assert (rec.forked_from, rec.forked_at_seq, rec.state, rec.seq) == (iid, 1, "human-review", 1)
    assert [replace(h, instance_id=iid) for h in engine.store.history(new)] == original[:1]
    assert rec.context == {**engine.store.get(iid).input, "label": "unsure", "score": 5,
                           "published": []}
    assert asyncio.run(engine.run(new)).status == "waiting"  # its own review item
    engine.decide(engine.reviews(instance_id=new)[0], "approve", by="ann", update={"label": "ok"})
    done = asyncio.run(engine.run(new))
    assert (done.status, done.context["published"]) == ("completed", ["ok"])
    assert sink.read_text().splitlines() == [f"{iid}:publish:1"]  # delivered once, by the original
    row = [h for h in engine.store.history(new) if h.source == "publish"][0]
    assert row.detail["delivered_by_original"] == f"{iid}:publish:1"
    assert [r.id for r in engine.forks(iid)] == [new]
    seqs = [h.seq for h in engine.store.history(new)]
    assert seqs == list(range(1, len(seqs) + 1)) and engine.store.check() == []


def test_fork_points(tmp_path) -> None:
    engine = Engine(str(tmp_path / "fsm.db"))
    iid = _completed(engine)
    rec = engine.store.get(engine.fork(iid, from_state="publish"))
    assert (rec.state, rec.forked_at_seq) == ("publish", 2)
    rec = engine.store.get(engine.fork(iid, from_seq=0))
    assert (rec.state, rec.status, rec.seq) == ("classify", "pending", 0)
    with pytest.raises(InvalidInput, match="final state"):
        engine.fork(iid, from_seq=3)
    with pytest.raises(InvalidInput, match="outside"):
        engine.fork(iid, from_seq=99)
    with pytest.raises(InvalidInput, match="no failure"):
        engine.fork(iid, from_failure=True)
    engine.close()


def _fsm(*args: str, db: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fsm_engine.cli", *args, "--db", db],
                          capture_output=True, text=True, timeout=60, check=check)


def test_cli_fork_lineage_and_bulk_dry_run(tmp_path) -> None:
    db = str(tmp_path / "fsm.db")
    engine = Engine(db)
    iid = _completed(engine)
    failed = engine.start(review_machine.spinner, {})
    engine.cancel(failed)
    engine.close()
    out = _fsm("fork", iid[:6], "--from-seq", "1", db=db).stdout
    new = out.split(":")[0]
    assert f"forked from {iid} at seq 1" in out
    shown = json.loads(_fsm("show", new, "--json", db=db).stdout)
    assert (shown["forked_from"], shown["forked_at_seq"]) == (iid, 1)
    listed = json.loads(_fsm("list", "--forks-of", iid, "--json", db=db).stdout)
    assert [r["id"] for r in listed] == [new]
    before = json.loads(_fsm("list", "--json", db=db).stdout)
    dry = _fsm("fork", "--status", "failed", db=db).stdout
    assert "0 instance(s) match; --yes forks them" in dry
    assert json.loads(_fsm("list", "--json", db=db).stdout) == before
    bad = _fsm("fork", iid, "--from-seq", "3", db=db, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("fsm: error:") and "final" in bad.stderr


def test_rerun_in_place_appends_and_keeps_seq_gap_free(tmp_path, monkeypatch) -> None:
    sink = tmp_path / "sink.txt"
    monkeypatch.setenv("REVIEW_SINK", str(sink))
    engine = Engine(str(tmp_path / "fsm.db"))
    iid = _completed(engine)
    before = engine.store.history(iid)
    assert engine.rerun(iid, "human-review", in_place=True, by="ann") == iid
    after = engine.store.history(iid)
    assert after[:len(before)] == before  # appended, never rewritten
    reset = after[len(before)]
    assert (reset.kind, reset.source, reset.dest, reset.detail) == \
        ("rerun", "done", "human-review", {"reset_to_seq": 1, "operator": "ann"})
    assert reset.delta == {"label": "unsure", "published": []}
    rec = engine.store.get(iid)
    assert (rec.state, rec.status, rec.context["label"]) == ("human-review", "waiting", "unsure")
    [item] = engine.reviews(instance_id=iid)
    assert item.visit == 2
    engine.decide(item, "approve", by="ann", update={"label": "bad"})
    done = asyncio.run(engine.run(iid))
    assert (done.status, done.context["published"]) == ("completed", ["bad"])
    assert sink.read_text().splitlines() == [f"{iid}:publish:1", f"{iid}:publish:2"]
    seqs = [h.seq for h in engine.store.history(iid)]
    assert seqs == list(range(1, len(seqs) + 1)) and engine.store.check() == []
    with pytest.raises(InvalidInput, match="never entered"):
        engine.rerun(iid, "nowhere", in_place=True)
    fork = engine.rerun(iid, "publish", by="bo")
    assert engine.store.get(fork).state == "publish"
    assert engine.store.get(fork).fork_options == {"by": "bo"}
    engine.close()


def test_from_state_of_an_agent_state_restarts_its_visit_from_seq_keeps_a_journal_row(
        engine_factory, tmp_path, monkeypatch) -> None:
    """Issue 36: an agent's journal rows (kind ``tool``) do not enter its state, so
    ``--from-state research`` / ``rerun --state research`` fork before the visit's first
    turn; ``--from-seq`` at a journal row still resumes there."""
    import agent_machine
    from agent_replies import KEYED

    from fsm_engine.llm import Scripted
    from fsm_engine.store.records import TOOL
    monkeypatch.setenv("AGENT_TOOL_LOG", str(tmp_path / "tools.jsonl"))
    engine = engine_factory(llm=Scripted.from_replies(KEYED))
    iid = engine.start(agent_machine.machine, {"question": "what is 2 + 3?"})
    assert asyncio.run(engine.run(iid)).status == "completed"
    journal = [h.seq for h in engine.store.history(iid) if h.kind == TOOL]
    assert journal == [1, 2, 3, 4, 5, 6]
    for fid in (engine.fork(iid, from_state="research"), engine.rerun(iid, "research")):
        rec = engine.store.get(fid)
        assert (rec.forked_at_seq, rec.state, rec.seq) == (0, "research", 0)
        done = asyncio.run(engine.run(fid))
        assert (done.status, done.state, done.context["answer"]) == ("completed", "answered", "5")
        turns = [h for h in engine.store.history(fid) if h.kind == TOOL]
        assert [h.detail["turn"] for h in turns if h.detail["agent"] == "turn"] == [1, 2]
    mid = engine.store.get(engine.fork(iid, from_seq=3))  # after turn 1's two calls
    assert (mid.forked_at_seq, mid.state, mid.seq) == (3, "research", 3)
    done = asyncio.run(engine.run(mid.id))
    assert (done.status, done.context["answer"]) == ("completed", "5")
    rows = engine.store.history(mid.id)
    assert [h.detail.get("turn") for h in rows if h.detail.get("agent") == "turn"] == [1, 2]
