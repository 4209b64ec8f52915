"""A call that only waits lends its place in the engine's env thread pool (``rllm_gym/slots.py``), and only then; it
takes a place back before it goes on."""

from __future__ import annotations

import asyncio
import threading

from rllm_gym.engine import EnvThreadPool
from rllm_gym.engine.common import LOANS_PER_WORKER
from rllm_gym.slots import slot_lent


def _run(pool: EnvThreadPool, main) -> object:
    try:
        return asyncio.run(main())
    finally:
        pool.shutdown()


def test_a_call_that_lends_its_place_lets_the_next_call_run_meanwhile():
    pool = EnvThreadPool(max_workers=1, thread_name_prefix="lend")
    release, events = threading.Event(), []

    def waiting() -> bool:
        events.append("waiting")
        with slot_lent():
            released = release.wait(10)
        events.append("back")
        return released

    async def main() -> list:
        first = asyncio.ensure_future(pool.call(waiting))
        # With one worker, this call runs only if the first one lent its place; it lets the first one end.
        helper = asyncio.ensure_future(pool.call(lambda: (events.append("helper"), release.set())))
        return await asyncio.gather(first, helper)

    first, _ = _run(pool, main)
    assert first is True and events == ["waiting", "helper", "back"]
    assert pool.lending == 0


def test_a_call_that_does_not_lend_keeps_its_place():
    pool = EnvThreadPool(max_workers=1, thread_name_prefix="keep")
    release, started = threading.Event(), []

    async def main() -> bool:
        waiting = asyncio.ensure_future(pool.call(lambda: (started.append("waiting"), release.wait(0.3))[1]))
        other = asyncio.ensure_future(pool.call(lambda: started.append("other")))
        result = await waiting
        await other
        return result

    assert _run(pool, main) is False  # nobody could set it: the other call waited for the place
    assert started == ["waiting", "other"]


def test_a_call_back_from_its_loan_goes_on_only_with_a_place_and_before_new_calls():
    """One place: the lender comes back while another call holds it; it goes on once that call ends, before the
    calls that queued meanwhile."""
    pool = EnvThreadPool(max_workers=1, thread_name_prefix="back")
    lent, holder_in, holder_go, events = threading.Event(), threading.Event(), threading.Event(), []

    def lender() -> None:
        with slot_lent():
            lent.set()
            holder_in.wait(10)  # the wait ends while the holder has the place
        events.append("lender goes on")

    def holder() -> None:
        holder_in.set()
        events.append("holder")
        holder_go.wait(10)
        events.append("holder done")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(pool.call(lender))
        await loop.run_in_executor(None, lent.wait, 10)
        second = asyncio.ensure_future(pool.call(holder))
        await loop.run_in_executor(None, holder_in.wait, 10)
        late = asyncio.ensure_future(pool.call(lambda: events.append("late")))
        await asyncio.sleep(0.2)  # the lender is back and waits: neither it nor the late call may run now
        assert events == ["holder"] and pool.lending == 1
        holder_go.set()
        await asyncio.gather(first, second, late)

    _run(pool, main)
    assert events == ["holder", "holder done", "lender goes on", "late"]
    assert pool.lending == 0


def test_lending_outside_a_pool_worker_does_nothing():
    with slot_lent():  # the main thread: no pool, nothing to lend
        pass
    done = []

    def elsewhere() -> None:
        with slot_lent():
            done.append(True)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert done == [True]


def test_a_cancelled_call_that_lends_afterwards_takes_no_place():
    pool = EnvThreadPool(max_workers=1, thread_name_prefix="cancel")
    entered, go, seen = threading.Event(), threading.Event(), []

    def cancelled_then_lends() -> None:
        entered.set()
        go.wait(10)
        with slot_lent():  # its coroutine is gone and gave the place back already: this lends nothing
            seen.append(pool.lending)
        seen.append(pool.lending)

    async def main() -> str:
        loop = asyncio.get_running_loop()
        call = asyncio.ensure_future(pool.call(cancelled_then_lends))
        await loop.run_in_executor(None, entered.wait, 10)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        go.set()
        # The one place, given back by the cancelled call, serves the next call once the worker is free again.
        return await pool.call(lambda: "next")

    assert _run(pool, main) == "next"
    assert seen == [0, 0] and pool.lending == 0


def test_loans_are_bounded_per_worker():
    """At most LOANS_PER_WORKER x max_workers calls lend their place at once; past that a call keeps its own, so the
    work that lent calls started elsewhere stays bounded too."""
    pool = EnvThreadPool(max_workers=1, thread_name_prefix="bounded-loans")
    release, started = threading.Event(), []

    def lends() -> None:
        started.append(True)
        with slot_lent():
            release.wait(10)

    async def main() -> tuple[int, int]:
        calls = [asyncio.ensure_future(pool.call(lends)) for _ in range(LOANS_PER_WORKER + 3)]
        for _ in range(200):  # a bound on a hang, not a timing assertion
            if len(started) == LOANS_PER_WORKER + 1:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # had a further call been let in, it would have started by now
        seen = (len(started), pool.lending)
        release.set()
        await asyncio.gather(*calls)
        return seen

    assert _run(pool, main) == (LOANS_PER_WORKER + 1, LOANS_PER_WORKER)
    assert pool.lending == 0
