"""The rest of the client's API: multi-key locks, semaphores, read-write
locks, elections, fences and the operator calls.

Time: (b) every lease a test needs held across its steps (TTL) and every
wait that must be long enough is a base figure scaled by the patience
measured at the test's start (tests/patience.py: ``Patience.measure_async()``
in an event loop, the ``patience`` fixture otherwise); nothing asserts a
time.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

import fencelock
from patience import Patience


def fresh(name: str) -> str:
    return f"py:{name}:{uuid.uuid4().hex[:8]}"


def test_lock_all_semaphore_and_rwlock(url: str) -> None:
    async def main() -> None:
        ttl = (await Patience.measure_async()).scale(10)
        async with await fencelock.connect(url) as a, await fencelock.connect(url) as b:
            keys = [fresh("all1"), fresh("all2")]
            async with await a.lock_all(keys, ttl=ttl) as both:
                assert sorted(both.tokens) == sorted(keys) and both.is_valid
                with pytest.raises(fencelock.NotAcquired):
                    await b.lock_all([keys[1], fresh("all3")], wait=0)
            name = fresh("sem")
            p1 = await a.semaphore(name, 2, ttl=ttl)
            p2 = await b.semaphore(name, 2, ttl=ttl)
            assert {p1.slot, p2.slot} == {0, 1} and p1.permits == 2
            with pytest.raises(fencelock.NotAcquired):
                await b.semaphore(name, 2, wait=0)
            assert len(await a.permit_holders(name, 2)) == 2
            with pytest.raises(fencelock.InvalidInput):
                await b.semaphore(name, 3, wait=0)
            await p1.release()
            await p2.release()
            key = fresh("rw")
            r1 = await a.rwlock(key).read(ttl=ttl)
            r2 = await b.rwlock(key).read(ttl=ttl)
            assert r1.mode == r2.mode == "shared"
            assert len(await a.holders(key)) == 2
            with pytest.raises(fencelock.NotAcquired):
                await b.rwlock(key).write(wait=0)
            await r1.release()
            await r2.release()
            async with b.rwlock(key).write(ttl=ttl) as writer:
                assert writer.mode == "exclusive" and writer.token > max(r1.token, r2.token)

    asyncio.run(main())


def test_election_and_fence(url: str) -> None:
    async def main() -> None:
        patience = await Patience.measure_async()
        ttl = patience.scale(10)
        async with await fencelock.connect(url) as a, await fencelock.connect(url) as b:
            election = a.election(fresh("elect").replace(":", "-"))
            assert await election.leader() is None
            leader = await election.campaign(ttl=ttl, value={"addr": "a"})
            current = await election.leader()
            assert current is not None and current["term"] == leader.term and current["value"] == {"addr": "a"}
            with pytest.raises(fencelock.NotAcquired):
                await b.election(election.name).campaign(wait=0)
            changes = election.observe()
            first = await changes.__anext__()
            assert first["elected"]["term"] == leader.term
            await leader.resign()
            standby = await b.election(election.name).campaign(wait=patience.scale(10))
            assert standby.term > leader.term, patience
            await standby.resign()
            ran = await b.election(election.name).run(lambda lead: asyncio.sleep(0, lead.term), ttl=ttl)
            assert ran > standby.term

            fence = await fencelock.open_fence(url)
            resource = fresh("res")
            assert await fence.highest(resource) is None
            await fence.admit(resource, 5)
            await fence.admit(resource, 7)
            with pytest.raises(fencelock.Stale) as stale:
                await fence.admit(resource, 6)
            assert stale.value.code == "stale"
            assert await fence.highest(resource) == 7

    asyncio.run(main())


def test_inspect_list_stats_force_release_cleanup(url: str, patience: Patience) -> None:
    ttl = patience.scale(10)
    client = fencelock.connect_sync(url)
    key = fresh("ops")
    guard = client.acquire(key, ttl=ttl, kind="job", data={"n": 1})
    lease = client.inspect(key)
    assert lease is not None and lease["token"] == guard.token and lease["kind"] == "job"
    assert lease["data"] == {"n": 1} and lease["owner"] == client.owner
    assert [l["key"] for l in client.list(key)] == [key]
    assert client.stats()["held"] >= 1
    assert client.validate(key, guard.token)
    removed = client.force_release(key)
    assert removed is not None and removed["token"] == guard.token, patience
    assert client.inspect(key) is None
    assert isinstance(client.cleanup(), int)
    with pytest.raises(fencelock.LockLost) as gone:
        guard.release()
    assert gone.value.code == "not_held"
    client.close()


def test_a_loss_inside_with_raises_the_loss_not_the_release_failure(url: str, patience: Patience) -> None:
    ttl = patience.scale(10)
    client = fencelock.connect_sync(url)
    key = fresh("withlost")
    with pytest.raises(fencelock.LockLost) as lost:
        with client.lock(key, ttl=ttl) as guard:
            client.force_release(key)
            guard.renew()
    assert lost.value.reason == "refused", (lost.value, str(patience))
    client.close()


def test_a_leader_proclaims_and_observers_see_it(url: str) -> None:
    async def main() -> None:
        ttl = (await Patience.measure_async()).scale(10)
        async with await fencelock.connect(url) as a, await fencelock.connect(url) as b:
            name = fresh("proclaim").replace(":", "-")
            changes = b.election(name).observe()
            leader = await a.election(name).campaign(ttl=ttl, value="a")
            elected = await changes.__anext__()
            assert elected["elected"]["term"] == leader.term
            await leader.proclaim({"addr": "b"})
            current = await b.election(name).leader()
            assert current is not None and current["value"] == {"addr": "b"}
            await leader.resign()
            vacant = await changes.__anext__()
            assert vacant == {"vacant": {"previous_term": leader.term, "expired": False}}
            await changes.aclose()
            with pytest.raises(fencelock.LockLost):
                await leader.proclaim("c")
            plain = await a.acquire(fresh("plain"), ttl=ttl)
            with pytest.raises(fencelock.InvalidInput):
                await plain._native.proclaim('"x"')
            await plain.release()

    asyncio.run(main())


def test_watch_reports_acquisitions_and_releases(url: str) -> None:
    async def main() -> None:
        ttl = (await Patience.measure_async()).scale(10)
        async with await fencelock.connect(url) as a, await fencelock.connect(url) as b:
            key = fresh("watched")
            changes = await b.watch(key)
            guard = await a.acquire(key, ttl=ttl)
            acquired = await changes.__anext__()
            assert acquired["kind"] == "acquired" and acquired["token"] == guard.token
            assert acquired["owner"] == a.owner and acquired["lease"]["key"] == key
            await guard.release()
            released = await changes.__anext__()
            assert released["kind"] == "released" and released["token"] == guard.token
            assert released["lease"] is None
            await changes.aclose()

    asyncio.run(main())


def test_resume_reattaches_to_a_detached_lease(url: str) -> None:
    async def main() -> None:
        ttl = (await Patience.measure_async()).scale(10)
        async with await fencelock.connect(url) as a, await fencelock.connect(url) as b:
            key = fresh("resumed")
            guard = await a.acquire(key, ttl=ttl)
            guard.detach()
            lease = await b.inspect(key)
            assert lease is not None and lease["token"] == guard.token
            with pytest.raises(fencelock.LockLost):
                await b.resume(key, a.owner, guard.token + 1)
            again = await b.resume(key, a.owner, guard.token, ttl=ttl)
            assert again.token == guard.token and again.owner == a.owner
            again.check()
            await again.release()
            assert await b.inspect(key) is None

    asyncio.run(main())


def test_sync_proclaim_watch_observe_and_resume(url: str, patience: Patience) -> None:
    ttl = patience.scale(10)
    a = fencelock.connect_sync(url)
    b = fencelock.connect_sync(url)
    name = fresh("sync-elect").replace(":", "-")
    observed = b.election(name).observe()
    leader = a.election(name).campaign(ttl=ttl)
    assert next(observed)["elected"]["term"] == leader.term
    leader.proclaim([1, 2])
    current = b.election(name).leader()
    assert current is not None and current["value"] == [1, 2]
    leader.resign()
    assert next(observed)["vacant"]["previous_term"] == leader.term

    key = fresh("sync-resume")
    changes = b.watch(key)
    guard = a.acquire(key, ttl=ttl)
    assert next(changes)["token"] == guard.token
    guard.detach()
    again = b.resume(key, a.owner, guard.token, ttl=ttl)
    again.release()
    assert next(changes)["kind"] == "released"
    a.close()
    b.close()
