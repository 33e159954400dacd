"""The synchronous API for scripts and cron jobs: ``fencelock.connect_sync(url)``.

The same methods as the asyncio client, without ``await``. Renewal does not
need the calling thread: it runs on the Rust runtime's own threads, so a
script busy between calls keeps its locks. Blocking calls release the GIL.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, TypeVar

from . import _native
from ._errors import FencelockError
from ._common import ClientBase, GuardBase, MultiLockBase, PermitBase
from ._common import Duration, JsonValue, acquire_args, closed, dumps, lock_args, seconds

T = TypeVar("T")


class SyncGuard(GuardBase):
    """A held lock (synchronous API); ``with`` releases it on exit."""

    __slots__ = ()

    def lost(self, timeout: Optional[Duration] = None) -> Optional[str]:
        """Blocks until the lock is lost, with the reason, or until
        ``timeout`` seconds have passed (then ``None``)."""
        reason: Optional[str] = self._native.lost(seconds("timeout", timeout))
        return reason

    def renew(self) -> None:
        """Renews now, besides the background renewal."""
        self._native.renew()

    def release(self) -> None:
        """Stops renewal and releases the lease (later calls do nothing)."""
        self._native.release()

    def __enter__(self) -> SyncGuard:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # A failure of the release must not hide the body's own exception.
        if exc_type is None:
            self.release()
        else:
            with contextlib.suppress(FencelockError):
                self.release()


class SyncPermit(SyncGuard, PermitBase):
    """One permit of a counting semaphore."""

    __slots__ = ()


class SyncLeadership(SyncGuard):
    """The leader's lock of an election; its token is the term."""

    __slots__ = ()

    @property
    def term(self) -> int:
        """The term: greater than every earlier leader's."""
        return self.token

    def resign(self) -> None:
        """Steps down now."""
        self.release()

    def proclaim(self, value: JsonValue) -> None:
        """Publishes ``value`` as the leader's value; raises :class:`LockLost`
        once no longer leader."""
        self._native.proclaim(dumps("value", value) or "null")


class SyncMultiLock(MultiLockBase):
    """Locks on several keys, taken all or none."""

    __slots__ = ()

    def release(self) -> None:
        """Releases every lease (later calls do nothing)."""
        self._native.release()

    def __enter__(self) -> SyncMultiLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class SyncElection:
    """Leader election ``name`` (synchronous API)."""

    __slots__ = ("_client", "name")

    def __init__(self, client: SyncClient, name: str) -> None:
        self._client = client
        self.name = name

    def campaign(
        self, *, ttl: Optional[Duration] = None, wait: Optional[Duration] = None, value: JsonValue = None
    ) -> SyncLeadership:
        """Waits to be elected (at most ``wait`` seconds when given)."""
        native = self._client._native.campaign(
            self.name, ttl=seconds("ttl", ttl), wait=seconds("wait", wait), value=dumps("value", value)
        )
        return SyncLeadership(native)

    def leader(self) -> Optional[Dict[str, Any]]:
        """The current leader, or ``None``."""
        leader: Optional[Dict[str, Any]] = self._client._native.leader(self.name)
        return leader

    def observe(self) -> Iterator[Dict[str, Any]]:
        """The current leader (first) and every change of leader from now
        on, as :meth:`Election.observe` gives them; each ``next`` blocks."""
        return _changes(self._client._native.observe(self.name))


def _changes(watch: Any) -> Iterator[Dict[str, Any]]:
    """A native watch's changes until it ends (``next()`` gives ``None``)."""
    while True:
        change: Optional[Dict[str, Any]] = watch.next()
        if change is None:
            return
        yield change


