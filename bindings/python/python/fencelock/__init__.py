"""fencelock: distributed locks with fencing tokens, over the Rust client.

>>> client = await fencelock.connect("redis://127.0.0.1:6379")
>>> async with client.lock("order:123", ttl=30) as guard:
...     write(guard.token)

The lease is renewed in the background until released; ``guard.lost()``
completes before it could end on the backend. See docs/python.md.
"""

from ._client import (
    Client,
    Election,
    Fence,
    Guard,
    Leadership,
    MultiLock,
    Permit,
    RwLock,
    connect,
    open_fence,
)
from ._common import Duration, JsonValue
from ._errors import (
    BackendError,
    ClientClosed,
    FencelockError,
    InvalidInput,
    LockLost,
    NotAcquired,
    OperationTimeout,
    Stale,
    TokensExhausted,
    Unauthorized,
    Unavailable,
    Unsupported,
)
from ._sync import (
    SyncClient,
    SyncElection,
    SyncFence,
    SyncGuard,
    SyncLeadership,
    SyncMultiLock,
    SyncPermit,
    connect_sync,
    open_fence_sync,
)

__all__ = [
    "BackendError",
    "Client",
    "ClientClosed",
    "Duration",
    "Election",
    "Fence",
    "FencelockError",
    "Guard",
    "InvalidInput",
    "JsonValue",
    "Leadership",
    "LockLost",
    "MultiLock",
    "NotAcquired",
    "OperationTimeout",
    "Permit",
    "RwLock",
    "Stale",
    "SyncClient",
    "SyncElection",
    "SyncFence",
    "SyncGuard",
    "SyncLeadership",
    "SyncMultiLock",
    "SyncPermit",
    "TokensExhausted",
    "Unauthorized",
    "Unavailable",
    "Unsupported",
    "connect",
    "connect_sync",
    "open_fence",
    "open_fence_sync",
]
