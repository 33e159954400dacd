"""What the async and the sync API share: argument conversion, the
read-only side of held locks and the client's lifetime."""

from __future__ import annotations

import atexit
import datetime
import json
import weakref
from typing import Any, Dict, Optional, Union

from . import _native
from ._errors import InvalidInput

#: Seconds as a number, or a ``datetime.timedelta``.
Duration = Union[float, int, datetime.timedelta]

#: Lock data: anything ``json.dumps`` accepts (at most 64 KiB serialized).
JsonValue = Any


def seconds(name: str, value: Optional[Duration]) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(
            f"{name} must be seconds (a number) or a datetime.timedelta, not {value!r}",
            "invalid_ttl" if name == "ttl" else "bad_request",
        )
    return float(value)


def dumps(name: str, value: JsonValue) -> Optional[str]:
    if value is None:
        return None
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"{name} must be JSON-serializable: {e}") from e


def lock_args(
    ttl: Optional[Duration],
    wait: Duration,
    kind: Optional[str],
    data: JsonValue,
    renew_every: Optional[Duration],
) -> Dict[str, Any]:
    return {
        "ttl": seconds("ttl", ttl),
        "wait": seconds("wait", wait),
        "kind": kind,
        "data": dumps("data", data),
        "renew_every": seconds("renew_every", renew_every),
    }


def acquire_args(
    ttl: Optional[Duration],
    wait: Duration,
    owner: Optional[str],
    kind: Optional[str],
    data: JsonValue,
    min_token: Optional[int],
    renew_every: Optional[Duration],
    hold_at_least: Optional[Duration],
    shared: bool,
) -> Dict[str, Any]:
    return {
        "owner": owner,
        "min_token": min_token,
        "hold_at_least": seconds("hold_at_least", hold_at_least),
        "shared": shared,
        **lock_args(ttl, wait, kind, data, renew_every),
    }


class GuardBase:
    """The read-only side of a held lock."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.Guard) -> None:
        self._native = native

    @property
    def key(self) -> str:
        """The lock's key."""
        return self._native.key

    @property
    def owner(self) -> str:
        """The owner the lock is held as."""
        return self._native.owner

    @property
    def token(self) -> int:
        """The grant's fencing token: present it with every protected write."""
        return self._native.token

    @property
    def mode(self) -> str:
        """``exclusive``, or ``shared`` for a reader of a read-write lock."""
        return self._native.mode

    @property
    def ttl(self) -> float:
        """The requested lease length, in seconds."""
        return self._native.ttl

    @property
    def expires_at(self) -> datetime.datetime:
        """The lease's end as the backend last reported it (for display)."""
        return datetime.datetime.fromtimestamp(self._native.expires_at, tz=datetime.timezone.utc)

    @property
    def is_valid(self) -> bool:
        """Whether the lease is still trusted locally."""
        return self._native.is_valid

    @property
    def remaining(self) -> float:
        """Seconds the lease is still trusted locally (0 once lost)."""
        return self._native.remaining

    @property
    def loss_reason(self) -> Optional[str]:
        """``refused``, ``deadline`` or ``closed`` once lost; else ``None``."""
        return self._native.loss_reason

    def check(self) -> None:
        """Raises :class:`LockLost` unless the lease is still trusted: call it
        right before each critical write (and fence the write)."""
        self._native.check()

    def detach(self) -> None:
        """Stops renewing and leaves the lease to expire, or to another
        process that renews or releases it by owner and token."""
        self._native.detach()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} key={self.key!r} owner={self.owner!r} "
            f"token={self.token} valid={self.is_valid}>"
        )


class PermitBase(GuardBase):
    """The read-only side of a semaphore permit: which slot of which semaphore."""

    __slots__ = ("name", "slot", "permits")

    def __init__(self, native: _native.Guard, name: str, slot: int, permits: int) -> None:
        super().__init__(native)
        self.name = name
        self.slot = slot
        self.permits = permits


class MultiLockBase:
    """The read-only side of locks taken all or none."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.MultiLock) -> None:
        self._native = native

    @property
    def tokens(self) -> Dict[str, int]:
        """Each key's fencing token."""
        return self._native.tokens

    @property
    def is_valid(self) -> bool:
        """Whether every lease is still trusted locally."""
        return self._native.is_valid

    def check(self) -> None:
        """Raises :class:`LockLost` unless every lease is still trusted."""
        self._native.check()


# Clients still open when the interpreter exits normally (the script ends,
# sys.exit()) are closed by an atexit hook, blocking: the locks they hold
# are released before the process ends, as Node.js does in its 'exit'
# event; then the hook waits for the releases that collected guards sent
# in the background (a guard collected when its coroutine returned). A kill
# or os._exit() releases nothing. Clients are held weakly: a collected
# client's guards were collected, and are among those releases.
_open_clients: "weakref.WeakSet[_native.Client]" = weakref.WeakSet()


def close_at_exit(native: _native.Client) -> None:
    """Registers a client to be closed when the interpreter exits."""
    _open_clients.add(native)


def closed(native: _native.Client) -> None:
    """Forgets a client that was closed."""
    _open_clients.discard(native)


class ClientBase:
    """The native client both APIs wrap, closed at exit unless closed before."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.Client) -> None:
        self._native = native
        close_at_exit(native)

    @property
    def owner(self) -> str:
        """The owner this client's locks are taken as."""
        return self._native.owner


#: How long the exit hook waits for background releases, in seconds.
EXIT_BOUND = 5.0


@atexit.register
def _close_open_clients() -> None:
    for native in list(_open_clients):
        try:
            native.close_at_exit()
        except Exception:  # the process is ending: a failed release expires
            pass
    _native.wait_for_background_releases(EXIT_BOUND)
