"""The exceptions of fencelock, one class per kind of failure.

Every exception carries ``code``: the core's stable name of the failure,
the word the CLI's ``--json`` errors and the REST API use (``docs/http.md``),
except that a failed try is ``not_acquired`` here (``held`` there).
"""

from __future__ import annotations

from typing import Dict, Optional, Type


class FencelockError(Exception):
    """Any failure of fencelock."""

    code: str = "internal"

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class NotAcquired(FencelockError):
    """The lock was held by another until the wait ended (``wait=0``: at once)."""

    code = "not_acquired"


class LockLost(FencelockError):
    """The lease is gone or may be gone: stop acting on its behalf.

    ``reason`` is ``refused`` (the backend no longer has it), ``deadline``
    (no renewal confirmed before the local deadline), ``closed`` (the client
    was closed), or ``None`` when a release or renewal found no such lease.
    """

    code = "not_held"

    def __init__(self, message: str, code: Optional[str] = None, reason: Optional[str] = None) -> None:
        super().__init__(message, code)
        self.reason = reason


class InvalidInput(FencelockError, ValueError):
    """A bad argument; ``code`` says which: ``invalid_key``, ``invalid_owner``,
    ``invalid_ttl``, ``invalid_token`` or ``bad_request`` (a bad URL, wait,
    data, or any other argument)."""

    code = "bad_request"


class Unavailable(FencelockError, ConnectionError):
    """The backend could not be reached or failed transiently; retrying may help."""

    code = "unavailable"


class ClientClosed(Unavailable):
    """The client was closed: it takes no new locks."""


class OperationTimeout(FencelockError, TimeoutError):
    """A backend call got no answer in time; its outcome is unknown."""

    code = "timeout"


class Unsupported(FencelockError):
    """The backend (or this build) cannot do this."""

    code = "unsupported"


class Stale(FencelockError):
    """A fence refused a token lower than one it has admitted."""

    code = "stale"


class TokensExhausted(FencelockError):
    """The key's token counter is at its maximum."""

    code = "tokens_exhausted"


class Unauthorized(FencelockError, PermissionError):
    """The backend refused the URL's credentials (a wrong or missing
    password, an unknown user): raised at once, never retried."""

    code = "unauthorized"


class BackendError(FencelockError):
    """Any other failure of the backend."""

    code = "internal"


_BY_CODE: Dict[str, Type[FencelockError]] = {
    "held": NotAcquired,
    "not_held": LockLost,
    "invalid_key": InvalidInput,
    "invalid_owner": InvalidInput,
    "invalid_ttl": InvalidInput,
    "invalid_token": InvalidInput,
    "bad_request": InvalidInput,
    "unavailable": Unavailable,
    "timeout": OperationTimeout,
    "unsupported": Unsupported,
    "stale": Stale,
    "tokens_exhausted": TokensExhausted,
    "unauthorized": Unauthorized,
}


def _from_core(code: str, message: str, reason: Optional[str], closed: bool) -> FencelockError:
    """The exception for a core error (called by the native module)."""
    if closed:
        return ClientClosed(message)
    cls = _BY_CODE.get(code, BackendError)
    if cls is LockLost:
        return LockLost(message, reason=reason)
    return cls(message, code if cls is InvalidInput else None)
