"""Contract cases for the stream log (format 12; mixed into ``StoreContract``): appends at
consecutive positions, reads from any position, attempts superseded, pruning after commit,
a step's commit carrying its stream tail (``StepCommit.stream``)."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from ..store import StepCommit, Store
from ..store.streams import FENCED, StreamOp, StreamRow
from .contract_fixtures import hist, moved, record


def _chunk(iid: str, seq: int, attempt: int, text: str, offset: int) -> StreamRow:
    return StreamRow(iid, seq, attempt, "chunk", text, offset, at=1000.0)


def _open(store: Store, iid: str, seq: int, since: int, info: dict[str, Any] | None = None,
          *rows: StreamRow) -> int:
    [attempt] = store.stream_write([StreamOp(iid, rows, True, seq, since, info or {}, 1.0)])
    return attempt


def _append(store: Store, iid: str, *rows: StreamRow) -> int:
    [pos] = store.stream_write([StreamOp(iid, rows)])
    return pos


class StreamContract:
    """``stream_write`` opens attempts (numbered per step, superseding the earlier ones of
    its range) and appends at dense positions per instance, ops of many instances in one
    call; ``stream_read`` pages from any position; ``stream_prune`` removes only committed
    steps' old rows; ``delete`` takes an instance's rows with it; a ``StepCommit`` writes its
    ``stream`` ops in its own transaction exactly when it applies."""

    def test_attempts_and_chunks_are_addressed_and_read_from_any_position(
            self, store: Store) -> None:
        assert store.stream_read("a") == [] and store.stream_write([]) == []
        assert _open(store, "a", 1, 1, {"json": True}) == 1
        assert _append(store, "a", _chunk("a", 1, 1, "héllo ", 0), _chunk("a", 1, 1, "审核", 6)) == 1
        assert _append(store, "b", _chunk("b", 1, 1, "other", 0)) == 0  # positions of its own
        assert _append(store, "a") == 3
        log = store.stream_read("a")
        assert [(r.pos, r.kind, r.text, r.offset) for r in log] == [
            (0, "open", "", 0), (1, "chunk", "héllo ", 0), (2, "chunk", "审核", 6)]
        assert log[0].info == {"json": True} and log[1].at == 1000.0
        assert store.stream_read("a", 2) == log[2:]
        assert store.stream_read("a", 1, limit=1) == log[1:2]
        assert store.stream_read("a", 3) == []

    def test_an_op_naming_an_owner_writes_only_while_that_owner_holds_the_instance(
            self, store: Store) -> None:
        store.create(record("held", status="running", owner="w1"))
        mine = StreamOp("held", (_chunk("held", 1, 0, "mine", 0),), True, 1, 1, {}, 1.0, "w1")
        theirs = StreamOp("held", (_chunk("held", 1, 0, "late", 0),), True, 1, 1, {}, 1.0, "w0")
        ghost = StreamOp("ghost", (_chunk("ghost", 1, 0, "x", 0),), True, 1, 1, {}, 1.0, "w1")
        assert store.stream_write([theirs, mine, ghost]) == [FENCED, 1, FENCED]
        assert [(r.kind, r.text) for r in store.stream_read("held")] == [
            ("open", ""), ("chunk", "mine")]  # a lost owner's rows, and an unknown id's: none
        assert store.stream_read("ghost") == []
        rec = store.get("held")
        assert store.commit([StepCommit(replace(rec, owner="w2"), rec.version)]) == [True]
        assert store.stream_write([StreamOp("held", (_chunk("held", 1, 1, "more", 4),),
                                            owner="w1")]) == [FENCED]
        assert len(store.stream_read("held")) == 2

    def test_one_write_opens_and_appends_for_many_instances(self, store: Store) -> None:
        out = store.stream_write([
            StreamOp("c", (_chunk("c", 4, 0, "first", 0),), True, 4, 4, {}, 5.0),
            StreamOp("d", (_chunk("d", 1, 0, "x", 0),), True, 1, 1, {}, 5.0),
            StreamOp("c", (_chunk("c", 4, 1, "second", 5),))])
        assert out == [1, 1, 2]  # attempts opened, then the position of c's next row
        assert [(r.kind, r.attempt, r.text) for r in store.stream_read("c")] == [
            ("open", 1, ""), ("chunk", 1, "first"), ("chunk", 1, "second")]
        assert [r.kind for r in store.stream_read("d")] == ["open", "chunk"]

    def test_a_new_attempt_supersedes_the_open_ones_of_its_range(self, store: Store) -> None:
        assert _open(store, "a", 1, 1) == 1
        assert _open(store, "a", 1, 1) == 2  # a retry of step 1
        assert _open(store, "a", 3, 2) == 1  # after a crash: steps 2..3
        kinds = [(r.kind, r.seq, r.attempt, r.info) for r in store.stream_read("a")]
        assert kinds == [("open", 1, 1, {}),
                         ("superseded", 1, 1, {"by": [1, 2]}), ("open", 1, 2, {}),
                         ("open", 3, 1, {})]  # step 1's attempt 2 lies outside 2..3
        _open(store, "a", 3, 1)
        late = [(r.kind, r.seq, r.attempt, r.info) for r in store.stream_read("a", 4)]
        assert late == [("superseded", 1, 2, {"by": [3, 2]}), ("superseded", 3, 1, {"by": [3, 2]}),
                        ("open", 3, 2, {})]  # each superseded once: 1/1 was already

    def test_a_new_attempt_supersedes_those_of_steps_a_takeover_cut_short(
            self, store: Store) -> None:
        """An attempt of a step that never committed (a ``recovery`` history row took its
        seq) is superseded by the next attempt whatever its ``since``: the takeover may not
        have counted as mid-step (an instance still ``pending`` in its first step, or taken
        while its owner seemed asleep in a backoff).  Attempts of committed steps stay."""
        store.create(record("r"))
        assert _open(store, "r", 1, 1) == 1  # step 1 streams, then commits
        rec = store.get("r")
        assert store.commit([StepCommit(moved(rec, "b"), rec.version,
                                        history=[hist("r", 1, "start", "b")])]) == [True]
        assert _open(store, "r", 2, 2) == 1  # step 2 streams; its process dies
        rec = store.get("r")
        taken = replace(hist("r", 2, "b", "b"), kind="recovery", trigger="recovery")
        assert store.commit([StepCommit(replace(rec, seq=2), rec.version,
                                        history=[taken])]) == [True]
        assert _open(store, "r", 3, 3) == 1  # the rerun, as step 3
        late = [(r.kind, r.seq, r.attempt, r.info) for r in store.stream_read("r", 2)]
        assert late == [("superseded", 2, 1, {"by": [3, 1]}), ("open", 3, 1, {})]

    def test_concurrent_writers_never_collide_on_a_position(self, store: Store) -> None:
        def write(n: int) -> None:
            for i in range(10):
                _append(store, "a", _chunk("a", 1, n, f"{n}:{i}", i))
        threads = [threading.Thread(target=write, args=(n,)) for n in (1, 2, 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        log = store.stream_read("a")
        assert [r.pos for r in log] == list(range(30))
        for n in (1, 2, 3):  # each writer's rows in its own order
            assert [r.text for r in log if r.attempt == n] == [f"{n}:{i}" for i in range(10)]

    def test_prune_takes_old_rows_of_committed_steps_only(self, store: Store) -> None:
        store.create(record("a"))
        _append(store, "a", _chunk("a", 1, 1, "done", 0), _chunk("a", 2, 1, "live", 0))
        _append(store, "gone", _chunk("gone", 1, 1, "orphan", 0))
        assert store.stream_prune(500.0) == 0  # nothing that old
        assert store.stream_prune(2000.0) == 1  # only the orphan: step 1 of a has not committed
        rec = store.get("a")
        assert store.commit([StepCommit(moved(rec, "b"), rec.version,
                                        history=[hist("a", 1, "start", "b")])]) == [True]
        assert store.stream_prune(2000.0) == 1
        assert [r.text for r in store.stream_read("a")] == ["live"]
        assert store.delete(["a"]) == 1 and store.stream_read("a") == []

    def test_a_step_commit_writes_its_stream_tail_only_when_it_applies(
            self, store: Store) -> None:
        store.create(record("a"), record("b"))
        _open(store, "a", 1, 1, {}, _chunk("a", 1, 0, "early ", 0))  # a batch wrote this
        a, b = store.get("a"), store.get("b")
        end = StreamRow("a", 1, 1, "end", info={"finish": "stop", "chars": 10}, at=1000.0)
        tail_a = StreamOp("a", (_chunk("a", 1, 1, "late", 6), end))
        second = StreamOp("a", (_chunk("a", 1, 0, "again", 0),), True, 1, 1, {"json": True}, 2.0)
        tail_b = StreamOp("b", (_chunk("b", 1, 0, "whole", 0),
                                StreamRow("b", 1, 0, "end", info={"chars": 5}, at=1000.0)),
                          True, 1, 1, {}, 2.0)
        stale = StepCommit(moved(b, "c"), b.version + 7, history=[hist("b", 1, "start", "c")],
                           stream=[StreamOp("b", (_chunk("b", 1, 0, "never", 0),), True, 1, 1)])
        assert store.commit([
            StepCommit(moved(a, "b"), a.version, history=[hist("a", 1, "start", "b")],
                       stream=[tail_a, second]),
            stale,
            StepCommit(moved(b, "b"), b.version, history=[hist("b", 1, "start", "b")],
                       stream=[tail_b])]) == [True, False, True]
        assert [(r.pos, r.attempt, r.kind, r.text, r.offset) for r in store.stream_read("a")] == [
            (0, 1, "open", "", 0), (1, 1, "chunk", "early ", 0), (2, 1, "chunk", "late", 6),
            (3, 1, "end", "", 0), (4, 1, "superseded", "", 0), (5, 2, "open", "", 0),
            (6, 2, "chunk", "again", 0)]
        log_b = store.stream_read("b")
        assert [(r.attempt, r.kind, r.text) for r in log_b] == [
            (1, "open", ""), (1, "chunk", "whole"), (1, "end", "")]
        assert log_b[2].info == {"chars": 5} and store.get("b").seq == 1
