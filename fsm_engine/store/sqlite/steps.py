"""The SQLite store's instances facet: creating instances and the hot path, ``commit``."""

from __future__ import annotations

import builtins
import hashlib
import sqlite3
from collections.abc import Sequence
from typing import Any

from ...errors import InstanceNotFound
from .. import streams
from ..claims import key_taken
from ..codec import (
    CLOSE_OPEN_REVIEWS,
    CLOSE_REVIEW,
    INSERT_REVIEW,
    REVIEW,
    Blobs,
    Encoded,
    close_open_args,
    close_review_args,
)
from ..codec import (
    DELTA as _DELTA,
)
from ..codec import (
    HISTORY as _HISTORY,
)
from ..codec import (
    INSERT_HISTORY as _INSERT_HISTORY,
)
from ..codec import (
    SELECT_INSTANCES as _SELECT_INSTANCES,
)
from ..codec import (
    child_outputs as _child_outputs,
)
from ..codec import (
    dumps as _dumps,
)
from ..codec import (
    encode_step as _encode,
)
from ..codec import (
    instance_row as _instance_row,
)
from ..codec import (
    update_sql as _update_sql,
)
from ..debounce import FOLD, fold_args
from ..records import (
    CHILD_OUTPUT_COLUMNS,
    CHILD_STATE_COLUMNS,
    FINAL_STATUSES,
    ChildOutput,
    ChildState,
    HistoryRow,
    InstanceRecord,
    StepCommit,
)
from ..sqlite_batch import REFUSED, Rows, insert_history, rejected
from .connect import SqliteBase, _decode

#: The final statuses as an SQL list (``child_outputs``).
_FINAL = ", ".join(f"'{s}'" for s in sorted(FINAL_STATUSES))

_FOLD = FOLD.format(least="MIN")

#: ``StepCommit.wake``: a parent waiting for its children becomes claimable (a timer's
#: due time it held is cleared, so a worker claims it now; its step arms it again from
#: the entering history row: ``runtime.kinds.timers``).
_WAKE = ("UPDATE instances SET status='running', updated_at=?, version=version+1, "
         "next_attempt_at=NULL "
         "WHERE id=? AND status='waiting' AND reason='children'")


