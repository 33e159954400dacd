"""Loss before expiry with the Redis server paused, and many held locks.

Time: (b) every TTL, operation timeout, wait and hold is a base figure
scaled by the patience measured at the test's start (tests/patience.py).
"Lost before the lease ended" is checked against the lease's end as the
backend last reported it (``guard.expires_at``, on this machine's clock),
not against one renewal's send plus the TTL, which a background renewal
before the pause (however late the pause comes) moves on. "Not lost within
0.1 s" is a lower bound, left as it is.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import List, Optional

import pytest

import fencelock
from patience import Patience
from servers import Server


def test_loss_fires_before_the_lease_ends_and_run_is_cancelled(redis: Server) -> None:
    key = f"py:loss:{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        patience = await Patience.measure_async()
        ttl = patience.scale(2.0)
        client = await fencelock.connect(redis.url, op_timeout=patience.scale(0.5))
        started = asyncio.Event()
        cancelled = asyncio.Event()
        held: List[fencelock.Guard] = []

        async def work(guard: fencelock.Guard) -> None:
            held.append(guard)
            await guard.renew()
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        running = asyncio.ensure_future(client.run(key, work, ttl=ttl))
        await started.wait()
        lost = asyncio.ensure_future(held[0].lost())
        redis.command("pause")
        try:
            reason = await asyncio.wait_for(lost, ttl * 3)
            lost_at = time.time()
            with pytest.raises(fencelock.LockLost) as raised:
                await running
        finally:
            redis.command("resume")
        assert reason == "deadline", patience
        assert raised.value.code == "not_held" and raised.value.reason == "deadline"
        assert cancelled.is_set()
        # The end of the last grant the backend confirmed: a renewal it took
        # but whose answer the pause held back only ends the lease later.
        ends = held[0].expires_at.timestamp()
        assert lost_at < ends, (f"lost {lost_at - ends:.3f} s after the lease ended", str(patience))
        other = await fencelock.connect(redis.url)
        after = await other.acquire(key, ttl=ttl, wait=ttl * 5)
        assert after.token > held[0].token
        await after.release()
        await other.close()
        await client.close()

    asyncio.run(main())


def test_ten_thousand_held_locks_renew_without_loss(redis: Server) -> None:
    count = 10_000
    prefix = f"py:many:{uuid.uuid4().hex[:8]}:"

    async def main() -> None:
        patience = await Patience.measure_async()
        ttl = patience.scale(10.0)
        client = await fencelock.connect(redis.url)
        guards: List[fencelock.Guard] = []
        for start in range(0, count, 100):
            batch = [client.acquire(f"{prefix}{i}", ttl=ttl) for i in range(start, start + 100)]
            guards.extend(await asyncio.gather(*batch))
        first_lost = asyncio.ensure_future(
            asyncio.wait([asyncio.ensure_future(g.lost()) for g in guards], return_when=asyncio.FIRST_COMPLETED)
        )
        # Two lease lengths: every lease needs several renewals to live.
        deadline = time.monotonic() + 2 * ttl
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            assert not first_lost.done(), ([g.loss_reason for g in guards if g.loss_reason][:5], str(patience))
        assert all(g.is_valid for g in guards), patience
        listed = await client.list(prefix)
        assert len(listed) == count
        first_lost.cancel()
        # Released in batches: close() would send all 10,000 release
        # scripts at once, more than a loaded machine's Redis answers
        # within the connection's 5 s response timeout.
        for start in range(0, count, 500):
            await asyncio.gather(*(g.release() for g in guards[start : start + 500]))
        await client.close()
        check = await fencelock.connect(redis.url)
        assert await check.list(prefix) == []
        await check.close()

    asyncio.run(main())


def test_lost_before_wait_of_sync_guard_returns_none_then_the_reason(redis: Server, patience: Patience) -> None:
    client = fencelock.connect_sync(redis.url)
    # Held until the force-release: a lease that ran out first would be lost
    # by its deadline, not refused.
    guard = client.acquire(f"py:synclost:{uuid.uuid4().hex[:8]}", ttl=patience.scale(5))
    assert guard.lost(timeout=0.1) is None
    client.force_release(guard.key)
    reason: Optional[str] = guard.lost(timeout=patience.scale(10))
    assert reason == "refused", (reason, str(patience))
    with pytest.raises(fencelock.LockLost):
        guard.check()
    client.close()
