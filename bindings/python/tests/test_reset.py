"""``Fence.reset``: the operator's repair of a fence, on every engine the
bindings are tested on (SQLite, Redis, PostgreSQL), through the asyncio and
the synchronous API, and through ``fencelock serve`` (``http://`` fences,
the fenced key-value store)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Iterator

import pytest

import fencelock
from servers import ADMIN_TOKEN, CLIENT_TOKEN, Service


def fresh(name: str) -> str:
    return f"py:{name}:{uuid.uuid4().hex[:8]}"


def issued(url: str, key: str, n: int) -> list[int]:
    """Takes ``key`` ``n`` times on the engine of ``url`` and returns the
    tokens it issued, lowest first: ``fencelock serve``'s fenced store shares
    that engine and refuses tokens it never issued."""
    client = fencelock.connect_sync(url)
    try:
        tokens: list[int] = []
        for _ in range(n):
            with client.lock(key, ttl=10) as guard:
                tokens.append(guard.token)
        return tokens
    finally:
        client.close()


@pytest.fixture
def service(url: str) -> Iterator[Service]:
    """``fencelock serve`` over the engine of ``url``: its fence is that
    engine's fence, the one ``open_fence(url)`` opens."""
    started = Service(url)
    yield started
    started.stop()


def test_reset_forgets_the_tokens_and_a_lower_token_is_admitted_again(url: str) -> None:
    async def main() -> None:
        fence = await fencelock.open_fence(url)
        resource = fresh("reset")
        assert await fence.reset(resource) is None, "nothing admitted: nothing to forget"
        await fence.admit(resource, 5)
        await fence.admit(resource, 9)
        with pytest.raises(fencelock.Stale):
            await fence.admit(resource, 6)

        assert await fence.reset(resource) == 9
        assert await fence.highest(resource) is None
        await fence.admit(resource, 6)  # below the forgotten 9: admitted again
        assert await fence.highest(resource) == 6
        with pytest.raises(fencelock.Stale):
            await fence.admit(resource, 4)
        assert await fence.reset(resource) == 6
        assert await fence.reset(resource) is None

        # A reader's token is forgotten too, and answered when it is the highest.
        shared = fresh("reset-rw")
        await fence.admit_shared(shared, 3, "exclusive")
        await fence.admit_shared(shared, 8, "shared")
        assert await fence.reset(shared) == 8
        await fence.admit_shared(shared, 2, "exclusive")
        assert await fence.highest(shared) == 2

    asyncio.run(main())


def test_the_sync_fence_resets_too(url: str) -> None:
    fence = fencelock.open_fence_sync(url)
    resource = fresh("reset-sync")
    assert fence.reset(resource) is None
    fence.admit(resource, 12)
    with pytest.raises(fencelock.Stale):
        fence.admit(resource, 11)
    assert fence.reset(resource) == 12
    fence.admit(resource, 11)
    assert fence.highest(resource) == 11
    assert fence.reset(resource) == 11
    assert fence.reset(resource) is None


def test_reset_forgets_the_value_stored_with_the_token(url: str, service: Service) -> None:
    """A value written through the service's fenced store is forgotten with
    its token by the reset of the engine's own fence, then by the admin's
    reset through an ``http://`` fence; a client token is refused."""
    key = fresh("kv-reset")
    path = f"/v1/kv/{key}"
    low, high = issued(url, key, 2)
    assert service.request("PUT", path, CLIENT_TOKEN, {"token": high, "value": {"v": 1}})[0] == 200
    status, stored = service.request("GET", path, CLIENT_TOKEN)
    assert (status, stored["token"], stored["value"]) == (200, high, {"v": 1})

    direct = fencelock.open_fence_sync(url)
    assert direct.highest(key) == high
    assert direct.reset(key) == high
    status, missing = service.request("GET", path, CLIENT_TOKEN)
    assert (status, missing["code"]) == (404, "not_found"), missing
    # The lower token writes again, and stores its value.
    assert service.request("PUT", path, CLIENT_TOKEN, {"token": low, "value": "again"})[0] == 200
    assert service.request("GET", path, CLIENT_TOKEN)[1]["value"] == "again"

    async def through_the_service() -> None:
        client = await fencelock.open_fence(service.fence_url(CLIENT_TOKEN))
        # A client token on the admin's route: the service's 403.
        with pytest.raises(fencelock.Unauthorized) as refused:
            await client.reset(key)
        assert "403 Forbidden" in str(refused.value), refused.value
        assert await client.highest(key) == low, "a refused reset forgets nothing"

        admin = await fencelock.open_fence(service.fence_url(ADMIN_TOKEN))
        assert await admin.reset(key) == low
        assert await admin.reset(key) is None
        assert await admin.reset(fresh("never-written")) is None

    asyncio.run(through_the_service())
    assert service.request("GET", path, CLIENT_TOKEN)[0] == 404
    assert direct.highest(key) is None
    direct.admit(key, 1)
