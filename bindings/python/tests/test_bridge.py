"""The asyncio bridge (``call`` in src/lib.rs): each event loop's completion
queue and wake-up socket, cancellation, several loops, closed loops.

Time: (b) every lease a test needs held across its steps (TTL), every wait
and every bound is a base figure scaled by the patience measured at the
test's start (tests/patience.py); a bound that tells an abort from a wait
running out stays shorter than that wait, as its base is.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import uuid
from typing import List

import pytest
import redis as redis_py

import fencelock
from patience import Patience
from servers import Server


def fresh(name: str) -> str:
    return f"py:{name}:{uuid.uuid4().hex[:8]}"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_many_concurrent_calls_on_one_loop_settle_with_their_own_results(url: str) -> None:
    async def main() -> None:
        patience = await Patience.measure_async()
        async with await fencelock.connect(url) as a, await fencelock.connect(url) as b:
            keys = [fresh(f"burst{i}") for i in range(200)]
            guards = await asyncio.gather(*(a.acquire(key, ttl=patience.scale(10)) for key in keys))
            assert [g.key for g in guards] == keys
            assert all(g.owner == a.owner for g in guards)
            # Successes, typed failures and plain values, all in one burst.
            tried, leases, bad = await asyncio.gather(
                asyncio.gather(*(b.acquire(key, wait=0) for key in keys[:50]), return_exceptions=True),
                asyncio.gather(*(b.inspect(key) for key in keys)),
                asyncio.gather(a.acquire("", wait=0), b.acquire(fresh("ttl0"), ttl=0), return_exceptions=True),
            )
            assert all(isinstance(e, fencelock.NotAcquired) and e.code == "not_acquired" for e in tried), patience
            assert [(lease["key"], lease["token"]) for lease in leases] == [(g.key, g.token) for g in guards]
            assert all(isinstance(e, fencelock.InvalidInput) for e in bad), bad
            await asyncio.gather(*(g.release() for g in guards))
            assert await asyncio.gather(*(b.inspect(key) for key in keys)) == [None] * len(keys)

    asyncio.run(main())


def test_a_cancelled_waiting_acquire_is_aborted_and_leaves_the_key_free(redis: Server) -> None:
    url = redis.url
    server = redis_py.Redis(host="127.0.0.1", port=redis.port)

    async def subscribed(patience: Patience, key: str, wanted: bool) -> None:
        """Until a waiter of ``key`` is subscribed to its release channel
        (the Redis backend subscribes only while a waiter waits), or no
        longer is; at most ten seconds (scaled)."""
        await patience.wait_for_async(
            10, f"waiter subscribed: {wanted}", lambda: bool(server.pubsub_channels(f"*{key}*")) == wanted
        )

    async def main() -> None:
        patience = await Patience.measure_async()
        async with await fencelock.connect(url) as a, await fencelock.connect(url) as b, \
                await fencelock.connect(url) as c:
            key = fresh("cancelled")
            held = await a.acquire(key, ttl=patience.scale(10))
            waiting = asyncio.ensure_future(b.acquire(key, ttl=10, wait=patience.scale(30)))
            await subscribed(patience, key, True)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            # The abort dropped the core's waiting acquire: it unsubscribes
            # long before its 30 s wait would have ended.
            await subscribed(patience, key, False)
            await held.release()
            mine = await c.acquire(key, ttl=patience.scale(10), wait=0)
            assert [h["owner"] for h in await c.holders(key)] == [c.owner]
            await mine.release()
            assert await c.inspect(key) is None

    asyncio.run(main())


def test_two_event_loops_in_two_threads_at_once(url: str, patience: Patience) -> None:
    both_running = threading.Barrier(2, timeout=patience.scale(30))
    results: List[object] = [None, None]

    def thread(index: int) -> None:
        async def main() -> List[int]:
            both_running.wait()
            async with await fencelock.connect(url) as client:
                keys = [fresh(f"loop{index}-{i}") for i in range(50)]
                guards = await asyncio.gather(*(client.acquire(key, ttl=patience.scale(10)) for key in keys))
                assert [g.key for g in guards] == keys
                await asyncio.gather(*(g.release() for g in guards))
                return [g.token for g in guards]

        try:
            results[index] = asyncio.run(main())
        except BaseException as failed:  # reported by the test's thread
            results[index] = failed

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=patience.scale(120))
    for result in results:
        assert isinstance(result, list) and len(result) == 50, (result, str(patience))


def test_a_result_arriving_after_its_loop_closed_is_dropped_and_its_guard_released(
    url: str, patience: Patience
) -> None:
    async def connect() -> fencelock.Client:
        return await fencelock.connect(url)

    key = fresh("late")
    ttl = patience.scale(10)
    a = asyncio.run(connect())
    b = asyncio.run(connect())
    held = asyncio.run(a.acquire(key, ttl=ttl))

    async def start_waiting() -> None:
        # The call is made and its future left pending when the loop closes.
        asyncio.ensure_future(b.acquire(key, ttl=ttl, wait=patience.scale(30)))
        await asyncio.sleep(0)

    doomed = asyncio.new_event_loop()
    doomed.run_until_complete(start_waiting())
    doomed.close()
    gc.collect()

    async def after() -> None:
        await held.release()
        # b's acquire completes now, for a closed loop: its guard is dropped
        # and released in the background, so the key comes free again.
        again = await a.acquire(key, ttl=10, wait=patience.scale(20))
        await again.release()
        await a.close()
        await b.close()

    asyncio.run(after())


def test_closed_loops_leave_no_descriptor_open(redis: Server) -> None:
    url = redis.url

    async def connect() -> fencelock.Client:
        return await fencelock.connect(url)

    client = asyncio.run(connect())
    key = fresh("fds")

    async def one_call() -> None:
        assert await client.inspect(key) is None

    asyncio.run(one_call())
    gc.collect()
    before = open_fds()
    for _ in range(20):
        asyncio.run(one_call())
    gc.collect()
    # Twenty loops' socket pairs would be forty descriptors; the last
    # loop's pair may still be held for a moment by its finishing task.
    assert open_fds() <= before + 2
    asyncio.run(client.close())
