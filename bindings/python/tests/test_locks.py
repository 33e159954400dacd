"""The contract of the Python package against real servers (SQLite, Redis,
PostgreSQL), and its interplay with the Rust CLI on the same keys.

Time: (b) every TTL that must outlast a test's steps (in the CLI and in the
child processes too), every wait that must be long enough and every bound
is a base figure scaled by the patience measured at the test's start
(tests/patience.py: ``Patience.measure_async()`` in an event loop, the
``patience`` fixture otherwise); a wait that tells a release from an expiry
stays shorter than the TTL, as its base is. "Not done after 0.2 s" and
"not lost within 0.05 s" are lower bounds, left as they are.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import subprocess
import sys
import time
import uuid
from typing import List

import pytest

import fencelock
from patience import Patience
from servers import Server, cli, cli_json


def fresh(name: str) -> str:
    return f"py:{name}:{uuid.uuid4().hex[:8]}"


def test_acquire_try_release_and_the_error_code(url: str) -> None:
    async def main() -> None:
        patience = await Patience.measure_async()
        ttl = patience.scale(30.0)
        a = await fencelock.connect(url)
        b = await fencelock.connect(url)
        key = fresh("contract")
        guard = await a.acquire(key, ttl=ttl, wait=0)
        assert isinstance(guard.token, int) and guard.token > 0
        assert guard.owner == a.owner and guard.key == key and guard.is_valid
        assert guard.expires_at > datetime.datetime.now(datetime.timezone.utc), patience
        with pytest.raises(fencelock.NotAcquired) as refused:
            await b.acquire(key, ttl=datetime.timedelta(seconds=30), wait=0)
        assert refused.value.code == "not_acquired"
        await guard.release()
        again = await b.acquire(key, ttl=ttl, wait=0)
        assert again.token > guard.token and again.owner == b.owner
        await again.release()
        await a.close()
        await b.close()

    asyncio.run(main())


def test_async_with_and_a_waiter_gets_the_lock_after_release(url: str) -> None:
    async def main() -> None:
        patience = await Patience.measure_async()
        async with await fencelock.connect(url) as a, await fencelock.connect(url) as b:
            key = fresh("with")
            async with a.lock(key, ttl=patience.scale(10)) as first:
                waiter = asyncio.ensure_future(b.acquire(key, ttl=10, wait=patience.scale(20)))
                await asyncio.sleep(0.2)
                assert not waiter.done(), patience
            second = await waiter
            assert second.token > first.token
            await second.release()

    asyncio.run(main())


def test_the_sync_api_has_the_same_methods_without_await(url: str, patience: Patience) -> None:
    client = fencelock.connect_sync(url)
    other = fencelock.connect_sync(url)
    key = fresh("sync")
    with client.lock(key, ttl=patience.scale(10)) as guard:
        assert isinstance(guard.token, int)
        with pytest.raises(fencelock.NotAcquired) as refused:
            other.acquire(key, wait=0)
        assert refused.value.code == "not_acquired", patience
        assert client.inspect(key) is not None, patience
        assert guard.lost(timeout=0.05) is None
    token = other.run(key, lambda g: g.token, ttl=10)
    assert token > guard.token
    assert client.inspect(key) is None
    client.close()
    other.close()


@pytest.mark.parametrize("first", ["binding", "cli"])
def test_exclusion_and_growing_tokens_with_the_rust_cli(url: str, first: str) -> None:
    key = fresh("cli")

    def cli_acquire(ttl: str) -> dict:  # type: ignore[type-arg]
        return cli_json(url, "acquire", key, "--ttl", ttl, "--wait", "0s")

    async def main() -> None:
        patience = await Patience.measure_async()
        ttl = patience.scale(30.0)
        client = await fencelock.connect(url)
        tokens: List[int] = []
        for turn in range(2):
            binding_first = (first == "binding") == (turn == 0)
            if binding_first:
                guard = await client.acquire(key, ttl=ttl, wait=0)
                tokens.append(guard.token)
                held = cli(url, "acquire", key, "--ttl", patience.duration(30.0), "--wait", "0s")
                assert held.returncode == 75 and '"held"' in held.stdout, (held, str(patience))
                await guard.release()
            else:
                granted = cli_acquire(patience.duration(30.0))
                tokens.append(granted["token"])
                with pytest.raises(fencelock.NotAcquired):
                    await client.acquire(key, ttl=ttl, wait=0)
                released = cli(
                    url, "release", key, "--owner", granted["owner"], "--token", str(granted["token"])
                )
                assert released.returncode == 0, released
        last = await client.acquire(key, wait=0)
        tokens.append(last.token)
        await client.close()
        assert tokens == sorted(set(tokens)), tokens

    asyncio.run(main())


def test_close_releases_every_lock_and_signals_closed(url: str) -> None:
    async def main() -> None:
        patience = await Patience.measure_async()
        client = await fencelock.connect(url)
        keys = [fresh(f"close{i}") for i in range(3)]
        # Long enough that the next holder gets them by the release, never by expiry.
        guards = [await client.acquire(k, ttl=patience.scale(60)) for k in keys]
        lost = [asyncio.ensure_future(g.lost()) for g in guards]
        await client.close()
        assert await asyncio.gather(*lost) == ["closed"] * 3
        with pytest.raises(fencelock.ClientClosed) as closed:
            await client.acquire(fresh("after"))
        assert closed.value.code == "unavailable"
        other = await fencelock.connect(url)
        for key, guard in zip(keys, guards):
            taken = await other.acquire(key, wait=0)
            assert taken.token > guard.token, patience
        await guards[0].release()  # after close: nothing left to do
        await other.close()

    asyncio.run(main())


CHILD = """
import asyncio, os, sys, fencelock
async def main():
    client = await fencelock.connect(sys.argv[1])
    guard = await client.acquire(sys.argv[2], ttl=float(sys.argv[3]))
    print(guard.token, flush=True)
    os._exit(0)
