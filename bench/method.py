"""The method notes appended to bench/RESULTS.md."""

METHOD = """## Method

- **Machine.** Everyone runs the same chain `s0 → … → s6` (6 transitions); the
  state is one integer `n`, every action adds 1, a finished instance must have
  `n == 6` (each run checks it, and the peers' own stores are checked for the
  expected number of saved steps).  µs / transition = wall time of the whole
  run ÷ (instances × 6); creating the instances is inside the timed region,
  opening the store / compiling graphs / launching DBOS is not.
- **Repetitions.** Each framework runs in its own long-lived child process
  (after one untimed warm-up of 5 instances per case); repetition *k* of every
  framework runs before repetition *k + 1* of any, each on a fresh database.
  Peak RSS is the process's `VmHWM`, reset before each repetition, so it
  includes the interpreter and the framework's imports.  DB size is the file
  (plus WAL) after the framework closed it.
- **CPU and fsyncs.** Beside the wall time every run records its child
  process's CPU time (`time.process_time()`: all its threads), shown as CPU µs
  per durable transition; it does not swing with the disk's fsync latency the
  way wall time does.  Fsyncs per transition come from a separate, untimed run
  of each peer under `strace -f -c -e trace=fsync,fdatasync` (W1: 20
  instances, W2: the W2 size), minus a run of one instance (so opening and
  closing the peer cancel out), over 6 × (instances − 1).
- **Context sizes.** "W1 at three context sizes" gives the context a `doc`
  string of 300 B, 10 kB or 100 kB that no action changes (fsm_engine: a
  `doc: str` field set by the start input; the floor and `transitions`: a key
  of the JSON context they rewrite with every transition, as a hand-written
  loop storing its state would), synchronous=NORMAL, so CPU shows what a step
  costs with a large context.
- **floor (raw SQLite).** One connection, prepared statements; W1: per
  instance one transaction inserting the instance row, then per transition one
  `BEGIN IMMEDIATE … COMMIT` updating the instance row and inserting one
  history row.  W2: the instances are created in one transaction and run as
  asyncio tasks whose transitions are group-committed: every transition ready
  in one event-loop iteration joins one transaction (two `executemany`), and
  each task continues once its transition is committed — what the fastest
  hand-written durable code would do.
- **fsm_engine.** `Engine(SqliteStore(path, synchronous=…))`; W1: `start` then
  `await run(id)` per instance; W2: `start_many` (one transaction) then
  `await run_many(ids)`.  The "fsm_engine" row uses `async def` actions, which
  the engine runs on the event loop — the way every peer here runs its
  actions, in the caller's thread.  The "(def actions)" row uses plain `def`
  actions, which the engine always runs in a worker thread (one may block on
  I/O without stalling the other instances): one thread hop per step, a pair
  of thread wake-ups that costs 0.1–0.2 ms on this VM for a lone instance and
  is amortised across instances under load.  The "(def, inline)" row declares
  the same plain `def` actions `State(..., inline=True)`: run on the event
  loop, no thread hop (only for quick actions that never block).  Per instance fsm_engine commits 7
  transactions (start, 6 steps: the starting engine owns the instance, so no
  claim), like the floor.
- **transitions + SQLite.** One `Machine` (W2: `AsyncMachine`) shared through
  `add_model`/`remove_model`; the action is the transition's `before`
  callback, `after_state_change` commits the same two statements as the floor.
- **LangGraph.** `StateGraph` with nodes `s0 … s5` → `END`, compiled with
  `SqliteSaver` (W1, `invoke`) or `AsyncSqliteSaver` (W2, `ainvoke` under
  `asyncio.gather`), `durability="sync"` so each super-step's checkpoint is
  committed before the next; `PRAGMA synchronous` set on the connection we
  hand it (its `setup()` turns on WAL).
- **Burr.** Six `@action`s, `initialize_from(persister, resume_at_next_action=True)`
  + `with_state_persister(persister)`, one `app_id` per instance; W1
  `SQLitePersister` + `run`, W2 `AsyncSQLitePersister` (aiosqlite, one shared
  by all applications) + `abuild`/`arun`.  We pass connections in WAL mode with
  our `synchronous` (Burr's default is the rollback journal).  Building the
  application per instance is inside the timed region (it loads the prior
  state from the persister, as the docs' recipe does).
- **DBOS.** One `@DBOS.workflow` per instance calling six `@DBOS.step`s
  (each step's output is recorded before the workflow continues); W1 calls the
  sync workflow directly under `SetWorkflowID`; W2 uses DBOS's native async
  workflows and steps (`DBOS.start_workflow_async`, `await handle.get_result()`),
  no threads of ours.  SQLite system database; a SQLAlchemy `connect`
  listener sets WAL and our `synchronous` (DBOS leaves the rollback journal).
- **W2 ideal** is 0.2 s: only `s2` sleeps, so the critical path holds one
  sleep.  fsm_engine's wall time is also shown split into creating the
  instances (`start_many`, one transaction) and `run_many`.
- **W3.** A runner process starts N instances of the sleeping machine and runs
  them; the parent SIGKILLs it once 2.5 × N transitions are committed (every
  instance is past `s1`, some past `s2`, all in flight).  A new process opens
  the database and calls `resume()`.  Each action appends
  `instance state visit pid` to a side file when it completes; a *completed
  step executed twice* is one whose transition was committed before the kill
  and whose action ran again after it.  Actions that completed but whose
  commit died with the runner run again by design (at-least-once) and are
  counted apart.
- **W4.** The provider is wrapped to time every `complete` call; the share is
  the union of call intervals over the wall time of running the 3 instances
  (model loaded beforehand).  "sequential" runs one instance after another,
  "run_many" all three at once (calls queue on the model's single thread).
- **Profile.** cProfile of fsm_engine in W1/W2 (`--profile`); cProfile slows
  pure-Python code more than C calls, so Python shares are overstated.
"""
