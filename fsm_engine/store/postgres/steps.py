"""The PostgreSQL store's instances facet: creating instances and the group commit."""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Sequence
from typing import Any

import psycopg

from ...errors import InstanceNotFound, StepRejected, StoreError
from .. import pg_commit
from ..claims import key_taken
from ..codec import (
    CLOSE_OPEN_REVIEWS,
    CLOSE_REVIEW,
    DELTA,
    HISTORY,
    INSERT_REVIEW,
    INSTANCE,
    REVIEW,
    SELECT_INSTANCES,
    Blobs,
    Encoded,
    child_outputs,
    close_open_args,
    close_review_args,
    dumps,
    encode_step,
    instance_row,
    marks,
    update_sql,
)
from ..debounce import FOLD, fold_args
from ..debounce import INDEX as DEBOUNCE_INDEX
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
from .connect import (
    _KEY,
    _SQL_INSERT_ATTEMPT,
    _SQL_INSERT_HISTORY,
    _SQL_INSERT_INSTANCE,
    _SQL_INSTANCE_BY_ID,
    _SQL_OUTBOX_DONE,
    _SQL_WAKE,
    CHANNEL,
    PostgresBase,
    _Undo,
    _why,
)
from .streams import write as write_stream

_FOLD = marks(FOLD.format(least="LEAST"))
#: History rows from this many on go to the table by one ``COPY`` (below it, the prepared
#: ``INSERT`` per row in a pipeline costs less than the ``COPY``'s own round trips).
COPY_MIN_ROWS = 16
_COPY_HISTORY = (f"COPY history (instance, {', '.join(HISTORY.columns[1:])}) FROM STDIN")


def _refused(steps: Sequence[StepCommit], index: int, exc: psycopg.Error) -> StepRejected:
    """The error refusing ``steps[index]`` for the constraint ``exc`` names (one line:
    the index or key, and the values it refused)."""
    rec = steps[index].record
    return StepRejected(f"the store refused a step of instance {rec.id}: {_why(exc)}",
                        index=index, instance_id=rec.id)


def _insert_history(cur: psycopg.Cursor[Any], rows: Sequence[Sequence[Any]]) -> None:
    """Insert encoded history ``rows``: a batch's in one ``COPY`` (from ``COPY_MIN_ROWS``
    on; 512 fires' rows: the commit 80 -> 70 us per step in wall time), fewer one by one."""
    if len(rows) >= COPY_MIN_ROWS:
        with cur.copy(_COPY_HISTORY) as copy:
            for row in rows:
                copy.write_row(row)
    elif rows:
        cur.executemany(_SQL_INSERT_HISTORY, rows)