asyncio.run(main())
"""


def test_a_process_that_exits_without_releasing_leaves_a_lease_that_expires(url: str, patience: Patience) -> None:
    # Outlasts the child's exit and the look below.
    key, ttl = fresh("exit"), patience.scale(2.0)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, url, key, str(ttl)], capture_output=True, text=True, timeout=patience.scale(60)
    )
    assert child.returncode == 0, child.stderr
    token = int(child.stdout)
    client = fencelock.connect_sync(url)
    with pytest.raises(fencelock.NotAcquired):
        client.acquire(key, wait=0)
    guard = client.acquire(key, wait=ttl * 3)
    assert guard.token > token
    client.close()


NORMAL_EXIT = """
import asyncio, sys, fencelock
async def main():
    client = await fencelock.connect(sys.argv[1])
    guard = await client.acquire(sys.argv[2], ttl=float(sys.argv[3]))
    print(guard.token, flush=True)
asyncio.run(main())
"""

SYNC_EXIT = """
import sys, fencelock
client = fencelock.connect_sync(sys.argv[1])
guard = client.acquire(sys.argv[2], ttl=float(sys.argv[3]))
print(guard.token, flush=True)
sys.exit(0)
"""


@pytest.mark.parametrize("script", [NORMAL_EXIT, SYNC_EXIT], ids=["asyncio", "sync"])
def test_a_normal_exit_releases_what_is_still_held(url: str, script: str, patience: Patience) -> None:
    # As in Node.js: a process that ends normally without close() releases
    # its leases; the next holder does not wait for the 60 s TTL.
    key, ttl = fresh("normal-exit"), patience.scale(60.0)
    child = subprocess.run(
        [sys.executable, "-c", script, url, key, str(ttl)], capture_output=True, text=True, timeout=patience.scale(60)
    )
    assert child.returncode == 0, child.stderr
    token = int(child.stdout)
    client = fencelock.connect_sync(url)
    assert client.inspect(key) is None, f"the lease outlived the process [{patience}]"
    guard = client.acquire(key, wait=0)
    assert guard.token > token
    client.close()


def test_a_released_guard_is_no_longer_valid(url: str) -> None:
    async def main() -> None:
        client = await fencelock.connect(url)
        guard = await client.acquire(fresh("released"), ttl=30.0)
        assert guard.is_valid
        await guard.release()
        assert not guard.is_valid
        assert guard.remaining == 0
        assert guard.loss_reason is None
        with pytest.raises(fencelock.LockLost) as checked:
            guard.check()
        with pytest.raises(fencelock.LockLost) as renewed:
            await guard.renew()
        for e in (checked.value, renewed.value):
            assert e.code == "not_held"
            assert e.reason is None
            assert "released" in str(e) and "lost" not in str(e), str(e)
        await client.close()

    asyncio.run(main())


def test_a_collected_guard_stops_renewing_and_is_released_in_the_background(url: str) -> None:
    async def main() -> None:
        patience = await Patience.measure_async()
        client = await fencelock.connect(url)
        other = await fencelock.connect(url)
        key = fresh("gc")
        guard = await client.acquire(key, ttl=patience.scale(30))
        token = guard.token
        del guard
        gc.collect()
        # Long before the 30 s lease could end: only a release frees it.
        start = time.monotonic()
        bound = patience.scale(10)
        taken = await other.acquire(key, wait=bound)
        assert time.monotonic() - start < bound, patience
        assert taken.token > token
        await taken.release()
        await client.close()
        await other.close()

    asyncio.run(main())


def test_bad_input_is_a_typed_error(url: str) -> None:
    async def main() -> None:
        client = await fencelock.connect(url)
        cases = [
            (client.acquire(""), "invalid_key"),
            (client.acquire("k", ttl=0), "invalid_ttl"),
            (client.acquire("k", ttl=-1.0), "invalid_ttl"),
            (client.acquire("k", wait=-1.0), "bad_request"),
            (client.acquire("k" * 10_000), "invalid_key"),
            (client.acquire("k", owner=""), "invalid_owner"),
            (client.acquire("k", data={1, 2}), "bad_request"),
        ]
        for awaitable, code in cases:
            with pytest.raises(fencelock.InvalidInput) as bad:
                await awaitable
            assert bad.value.code == code, bad.value
            assert len(str(bad.value)) < 300, str(bad.value)[:300]
        with pytest.raises(fencelock.InvalidInput) as bad:
            await client.acquire("k", ttl="30s")  # type: ignore[arg-type]
        assert bad.value.code == "invalid_ttl"
        await client.close()
        with pytest.raises(fencelock.InvalidInput):
            fencelock.connect_sync(url).acquire("", wait=0)

    asyncio.run(main())


@pytest.mark.parametrize(
    "bad_url",
    ["", "not a url", "nosuch://x", "sqlite:locks.db", "redis://[::1", "postgres://"],
)
def test_bad_urls_are_invalid_input(bad_url: str) -> None:
    with pytest.raises((fencelock.InvalidInput, fencelock.Unsupported)) as bad:
        asyncio.run(fencelock.connect(bad_url))
    assert bad.value.code in ("bad_request", "unsupported"), bad.value


@pytest.mark.parametrize(
    "unreachable",
    ["redis://127.0.0.1:1", "postgres://fencelock@127.0.0.1:1/db", "http://127.0.0.1:1"],
)
def test_an_unreachable_host_is_unavailable_not_a_hang(unreachable: str, patience: Patience) -> None:
    async def main() -> None:
        client = await fencelock.connect(unreachable, op_timeout=5)
        await client.acquire("k", wait=1)

    # Far beyond the wait (1 s) and the operation timeout (5 s), far short of a hang.
    bound = patience.scale(60)
    start = time.monotonic()
    with pytest.raises(fencelock.Unavailable) as failed:
        asyncio.run(asyncio.wait_for(main(), bound))
    assert failed.value.code == "unavailable", failed.value
    took = time.monotonic() - start
    assert took < bound, (took, str(patience))
