"""The asyncio API: ``await fencelock.connect(url)``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Generator,
    Iterable,
    List,
    Optional,
    Tuple,
    TypeVar,
)

from . import _native
from ._errors import FencelockError
from ._common import ClientBase, GuardBase, MultiLockBase, PermitBase
from ._common import Duration, JsonValue, acquire_args, closed, dumps, lock_args, seconds

T = TypeVar("T")


class Guard(GuardBase):
    """A held lock, renewed in the background by the client until released.

    ``async with`` releases it on exit. A guard collected without a release
    stops renewing and is released in the background (docs/python.md).
    """

    __slots__ = ()

    async def lost(self) -> str:
        """Completes when the lock is lost, before its lease ends on the
        backend, with the reason (``refused``, ``deadline``, ``closed``).
        Never completes for a lock that is released normally."""
        reason: Optional[str] = await self._native.lost()
        return reason or "deadline"

    async def renew(self) -> None:
        """Renews now, besides the background renewal."""
        await self._native.renew()

    async def release(self) -> None:
        """Stops renewal and releases the lease (later calls do nothing).
        Raises :class:`LockLost` when the backend no longer had it."""
        await self._native.release()

    async def __aenter__(self) -> Guard:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        # A failure of the release must not hide the body's own exception
        # (a LockLost, typically, whose lease the release then cannot find).
        if exc_type is None:
            await self.release()
        else:
            with contextlib.suppress(FencelockError):
                await self.release()


class Permit(Guard, PermitBase):
    """One permit of a counting semaphore: a guard on one of its slots."""

    __slots__ = ()


class Leadership(Guard):
    """The leader's lock of an election; its token is the term."""

    __slots__ = ()

    @property
    def term(self) -> int:
        """The term: greater than every earlier leader's; fence with it."""
        return self.token

    async def resign(self) -> None:
        """Steps down now, so that a standby is elected at once."""
        await self.release()

    async def proclaim(self, value: JsonValue) -> None:
        """Publishes ``value`` as the leader's value; raises :class:`LockLost`
        once no longer leader."""
        await self._native.proclaim(dumps("value", value) or "null")