class SyncClient(ClientBase):
    """A lock client of one backend (synchronous API); ``with`` closes it."""

    __slots__ = ()

    def acquire(
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
    ) -> SyncGuard:
        """Acquires ``key``, waiting up to ``wait`` seconds (0: one try);
        raises :class:`NotAcquired` when another holds it until then."""
        native = self._native.acquire(
            key, **acquire_args(ttl, wait, owner, kind, data, min_token, renew_every, hold_at_least, shared)
        )
        return SyncGuard(native)

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
    ) -> SyncGuard:
        """``with client.lock(key) as guard:``: the guard, released on exit."""
        return self.acquire(key, ttl=ttl, wait=wait, owner=owner, kind=kind, data=data, shared=shared)

    def run(
        self,
        key: str,
        fn: Callable[[SyncGuard], T],
        *,
        ttl: Optional[Duration] = None,
        wait: Duration = 0,
        kind: Optional[str] = None,
        data: JsonValue = None,
    ) -> T:
        """Runs ``fn(guard)`` under the lock and releases it after. Python
        cannot interrupt a running function: ``fn`` should ``guard.check()``
        before each critical write; :class:`LockLost` is raised after ``fn``
        returns if the lock was lost meanwhile."""
        with self.acquire(key, ttl=ttl, wait=wait, kind=kind, data=data) as guard:
            result = fn(guard)
            guard.check()
            return result

    def lock_all(
        self,
        keys: Iterable[str],
        *,
        ttl: Optional[Duration] = None,
        wait: Duration = 0,
        kind: Optional[str] = None,
        data: JsonValue = None,
        renew_every: Optional[Duration] = None,
    ) -> SyncMultiLock:
        """Locks every key, all or none."""
        return SyncMultiLock(self._native.acquire_all(list(keys), **lock_args(ttl, wait, kind, data, renew_every)))

    def semaphore(
        self,
        name: str,
        permits: int,
        *,
        ttl: Optional[Duration] = None,
        wait: Duration = 0,
        kind: Optional[str] = None,
        data: JsonValue = None,
        renew_every: Optional[Duration] = None,
    ) -> SyncPermit:
        """Takes one of ``permits`` permits of semaphore ``name``."""
        native, slot = self._native.acquire_permit(name, permits, **lock_args(ttl, wait, kind, data, renew_every))
        return SyncPermit(native, name, slot, permits)

    def resume(
        self,
        key: str,
        owner: str,
        token: int,
        *,
        ttl: Optional[Duration] = None,
        renew_every: Optional[Duration] = None,
    ) -> SyncGuard:
        """Re-attaches to a lease a guard detached, as :meth:`Client.resume`."""
        native = self._native.resume(
            key, owner, token, ttl=seconds("ttl", ttl), renew_every=seconds("renew_every", renew_every)
        )
        return SyncGuard(native)

    def watch(self, key: str) -> Iterator[Dict[str, Any]]:
        """The holder changes of ``key`` from now on, as :meth:`Client.watch`
        gives them; each ``next`` blocks."""
        return _changes(self._native.watch(key))

    def election(self, name: str) -> SyncElection:
        """Leader election ``name``."""
        return SyncElection(self, name)

    def inspect(self, key: str) -> Optional[Dict[str, Any]]:
        """The current lease on ``key`` (a dict), or ``None``."""
        lease: Optional[Dict[str, Any]] = self._native.inspect(key)
        return lease

    def holders(self, key: str) -> List[Dict[str, Any]]:
        """Every unexpired lease on exactly ``key``."""
        leases: List[Dict[str, Any]] = self._native.holders(key)
        return leases

    def list(self, prefix: Optional[str] = None) -> List[Dict[str, Any]]:
        """The current leases whose key starts with ``prefix``."""
        leases: List[Dict[str, Any]] = self._native.list(prefix)
        return leases

    def stats(self) -> Dict[str, Any]:
        """Operator statistics of the backend."""
        stats: Dict[str, Any] = self._native.stats()
        return stats

    def force_release(self, key: str) -> Optional[Dict[str, Any]]:
        """Removes whatever lease ``key`` has."""
        lease: Optional[Dict[str, Any]] = self._native.force_release(key)
        return lease

    def cleanup(self) -> int:
        """Deletes expired lease records; how many."""
        removed: int = self._native.cleanup()
        return removed

    def validate(self, key: str, token: int) -> bool:
        """Whether ``token`` is still the live lease on ``key``."""
        live: bool = self._native.validate(key, token)
        return live

    def close(self) -> None:
        """Releases every lock this client holds and refuses new ones."""
        closed(self._native)
        self._native.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncFence:
    """The fence a protected resource keeps (synchronous API)."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.Fence) -> None:
        self._native = native

    def admit(self, resource: str, token: int) -> None:
        """Admits ``token`` for ``resource`` or raises :class:`Stale`."""
        self._native.admit(resource, token)

    def admit_shared(self, resource: str, token: int, mode: str) -> None:
        """Admits a token of a read-write lock held in ``mode``."""
        self._native.admit_shared(resource, token, mode)

    def highest(self, resource: str) -> Optional[int]:
        """The highest token admitted for ``resource``, or ``None``."""
        highest: Optional[int] = self._native.highest(resource)
        return highest

    def reset(self, resource: str) -> Optional[int]:
        """Forgets ``resource``'s fence, so that a lower token is admitted
        again; the highest token it had admitted, or ``None``. The operator's
        repair of a blocked fence, never a step of a holder's protocol, as
        :meth:`Fence.reset` details; an ``http://`` fence needs the service's
        admin token."""
        had: Optional[int] = self._native.reset(resource)
        return had


def connect_sync(
    url: str,
    *,
    owner: Optional[str] = None,
    ttl: Optional[Duration] = None,
    op_timeout: Optional[Duration] = None,
) -> SyncClient:
    """Opens the backend ``url`` names, for synchronous code."""
    native = _native.connect(
        url, owner=owner, ttl=seconds("ttl", ttl), op_timeout=seconds("op_timeout", op_timeout), blocking=True
    )
    return SyncClient(native)


def open_fence_sync(url: str) -> SyncFence:
    """Opens the fence kept by the backend ``url`` names, for synchronous code."""
    return SyncFence(_native.open_fence(url, blocking=True))