class PostgresSteps(PostgresBase):
    """Instances and their steps (``store.facets.InstanceStore``): the group commit."""

    # -- instances ------------------------------------------------------------------
    def create(self, *records: InstanceRecord, history: Sequence[HistoryRow] = ()) -> None:
        if not records:
            return
        rows, blobs = self._instance_rows(records)

        def go(conn: psycopg.Connection[Any]) -> builtins.list[int]:
            self._put_blobs(conn, blobs)
            try:
                keys = self._keys(conn, rows)
            except psycopg.errors.UniqueViolation as exc:
                if exc.diag.constraint_name == "idx_instances_start_key":
                    raise key_taken(records) from None
                raise
            with conn.cursor() as cur:
                by_id = {r.id: k for r, k in zip(records, keys, strict=False)}
                copied = []
                for h in history:
                    row = HISTORY.values(h)
                    row[0] = by_id[h.instance_id]
                    copied.append(row)
                if copied:
                    cur.executemany(_SQL_INSERT_HISTORY, copied)
                cur.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
            return keys
        for rec, key in zip(records, self._run(go, txn=True), strict=False):
            rec.key = key

    @staticmethod
    def _keys(conn: psycopg.Connection[Any], rows: builtins.list[builtins.list[Any]]
              ) -> builtins.list[int]:
        """Insert instance rows (without ``key``); their new keys, in order."""
        with conn.cursor() as cur:
            cur.executemany(_SQL_INSERT_INSTANCE, rows, returning=True)
            keys = []
            while True:
                keys.append(cur.fetchone()[0])  # type: ignore[index]
                if not cur.nextset():
                    break
        return keys

    @staticmethod
    def _instance_rows(records: Sequence[InstanceRecord]
                       ) -> tuple[builtins.list[builtins.list[Any]], Blobs]:
        """The INSERT rows of ``records`` (without ``key``: the database assigns it) and
        the large values they put beside themselves."""
        blobs: Blobs = []
        rows = []
        for rec in records:
            row = instance_row(rec, blobs)
            del row[_KEY]
            rows.append(row)
        return rows, blobs

    def _insert(self, conn: psycopg.Connection[Any], records: Sequence[InstanceRecord]) -> None:
        rows, blobs = self._instance_rows(records)
        self._put_blobs(conn, blobs)
        for rec, key in zip(records, self._keys(conn, rows), strict=False):
            rec.key = key

    def debounce(self, rec: InstanceRecord) -> str:
        blobs: Blobs = []
        args = fold_args(rec, blobs)

        def go(conn: psycopg.Connection[Any]) -> str | None:
            self._put_blobs(conn, blobs)
            with conn.cursor() as cur:
                row = cur.execute(_FOLD, args).fetchone()
                if row is not None:
                    return str(row[0])
                try:
                    with conn.transaction():  # a savepoint: a racing first start won
                        [key] = self._keys(conn, self._instance_rows([rec])[0])
                except psycopg.errors.UniqueViolation as exc:
                    if exc.diag.constraint_name != DEBOUNCE_INDEX:
                        raise
                    return None  # fold into the winner's, in a new transaction
                cur.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
            rec.key = key
            return rec.id
        for _ in range(10):
            held = self._run(go, txn=True)
            if held is not None:
                return held
        raise StoreError(f"database {self.url}: a debounced start of {rec.debounce_key!r} "
                         "lost ten races in a row")

    def by_start_key(self, machine: str, key: str) -> InstanceRecord | None:
        rows = self._rows(marks(SELECT_INSTANCES + " WHERE machine=? AND start_key=?"),
                          (machine, key))
        return self._full([INSTANCE.decode(rows[0])])[0] if rows else None

    def by_debounce_key(self, machine: str, key: str) -> InstanceRecord | None:
        rows = self._rows(marks(SELECT_INSTANCES + " WHERE machine=? AND debounce_key=? AND "
                                "status='scheduled'"), (machine, key))
        return self._full([INSTANCE.decode(rows[0])])[0] if rows else None

    def get(self, instance_id: str) -> InstanceRecord:
        rows = self._rows(_SQL_INSTANCE_BY_ID, (instance_id,))
        if not rows:
            raise InstanceNotFound(instance_id)
        return self._full([INSTANCE.decode(rows[0])])[0]

    def list(self, *, statuses: Sequence[str] | None = None,
             machine: str | None = None, owner: str | None = None) -> builtins.list[InstanceRecord]:
        sql, args = SELECT_INSTANCES + " WHERE TRUE", []  # type: tuple[str, builtins.list[Any]]
        if owner:
            sql += " AND owner=%s"
            args.append(owner)
        if statuses:
            sql += " AND status = ANY(%s)"
            args.append(builtins.list(statuses))
        if machine:
            sql += " AND machine=%s"
            args.append(machine)
        return self._full([INSTANCE.decode(r) for r in self._rows(sql + " ORDER BY key", args)])

    # -- the hot path -------------------------------------------------------------------
    def commit(self, steps: Sequence[StepCommit]) -> builtins.list[bool]:
        if not steps:
            return []
        encoded = [encode_step(i, step) for i, step in enumerate(steps)]  # refusals first
        if pg_commit.plain(steps):
            applied = self._commit_plain(steps, encoded)
            if applied is not None:
                return applied

        def go(conn: psycopg.Connection[Any]) -> builtins.list[bool]:
            return self._commit_general(conn, steps, encoded)
        keys = [(s.record, s.record.key) for s in steps]
        try:
            applied = self._run(go, txn=True)
        except BaseException:
            for rec, key in keys:
                rec.key = key
            raise
        for step, ok in zip(steps, applied, strict=False):
            if ok:
                for s in [step, *step.also]:
                    s.record.version = s.expected_version + 1
        return applied

    def _commit_general(self, conn: psycopg.Connection[Any], steps: Sequence[StepCommit],
                        encoded: Sequence[Encoded]) -> builtins.list[bool]:
        """``commit``'s transaction for any batch: the plain steps' UPDATEs in one pipeline,
        their wakes and rows, then each decision and each family alone under a savepoint,
        then the stream rows of all that applied (``postgres.streams.write``: the advisory
        locks of their instances taken in sorted order, once).  A step whose row breaks a
        constraint (a unique index refusing its UPDATE or a row) raises ``StepRejected``
        by its index; the caller's transaction then rolls back (nothing of the batch)."""
        plain = [i for i, s in enumerate(steps) if s.review_close is None and not s.compound]
        applied = [False] * len(steps)
        try:
            with conn.transaction():  # a savepoint: a constraint is one step's fault
                self._plain(conn, steps, encoded, plain, applied)
        except psycopg.IntegrityError as exc:
            raise self._rejected(conn, steps, encoded, plain, exc) from None
        for i, step in enumerate(steps):  # decisions, then families: each alone, under a savepoint
            if step.review_close is not None:
                try:
                    applied[i] = self._decide(conn, step, encoded[i])
                except psycopg.IntegrityError as exc:
                    raise _refused(steps, i, exc) from None
        for i, st in enumerate(steps):
            if st.compound and st.review_close is None:
                applied[i] = self._compound(conn, st, encoded[i])
        tails = [op for s, ok in zip(steps, applied, strict=False) if ok
                 for t in (s, *s.also) for op in t.stream]
        if tails:  # the applied steps' streamed rows (``StepCommit.stream``), written once:
            write_stream(conn, tails)  # each instance's lock in one order, as every batch's
        if any(ok and s.record.owner is None and s.record.status == "running"
               for s, ok in zip(steps, applied, strict=False)):  # given back (a queue hand-off)
            conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
        return applied

    def _plain(self, conn: psycopg.Connection[Any], steps: Sequence[StepCommit],
               encoded: Sequence[Encoded], plain: Sequence[int], applied: builtins.list[bool]
               ) -> None:
        """The steps at ``plain`` (indexes in ``steps``): their UPDATEs in one pipeline
        (``applied[i]`` set where one applied), then the wakes and rows of those applied."""
        if not plain:
            return
        for i, ok in zip(plain, self._updates(conn, [steps[i] for i in plain],
                                              [encoded[i] for i in plain]), strict=False):
            applied[i] = ok
        done = [i for i in plain if applied[i]]
        self._wake_parents(conn, [steps[i] for i in done])
        self._appends(conn, [(steps[i], encoded[i]) for i in done])

    @staticmethod
    def _wake_parents(conn: psycopg.Connection[Any], done: Sequence[StepCommit]) -> None:
        """Children that ended tell their parents, in the same transaction."""
        wakes = [(step.record.updated_at, step.wake) for step in done if step.wake]
        if wakes:
            with conn.cursor() as cur:
                cur.executemany(_SQL_WAKE, wakes)
                cur.execute("SELECT pg_notify(%s, '')", (CHANNEL,))

    def _commit_plain(self, steps: Sequence[StepCommit], encoded: Sequence[Encoded]
                      ) -> builtins.list[bool] | None:
        """``commit`` of a batch that fits one statement (``pg_commit``); ``None`` when the
        statement broke a constraint (nothing applied: the general path finds the step)."""
        batch = pg_commit.Batch()
        for i, (step, enc) in enumerate(zip(steps, encoded, strict=False)):
            batch.add(i, step, enc, self.blob_threshold, self._shrink)

        def go(conn: psycopg.Connection[Any]) -> builtins.list[Any] | None:
            try:
                with psycopg.RawCursor(conn) as cur:
                    return cur.execute(pg_commit.statement(), batch.params()).fetchall()
            except psycopg.IntegrityError:
                return None
        rows = self._run(go)
        if rows is None:
            return None
        applied = [False] * len(steps)
        for (i,) in rows:
            applied[i] = True
            steps[i].record.version = steps[i].expected_version + 1
        return applied

    def _rejected(self, conn: psycopg.Connection[Any], steps: Sequence[StepCommit],
                  encoded: Sequence[Encoded], plain: Sequence[int],
                  exc: psycopg.Error) -> StepRejected:
        """The ``StepRejected`` naming the first of the ``plain`` steps whose UPDATE or rows
        break a constraint: each applied again in order, alone in a savepoint (a later step
        meets what the earlier ones wrote, as in the batch; the caller's transaction then
        rolls back).  ``exc`` (the batch's) is reported when none breaks one alone."""
        for i in plain:
            try:
                with conn.transaction():
                    if self._updates(conn, [steps[i]], [encoded[i]])[0]:
                        self._appends(conn, [(steps[i], encoded[i])])
            except psycopg.IntegrityError as alone:
                return _refused(steps, i, alone)
        return _refused(steps, plain[0], exc)

    def _compound(self, conn: psycopg.Connection[Any], step: StepCommit,
                  enc: Encoded) -> bool:
        """A step with what it carries, in a savepoint: all of it applies, or none.  Fenced
        rows are locked (``FOR UPDATE``) so none moves on before this transaction ends."""
        class _Stale(Exception):
            pass
        created = [(r, r.key) for r in step.create]
        try:
            with conn.transaction():
                with conn.cursor() as cur:
                    for instance_id, version in step.fence:
                        cur.execute("SELECT version FROM instances WHERE id=%s FOR UPDATE",
                                    (instance_id,))
                        row = cur.fetchone()
                        if row is None or row[0] != version:
                            raise _Stale
                group = [(step, enc), *((s, encode_step(0, s)) for s in step.also)]
                if not all(self._updates(conn, [g[0] for g in group], [g[1] for g in group])):
                    raise _Stale
                self._appends(conn, group)
                if step.create:
                    self._insert(conn, step.create)
                with conn.cursor() as cur:
                    if step.wake:
                        cur.execute(_SQL_WAKE, (step.record.updated_at, step.wake))
                    if step.create or step.wake:
                        cur.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
        except (_Stale, psycopg.errors.UniqueViolation):
            for rec, key in created:
                rec.key = key
            return False
        return True

    def children(self, parent_id: str) -> builtins.list[InstanceRecord]:
        rows = self._rows(marks(SELECT_INSTANCES + " WHERE parent_id=? ORDER BY key"),
                          (parent_id,))
        return self._full([INSTANCE.decode(r) for r in rows])

    def child_states(self, parent_id: str) -> builtins.list[ChildState]:
        def go(conn: psycopg.Connection[Any]) -> builtins.list[ChildState]:
            with conn.cursor() as cur:
                cur.execute(f"SELECT {CHILD_STATE_COLUMNS} FROM instances WHERE parent_id=%s "
                            "ORDER BY key", (parent_id,))
                return [ChildState(*r) for r in cur.fetchall()]
        return self._run(go)

    def child_outputs(self, parent_id: str) -> builtins.list[ChildOutput]:
        def go(conn: psycopg.Connection[Any]) -> builtins.list[Any]:
            with conn.cursor() as cur:
                cur.execute(f"SELECT {CHILD_OUTPUT_COLUMNS} FROM instances WHERE parent_id=%s "
                            "AND status = ANY(%s) ORDER BY key",
                            (parent_id, sorted(FINAL_STATUSES)))
                return cur.fetchall()
        return child_outputs(self._run(go), self._fetch_blobs)

    def _updates(self, conn: psycopg.Connection[Any], steps: Sequence[StepCommit],
                 encoded: Sequence[Encoded]) -> builtins.list[bool]:
        """Every step's compare-and-set UPDATE, in order, in one pipeline; True where applied
        (a later step of the same instance sees the earlier one's version)."""
        cursors = []
        with conn.pipeline():
            for step, (cols, values, *_) in zip(steps, encoded, strict=False):
                rec = step.record
                by_key = rec.key is not None
                args = [*values, *((rec.key, rec.id) if by_key else (rec.id,)),
                        step.expected_version]
                cur = conn.cursor()
                cur.execute(marks(update_sql(cols, by_key)), args)
                cursors.append((cur, by_key))
        applied = []
        for step, (cur, by_key) in zip(steps, cursors, strict=False):
            if by_key:
                applied.append(cur.rowcount == 1)
            else:
                found = cur.fetchall()
                if found:
                    step.record.key = found[0][0]
                applied.append(bool(found))
            cur.close()
        return applied

    def _decide(self, conn: psycopg.Connection[Any], step: StepCommit, enc: Encoded) -> bool:
        """Close the step's review item and apply the step, both or neither."""
        assert step.review_close is not None
        try:
            with conn.transaction():
                cur = conn.execute(marks(CLOSE_REVIEW), close_review_args(step.review_close))
                if cur.rowcount != 1 or not self._updates(conn, [step], [enc])[0]:
                    raise _Undo("decision not applied")
                self._appends(conn, [(step, enc)])
                if step.wake:  # a decision that ends a child wakes its parent
                    conn.execute(_SQL_WAKE, (step.record.updated_at, step.wake))
                    conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
        except _Undo:
            return False
        return True

    def _appends(self, conn: psycopg.Connection[Any],
                 steps: Sequence[tuple[StepCommit, Encoded]]) -> None:
        """History, attempt and outbox rows of the applied ``steps`` (batched; their stream
        rows come last, ``_commit_general``)."""
        history: list[list[Any]] = []
        attempts: list[Any] = []
        done: list[Any] = []
        opened: list[Any] = []
        closed: list[Any] = []
        blobs: Blobs = []
        for step, (_, _, rows, attempt, outbox, large) in steps:
            blobs += large
            for h, encoded_row in zip(step.history, rows, strict=False):
                row = list(encoded_row)
                row[0] = step.record.key
                if len(row[DELTA]) > self.blob_threshold:
                    row[DELTA] = self._shrink(h.delta, large, blobs)
                history.append(row)
            if attempt is not None:
                attempts.append(attempt)
            if outbox is not None:
                done.append(outbox)
            if step.review_open is not None:
                opened.append(REVIEW.values(step.review_open))
            if step.close_reviews is not None:
                closed.append(close_open_args(step))
        self._put_blobs(conn, blobs)
        with conn.cursor() as cur:
            _insert_history(cur, history)
            for sql, rows in ((_SQL_INSERT_ATTEMPT, attempts),
                              (_SQL_OUTBOX_DONE, done), (marks(INSERT_REVIEW), opened),
                              (marks(CLOSE_OPEN_REVIEWS), closed)):
                if rows:
                    cur.executemany(sql, rows)

    def _shrink(self, delta: dict[str, Any], known: Blobs, blobs: Blobs) -> str:
        """``delta``'s JSON with each value longer than ``blob_threshold`` replaced by
        ``{"$blob": hash}``; the value goes to ``blobs`` unless ``known`` (the step's
        large context values, stored anyway) already holds it."""
        out: dict[str, Any] = {}
        for key, value in delta.items():
            text = dumps(value)
            if len(text) > self.blob_threshold:
                digest = next((d for d, data in known if data == text), None)
                if digest is None:
                    digest = hashlib.sha256(text.encode()).hexdigest()
                    blobs.append((digest, text))
                value = {"$blob": digest}
            out[key] = value
        return dumps(out)