async def _supervise(guard: Guard, fn: Callable[[Any], Awaitable[T]]) -> T:
    """Runs ``fn(guard)`` as a task cancelled when the lock is lost, then
    raises the guard's :class:`LockLost`. The core's loss signal decides;
    this only maps it onto asyncio cancellation."""
    work = asyncio.ensure_future(fn(guard))
    lost = asyncio.ensure_future(guard.lost())
    try:
        await asyncio.wait((work, lost), return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost.cancel()
        if not work.done():
            work.cancel()
            try:
                await work
            except asyncio.CancelledError:
                pass
    guard.check()
    return work.result()


class _Acquisition(Awaitable[Guard]):
    """``await client.lock(key)`` or ``async with client.lock(key) as guard``."""

    __slots__ = ("_acquire", "_guard")

    def __init__(self, acquire: Callable[[], Awaitable[Guard]]) -> None:
        self._acquire = acquire
        self._guard: Optional[Guard] = None

    def __await__(self) -> Generator[Any, None, Guard]:
        return self._acquire().__await__()

    async def __aenter__(self) -> Guard:
        self._guard = await self._acquire()
        return self._guard

    async def __aexit__(self, *exc: object) -> None:
        if self._guard is not None:
            await self._guard.__aexit__(*exc)


class MultiLock(MultiLockBase):
    """Locks on several keys, taken all or none (``client.lock_all``)."""

    __slots__ = ()

    async def lost(self) -> Tuple[str, str]:
        """Completes with ``(key, reason)`` when the first lock is lost."""
        lost: Tuple[str, str] = await self._native.lost()
        return lost

    async def release(self) -> None:
        """Releases every lease (later calls do nothing)."""
        await self._native.release()

    async def __aenter__(self) -> MultiLock:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class RwLock:
    """The read-write lock on a key: ``read()`` shares it with other readers,
    ``write()`` is the ordinary exclusive lock."""

    __slots__ = ("_client", "_key")

    def __init__(self, client: Client, key: str) -> None:
        self._client = client
        self._key = key

    def read(self, *, ttl: Optional[Duration] = None, wait: Duration = 0) -> _Acquisition:
        """A reader's lock (``await`` it or ``async with`` it)."""
        return self._client.lock(self._key, ttl=ttl, wait=wait, shared=True)

    def write(self, *, ttl: Optional[Duration] = None, wait: Duration = 0) -> _Acquisition:
        """The writer's lock (``await`` it or ``async with`` it)."""
        return self._client.lock(self._key, ttl=ttl, wait=wait)


class Election:
    """Leader election ``name``: the leader holds its lock; the term is the token."""

    __slots__ = ("_client", "name")

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = name

    async def campaign(
        self,
        *,
        ttl: Optional[Duration] = None,
        wait: Optional[Duration] = None,
        value: JsonValue = None,
    ) -> Leadership:
        """Waits to be elected (at most ``wait`` seconds when given)."""
        native = await self._client._native.campaign(
            self.name, ttl=seconds("ttl", ttl), wait=seconds("wait", wait), value=dumps("value", value)
        )
        return Leadership(native)

    async def run(
        self,
        fn: Callable[[Leadership], Awaitable[T]],
        *,
        ttl: Optional[Duration] = None,
        value: JsonValue = None,
    ) -> T:
        """Campaigns, then runs ``fn(leadership)`` while leader: the task is
        cancelled and :class:`LockLost` raised when leadership is lost;
        resigns when ``fn`` returns."""
        leadership = await self.campaign(ttl=ttl, value=value)
        try:
            return await _supervise(leadership, fn)
        finally:
            leadership._native.discard()

    async def leader(self) -> Optional[Dict[str, Any]]:
        """The current leader (``owner``, ``value``, ``term``, ``expires_in_ms``), or ``None``."""
        leader: Optional[Dict[str, Any]] = await self._client._native.leader(self.name)
        return leader

    async def observe(self) -> AsyncIterator[Dict[str, Any]]:
        """The current leader (first) and every change of leader from now
        on: ``{"elected": leader}`` or ``{"vacant": {"previous_term": …,
        "expired": …}}``."""
        async for change in _changes(await self._client._native.observe(self.name)):
            yield change


async def _changes(watch: Any) -> AsyncIterator[Dict[str, Any]]:
    """A native watch's changes until it ends (``next()`` gives ``None``);
    closing the iterator drops the watch, which stops it."""
    while True:
        change: Optional[Dict[str, Any]] = await watch.next()
        if change is None:
            return
        yield change


class Client(ClientBase):
    """A lock client of one backend; one renewer serves all its locks.

    ``async with`` closes it on exit.
    """

    __slots__ = ()

    async def acquire(
        self,
        key: str,
        *,
        ttl: Optional[Duration] = None,
        wait: Duration = 0,
        owner: Optional[str] = None,
        kind: Optional[str] = None,
        data: JsonValue = None,
        min_token: Optional[int] = None,
        renew_every: Optional[Duration] = None,
        hold_at_least: Optional[Duration] = None,
        shared: bool = False,
    ) -> Guard:
        """Acquires ``key``, waiting up to ``wait`` seconds (0: one try).

        Raises :class:`NotAcquired` when another holds it until then.
        ``ttl`` is the lease length (the client's default, 30 s, when
        omitted); the lease is renewed every ``renew_every`` (a third of
        the TTL) until released.
        """
        native = await self._native.acquire(
            key, **acquire_args(ttl, wait, owner, kind, data, min_token, renew_every, hold_at_least, shared)
        )
        return Guard(native)

    def lock(
        self,
        key: str,
        *,
        ttl: Optional[Duration] = None,
        wait: Duration = 0,
        owner: Optional[str] = None,
        kind: Optional[str] = None,
        data: JsonValue = None,
        shared: bool = False,
    ) -> _Acquisition:
        """``async with client.lock(key) as guard:`` (released on exit), or
        ``await client.lock(key)`` for the guard."""
        return _Acquisition(
            lambda: self.acquire(key, ttl=ttl, wait=wait, owner=owner, kind=kind, data=data, shared=shared)
        )

    async def run(
        self,
        key: str,
        fn: Callable[[Guard], Awaitable[T]],
        *,
        ttl: Optional[Duration] = None,
        wait: Duration = 0,
        kind: Optional[str] = None,
        data: JsonValue = None,
    ) -> T:
        """Runs ``fn(guard)`` under the lock and releases it after.

        When the lock is lost first, ``fn``'s task is cancelled and
        :class:`LockLost` is raised (the lease is then released in the
        background).
        """
        guard = await self.acquire(key, ttl=ttl, wait=wait, kind=kind, data=data)
        try:
            result = await _supervise(guard, fn)
        except BaseException:
            guard._native.discard()
            raise
        await guard.release()
        return result

    async def resume(
        self,
        key: str,
        owner: str,
        token: int,
        *,
        ttl: Optional[Duration] = None,
        renew_every: Optional[Duration] = None,
    ) -> Guard:
        """Re-attaches to the lease of ``owner`` on ``key`` granted with
        ``token`` (one that :meth:`Guard.detach` left, in this process or
        another): a guard renewed by this client, once the backend confirmed
        the lease is still current (:class:`LockLost` otherwise)."""
        native = await self._native.resume(
            key, owner, token, ttl=seconds("ttl", ttl), renew_every=seconds("renew_every", renew_every)
        )
        return Guard(native)

    async def watch(self, key: str) -> AsyncIterator[Dict[str, Any]]:
        """The holder changes of ``key`` from now on: dicts with ``kind``
        (``acquired``, ``released``, ``expired``), ``key``, ``owner``,
        ``token`` and, for ``acquired``, ``lease``. Backends without a
        native watch are polled (docs/python.md). Every change after the
        ``await`` is reported: ``async for change in await client.watch(key)``."""
        return _changes(await self._native.watch(key))

    def rwlock(self, key: str) -> RwLock:
        """The read-write lock on ``key``."""
        return RwLock(self, key)

    async def lock_all(
        self,
        keys: Iterable[str],
        *,
        ttl: Optional[Duration] = None,
        wait: Duration = 0,
        kind: Optional[str] = None,
        data: JsonValue = None,
        renew_every: Optional[Duration] = None,
    ) -> MultiLock:
        """Locks every key, all or none (no deadlock whatever the order)."""
        native = await self._native.acquire_all(list(keys), **lock_args(ttl, wait, kind, data, renew_every))
        return MultiLock(native)

    async def semaphore(
        self,
        name: str,
        permits: int,
        *,
        ttl: Optional[Duration] = None,
        wait: Duration = 0,
        kind: Optional[str] = None,
        data: JsonValue = None,
        renew_every: Optional[Duration] = None,
    ) -> Permit:
        """Takes one of ``permits`` permits of semaphore ``name``."""
        native, slot = await self._native.acquire_permit(
            name, permits, **lock_args(ttl, wait, kind, data, renew_every)
        )
        return Permit(native, name, slot, permits)

    async def permit_holders(self, name: str, permits: int) -> List[Dict[str, Any]]:
        """The holders of semaphore ``name``: ``{"slot": …, "lease": {…}}``."""
        holders: List[Dict[str, Any]] = await self._native.permit_holders(name, permits)
        return holders

    def election(self, name: str) -> Election:
        """Leader election ``name`` on this client's backend."""
        return Election(self, name)

    async def inspect(self, key: str) -> Optional[Dict[str, Any]]:
        """The current lease on ``key`` (a dict), or ``None``."""
        lease: Optional[Dict[str, Any]] = await self._native.inspect(key)
        return lease

    async def holders(self, key: str) -> List[Dict[str, Any]]:
        """Every unexpired lease on exactly ``key``."""
        leases: List[Dict[str, Any]] = await self._native.holders(key)
        return leases

    async def list(self, prefix: Optional[str] = None) -> List[Dict[str, Any]]:
        """The current leases whose key starts with ``prefix``."""
        leases: List[Dict[str, Any]] = await self._native.list(prefix)
        return leases

    async def stats(self) -> Dict[str, Any]:
        """Operator statistics of the backend."""
        stats: Dict[str, Any] = await self._native.stats()
        return stats

    async def force_release(self, key: str) -> Optional[Dict[str, Any]]:
        """Removes whatever lease ``key`` has; the removed lease, or ``None``."""
        lease: Optional[Dict[str, Any]] = await self._native.force_release(key)
        return lease

    async def cleanup(self) -> int:
        """Deletes expired lease records; how many."""
        removed: int = await self._native.cleanup()
        return removed

    async def validate(self, key: str, token: int) -> bool:
        """Whether ``token`` is still the live lease on ``key``."""
        live: bool = await self._native.validate(key, token)
        return live

    async def close(self) -> None:
        """Releases every lock this client holds (each guard reports the loss
        as ``closed``) and refuses new ones: a service's graceful shutdown."""
        closed(self._native)
        await self._native.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Fence:
    """The fence a protected resource keeps: it admits only tokens at least
    as high as any it has admitted."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.Fence) -> None:
        self._native = native

    async def admit(self, resource: str, token: int) -> None:
        """Admits ``token`` for ``resource`` or raises :class:`Stale`."""
        await self._native.admit(resource, token)

    async def admit_shared(self, resource: str, token: int, mode: str) -> None:
        """Admits a token of a read-write lock held in ``mode`` (a guard's ``mode``)."""
        await self._native.admit_shared(resource, token, mode)

    async def highest(self, resource: str) -> Optional[int]:
        """The highest token admitted for ``resource``, or ``None``."""
        highest: Optional[int] = await self._native.highest(resource)
        return highest

    async def reset(self, resource: str) -> Optional[int]:
        """Forgets ``resource``'s fence: its highest tokens and the value
        stored with them, so that the next admission starts from nothing and
        a lower token is admitted again. Returns the highest token it had
        admitted (in either mode), or ``None`` if none.

        The operator's repair of a fence that a token no grant issued has
        blocked, never a step of a holder's protocol. One atomic step of the
        fence's store: an admission racing with it lands wholly before it
        (and is forgotten) or wholly after. On an ``http://`` fence it needs
        the service's admin token: with a client token the service refuses
        it (``403``)."""
        had: Optional[int] = await self._native.reset(resource)
        return had


async def connect(
    url: str,
    *,
    owner: Optional[str] = None,
    ttl: Optional[Duration] = None,
    op_timeout: Optional[Duration] = None,
) -> Client:
    """Opens the backend ``url`` names (every URL the CLI accepts:
    ``sqlite://``, ``postgres://``, ``mysql://``, ``redis://``,
    ``redis+cluster://``, ``redlock://``, ``etcd://``, ``zk://``,
    ``sharded://``, ``http://``).

    ``owner`` names this client's locks (generated when omitted), ``ttl``
    is the default lease length, ``op_timeout`` bounds each backend call.
    """
    native = await _native.connect(
        url, owner=owner, ttl=seconds("ttl", ttl), op_timeout=seconds("op_timeout", op_timeout)
    )
    return Client(native)


async def open_fence(url: str) -> Fence:
    """Opens the fence kept by the backend ``url`` names."""
    return Fence(await _native.open_fence(url))
