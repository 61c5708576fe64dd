"""ActionThreads: sync actions off the event loop, wake-ups batched."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fsm_engine.runtime.threads import ActionThreads


def test_results_and_exceptions_come_back_to_their_callers() -> None:
    pool = ActionThreads(4)

    def work(i: int) -> int:
        if i % 7 == 0:
            raise ValueError(f"bad {i}")
        return i * i

    async def main() -> list[object]:
        futs = [pool.submit(work, i) for i in range(1000)]
        return await asyncio.gather(*futs, return_exceptions=True)

    out = asyncio.run(main())
    pool.shutdown()
    for i, got in enumerate(out):
        if i % 7 == 0:
            assert isinstance(got, ValueError) and str(got) == f"bad {i}"
        else:
            assert got == i * i


def test_blocking_calls_run_in_parallel_threads() -> None:
    pool = ActionThreads(8)
    barrier = threading.Barrier(6, timeout=10)  # passes only if all six run at once

    async def main() -> list[int]:
        return await asyncio.gather(*[pool.submit(barrier.wait) for _ in range(6)])

    assert sorted(asyncio.run(main())) == list(range(6))
    pool.shutdown()


def test_max_threads_bounds_parallelism() -> None:
    pool = ActionThreads(2)
    barrier = threading.Barrier(3, timeout=0.5)  # needs three at once: only two exist

    async def main() -> list[object]:
        futs = [pool.submit(barrier.wait) for _ in range(3)]
        return await asyncio.gather(*futs, return_exceptions=True)

    out = asyncio.run(main())
    pool.shutdown()
    assert all(isinstance(x, threading.BrokenBarrierError) for x in out)


def test_a_hung_call_holds_only_its_own_thread() -> None:
    pool = ActionThreads(4)
    release = threading.Event()

    async def main() -> list[int]:
        hung = pool.submit(release.wait, 10)
        quick = await asyncio.gather(*[pool.submit(abs, -i) for i in range(50)])
        assert not hung.done()
        release.set()
        assert await hung is True
        return quick

    assert asyncio.run(main()) == list(range(50))
    pool.shutdown()


def test_a_call_cancelled_while_queued_never_runs() -> None:
    pool = ActionThreads(1)
    ran: list[str] = []
    gate = threading.Event()

    async def main() -> None:
        first = pool.submit(gate.wait, 10)
        second = pool.submit(ran.append, "second")
        await asyncio.sleep(0.05)  # both dispatched; the only thread is busy with the first
        second.cancel()
        gate.set()
        await first
        await asyncio.sleep(0.05)

    asyncio.run(main())
    pool.shutdown()
    assert ran == []


def test_one_pool_serves_successive_event_loops() -> None:
    pool = ActionThreads(2)
    for n in range(3):
        async def main() -> int:
            return await pool.submit(lambda: n)
        assert asyncio.run(main()) == n
    pool.shutdown()


def test_shutdown_refuses_new_calls_and_stops_idle_threads() -> None:
    pool = ActionThreads(3, name="shutdown-test")

    async def main() -> None:
        await asyncio.gather(*[pool.submit(time.sleep, 0.01) for _ in range(3)])

    asyncio.run(main())
    pool.shutdown()
    deadline = time.monotonic() + 5
    while any(t.name.startswith("shutdown-test") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "idle threads did not stop"
        time.sleep(0.01)

    async def late() -> None:
        pool.submit(abs, 1)

    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(late())
