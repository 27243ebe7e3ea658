"""The exceptions the client raises, and the mapping from a libvirt remote_error to one of them.

Callers sort failures by class, not by parsing messages: LibvirtError is "the daemon said no" (with the
daemon's code), NotFoundError the one family every reconciler must treat as "absent", ConnectionLost
"the link is gone, every in-flight call failed with it", ProtocolError "the peer sent bytes that are not
libvirt's protocol" (the connection is closed when that happens: nothing after them can be trusted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .constants import ErrorCode, error_code_name

if TYPE_CHECKING:
    from .types import RemoteError


class RpcError(Exception):
    """Base of everything this package raises on purpose."""


class LibvirtError(RpcError):
    """libvirtd answered a call (or a stream) with an error.

    `code` is the virErrorNumber, `code_name` its name without "VIR_ERR_" (e.g. "NO_DOMAIN"), `domain`
    the virErrorDomain number, `message` the daemon's text. `error` keeps the whole remote_error.
    """

    def __init__(
        self, code: int, code_name: str, domain: int, message: str, *, error: RemoteError | None = None
    ) -> None:
        super().__init__(code, code_name, domain, message)
        self.code = code
        self.code_name = code_name
        self.domain = domain
        self.message = message
        self.error = error

    def __str__(self) -> str:
        return f"{self.message} (libvirt error {self.code} {self.code_name}, domain {self.domain})"

    @property
    def is_unsupported(self) -> bool:
        """The daemon does not know the procedure (code RPC + "unknown procedure"), or says NO_SUPPORT."""
        if self.code == ErrorCode.RPC and self.message.lower().startswith("unknown procedure"):
            return True
        return self.code in (ErrorCode.NO_SUPPORT, ErrorCode.OPERATION_UNSUPPORTED)


class NotFoundError(LibvirtError):
    """No such domain, storage pool or storage volume (NO_DOMAIN, NO_STORAGE_POOL, NO_STORAGE_VOL)."""


NOT_FOUND_CODES = frozenset({ErrorCode.NO_DOMAIN, ErrorCode.NO_STORAGE_POOL, ErrorCode.NO_STORAGE_VOL})


class ConnectionLost(RpcError, ConnectionError):
    """The connection to libvirtd is gone (EOF, reset, SSH drop, keepalive timeout, closed by us)."""


class ProtocolError(RpcError):
    """Malformed or hostile input from the peer: bad length, unknown header values, oversized data."""


class DeadlineExceeded(RpcError, TimeoutError):
    """A call's deadline passed before its reply. The connection stays usable; a late reply is dropped."""


class DownloadOverrun(RpcError):
    """A download's consumer fell `download_high_water` bytes behind the data arriving: that download was
    aborted (on the server too) and its buffer freed. The connection and its other calls are unaffected."""


class ConnectFailed(RpcError, ConnectionError):
    """Could not reach libvirtd at all (socket missing, SSH refused, auth failed, handshake timed out)."""


class HostKeyRejected(ConnectFailed):
    """The SSH server's host key is not in the given known_hosts (unknown host, or a changed key)."""


class EventsLost(RpcError):
    """A subscription's queue overflowed because its consumer fell behind: some events were dropped.

    Raised from the subscription's iterator after the events it did keep; the consumer should resync
    (list what exists) and may keep iterating.
    """


class MalformedEvent(EventsLost):
    """One event arrived well framed but its body did not decode (truncated, trailing bytes, a value out
    of range): it was dropped, and the connection and the subscription stay (only a framing error, which
    leaves nothing after it trustworthy, closes the connection: ConnectionLost, its cause a ProtocolError).

    Raised from the subscription's iterator once, in the dropped event's place among the others; the
    consumer may keep iterating. An EventsLost, since what the event said is unknown: the same resync
    applies.
    """


def error_from_remote(err: RemoteError) -> LibvirtError:
    """The exception for one remote_error: NotFoundError for the not-found family, else LibvirtError."""
    cls = NotFoundError if err.code in NOT_FOUND_CODES else LibvirtError
    return cls(err.code, error_code_name(err.code), err.domain, err.message or "", error=err)
