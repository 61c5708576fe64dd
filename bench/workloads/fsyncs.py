"""One untimed session for counting fsyncs: ``python -m bench.workloads.fsyncs TASK_JSON N``.

Run under ``strace -f -c -e trace=fsync,fdatasync`` by ``bench/orchestrate.py``
(once with ``N`` instances and once with 1, so opening, schema creation and
closing cancel out): ``(calls(N) - calls(1)) / (6 (N - 1))`` is the durable
work per transition.  Timing under strace is meaningless; only the counts are used.
"""

from __future__ import annotations

import asyncio
import json
import sys

from ..common import fresh_path
from .steps import Session, Task


async def main(task: Task, n: int) -> None:
    session = Session(task, fresh_path(task.workdir, f"fsync-{task.tag}-{n}.db"))
    await session.open()
    if n:
        await session.run(n)
    await session.close()


if __name__ == "__main__":
    asyncio.run(main(Task(**json.loads(sys.argv[1])), int(sys.argv[2])))
    print("{}")