class SqliteSteps(SqliteBase):
    """Instances and their steps (``store.facets.InstanceStore``)."""

    # -- instances ----------------------------------------------------------
    def create(self, *records: InstanceRecord, history: Sequence[HistoryRow] = ()) -> None:
        with self._write() as conn:  # the write lock is held: nobody else can take a key
            keys = [r.key for r in records]
            try:
                self._insert(conn, records)
            except BaseException as exc:
                for rec, key in zip(records, keys, strict=False):  # nothing was stored: no key either
                    rec.key = key
                if isinstance(exc, sqlite3.IntegrityError) and "start_key" in str(exc):
                    raise key_taken(records) from None
                raise
            by_id = {r.id: r.key for r in records}
            for h in history:
                row = _HISTORY.values(h)
                row[0] = by_id[h.instance_id]
                conn.execute(_INSERT_HISTORY, row)

    def debounce(self, rec: InstanceRecord) -> str:
        with self._write() as conn:  # the write lock: no other start of the key between
            blobs: Blobs = []
            args = fold_args(rec, blobs)
            self._put_blobs(conn, blobs)
            row = conn.execute(_FOLD, args).fetchone()
            if row is not None:
                return str(row[0])
            self._insert(conn, [rec])
        return rec.id

    def by_start_key(self, machine: str, key: str) -> InstanceRecord | None:
        rows = self._read(_SELECT_INSTANCES + " WHERE machine=? AND start_key=?", (machine, key))
        return self._full([_decode(InstanceRecord, rows[0])])[0] if rows else None

    def by_debounce_key(self, machine: str, key: str) -> InstanceRecord | None:
        rows = self._read(_SELECT_INSTANCES + " WHERE machine=? AND debounce_key=? AND "
                          "status='scheduled'", (machine, key))
        return self._full([_decode(InstanceRecord, rows[0])])[0] if rows else None

    def get(self, instance_id: str) -> InstanceRecord:
        rows = self._read(_SELECT_INSTANCES + " WHERE id=?", (instance_id,))
        if not rows:
            raise InstanceNotFound(instance_id)
        return self._full([_decode(InstanceRecord, rows[0])])[0]
    def list(self, *, statuses: Sequence[str] | None = None,
             machine: str | None = None, owner: str | None = None) -> builtins.list[InstanceRecord]:
        sql, args = _SELECT_INSTANCES + " WHERE 1=1", []
        if owner:
            sql += " AND owner=?"
            args.append(owner)
        if statuses:
            sql += f" AND status IN ({','.join('?' * len(statuses))})"
            args.extend(statuses)
        if machine:
            sql += " AND machine=?"
            args.append(machine)
        return self._full([_decode(InstanceRecord, r)
                           for r in self._read(sql + " ORDER BY key", args)])

    def commit(self, steps: Sequence[StepCommit]) -> builtins.list[bool]:
        applied: builtins.list[bool] = []
        # history rows of the plain steps, inserted by one executemany at the end (~2 µs a
        # row less than one execute each); (step index, row) so a refusal names its step
        rows: Rows = []
        with self._write() as conn:
            for i, step in enumerate(steps):
                # encoded as it is written (a refusal rolls the whole batch back), so its
                # values are garbage at once rather than piling up for the collector
                enc = _encode(i, step)
                try:
                    if step.compound:
                        applied.append(self._compound(conn, step, enc))
                    else:  # a plain step straight to ``_apply_step`` (a call less a step)
                        ok = (self._apply_step(conn, step, enc, rows, i)
                              if step.review_close is None else self._apply(conn, step, enc))
                        applied.append(ok and (not step.wake or self._wake(conn, step)))
                except REFUSED as exc:  # the step's, not the disk's
                    raise rejected(step, i, exc) from None
            if rows:
                insert_history(conn, rows, steps)
        return applied

    def _compound(self, conn: sqlite3.Connection, step: StepCommit, enc: Encoded) -> bool:
        """A step with what it carries, in a savepoint: all of it applies, or none."""
        conn.execute("SAVEPOINT step")
        saved = [(s.record, s.record.version, s.record.key) for s in [step, *step.also]]
        saved += [(r, r.version, r.key) for r in step.create]
        try:
            ok = self._fenced(conn, step.fence) and self._apply(conn, step, enc) and all(
                self._apply(conn, s, _encode(0, s)) for s in step.also)
            if ok and step.create:
                self._insert(conn, step.create)
            if ok:
                self._wake(conn, step)
        except sqlite3.IntegrityError:
            ok = False
        if ok:
            conn.execute("RELEASE step")
            return True
        conn.execute("ROLLBACK TO step")
        conn.execute("RELEASE step")
        for rec, version, key in saved:  # nothing was written: the records say so too
            rec.version, rec.key = version, key
        return False

    @staticmethod
    def _wake(conn: sqlite3.Connection, step: StepCommit) -> bool:
        if step.wake:
            conn.execute(_WAKE, (step.record.updated_at, step.wake))
        return True

    @staticmethod
    def _fenced(conn: sqlite3.Connection, fence: Sequence[tuple[str, int]]) -> bool:
        want = dict(fence)
        ids = builtins.list(want)
        for i in range(0, len(ids), 500):  # one query per 500 instances read
            chunk = ids[i:i + 500]
            rows = conn.execute(f"SELECT id, version FROM instances WHERE id IN "
                                f"({','.join('?' * len(chunk))})", chunk).fetchall()
            if len(rows) != len(chunk) or any(want[r[0]] != r[1] for r in rows):
                return False
        return True

    def _insert(self, conn: sqlite3.Connection, records: Sequence[InstanceRecord]) -> None:
        last = conn.execute("SELECT COALESCE(MAX(key), 0) FROM instances").fetchone()[0]
        for i, rec in enumerate(records, start=last + 1):
            rec.key = i
        blobs: Blobs = []
        rows = [_instance_row(rec, blobs) for rec in records]
        self._put_blobs(conn, blobs)
        conn.executemany(self._insert_instance_sql, rows)

    def children(self, parent_id: str) -> builtins.list[InstanceRecord]:
        rows = self._read(_SELECT_INSTANCES + " WHERE parent_id=? ORDER BY key", (parent_id,))
        return self._full([_decode(InstanceRecord, r) for r in rows])

    def child_states(self, parent_id: str) -> builtins.list[ChildState]:
        rows = self._read(f"SELECT {CHILD_STATE_COLUMNS} FROM instances WHERE parent_id=? "
                          "ORDER BY key", (parent_id,), tuples=True)
        return [ChildState(*r) for r in rows]

    def child_outputs(self, parent_id: str) -> builtins.list[ChildOutput]:
        rows = self._read(f"SELECT {CHILD_OUTPUT_COLUMNS} FROM instances WHERE parent_id=? "
                          f"AND status IN ({_FINAL}) ORDER BY key", (parent_id,), tuples=True)
        return _child_outputs(rows, self._fetch_blobs)

    def _apply(self, conn: sqlite3.Connection, step: StepCommit, enc: Encoded,
               defer: Rows | None = None, index: int = 0) -> bool:
        """Write one step in the open transaction; False (nothing written) when stale
        (or when the review item it decides is no longer open to its claimer).  With
        ``defer`` its history rows are appended there (as ``(index, row)``) for the
        caller to insert, else inserted here."""
        if step.review_close is None:
            return self._apply_step(conn, step, enc, defer, index)
        conn.execute("SAVEPOINT review_close")
        try:
            ok = (conn.execute(CLOSE_REVIEW, close_review_args(step.review_close)).rowcount == 1
                  and self._apply_step(conn, step, enc))
            if not ok:
                conn.execute("ROLLBACK TO review_close")
        finally:
            conn.execute("RELEASE review_close")
        return ok

    def _apply_step(self, conn: sqlite3.Connection, step: StepCommit, enc: Encoded,
                    defer: Rows | None = None,
                    index: int = 0) -> bool:
        cols, values, history, attempt, outbox, blobs = enc
        key = step.record.key
        if key is not None:
            values += (key, step.record.id, step.expected_version)
            if conn.execute(_update_sql(cols, True), values).rowcount != 1:
                return False
        else:
            values += (step.record.id, step.expected_version)
            found = conn.execute(_update_sql(cols, False), values).fetchall()  # (drained)
            if not found:
                return False
            key = step.record.key = found[0][0]
        step.record.version = step.expected_version + 1
        if blobs:  # (``_put_blobs``: called only when there are some, a call less a step)
            self._put_blobs(conn, blobs)
        # (no ``strict=``: a keyword sends zip() down its slow call path, ~1.5k instructions)
        for h, row in zip(step.history, history):  # noqa: B905 - one row per history row
            row[0] = key  # the instance's key in place of its id
            if len(row[_DELTA]) > self.blob_threshold:
                row[_DELTA] = self._shrink(conn, h.delta)
            if defer is None:
                conn.execute(_INSERT_HISTORY, row)
            else:
                defer.append((index, row))
        if attempt is not None or outbox is not None or step.review_open is not None \
                or step.stream or step.close_reviews:  # most steps write none of them: no call
            self._rows(conn, step, attempt, outbox)
        return True

    def _rows(self, conn: sqlite3.Connection, step: StepCommit, attempt: Any,
              outbox: Any) -> None:
        """An applied step's attempt, outbox, review and stream-log rows."""
        if attempt is not None:
            conn.execute(self._attempt_sql, attempt)
        if outbox is not None:
            conn.execute("UPDATE outbox SET status='done', result=?, updated_at=? WHERE key=?",
                         outbox)
        if step.review_open is not None:
            conn.execute(INSERT_REVIEW, REVIEW.values(step.review_open))
        if step.close_reviews is not None:
            conn.execute(CLOSE_OPEN_REVIEWS, close_open_args(step))
        if step.stream:  # the tail of its streamed calls (``StepCommit.stream``)
            streams.write(lambda sql, args: conn.execute(sql, args).fetchall(), step.stream)

    def _shrink(self, conn: sqlite3.Connection, delta: dict[str, Any]) -> str:
        """Move large delta values into ``blobs`` (once per content); return the delta's JSON."""
        out: dict[str, Any] = {}
        for key, value in delta.items():
            text = _dumps(value)
            if len(text) > self.blob_threshold:
                digest = hashlib.sha256(text.encode()).hexdigest()
                conn.execute("INSERT OR IGNORE INTO blobs(hash, data) VALUES (?, ?)", (digest, text))
                value = {"$blob": digest}
            out[key] = value
        return _dumps(out)
