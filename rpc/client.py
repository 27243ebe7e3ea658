"""The client: the connection plus one method per REMOTE procedure.

The per-procedure methods are generated (rpc/methods.py, from remote_protocol.x): named after the
procedure in snake_case, the procedure's arguments in protocol order under their protocol names
(camelCase -> snake_case, `type` -> `type_`), `flags` defaulting to 0 and `need_results` to 1, and a
keyword-only `timeout=` (seconds; default: the client's call_timeout). Returns: a one-field return
struct gives that value, a larger one its `*Ret` dataclass, void gives None. Errors: LibvirtError /
NotFoundError from the daemon, DeadlineExceeded, ConnectionLost, ProtocolError.

Written here by hand: what is more than one call (handshake, close), the volume streams and events.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable

from .connection import Connection
from .constants import FEATURE_PROGRAM_KEEPALIVE, AuthType
from .errors import ConnectFailed, LibvirtError
from .events import AgentLifecycleSubscription, LifecycleSubscription
from .handles import Domain, StorageVol
from .methods import ProcedureMethods
from .procedures import BY_NUMBER
from .streams import Download, upload


class Client(Connection, ProcedureMethods):
    """A connected libvirt client. Get one from rpc.connect_unix / connect_ssh / connect_over."""

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Send CONNECT_CLOSE (best effort, short deadline), then free the link and every waiter."""
        if self._closing:
            await self._finish_close()
            return
        self._closing = True
        if self.is_connected:
            # Best effort: the daemon may already be gone; we close either way.
            with contextlib.suppress(Exception):
                await self.call(2, (), timeout=min(self.call_timeout, 5.0))
        await self._finish_close()

    async def _finish_close(self) -> None:
        from .errors import ConnectionLost

        self._lost(ConnectionLost(f"connection to {self._link.description} closed by the client"))
        await self._link.aclose()

    async def _handshake(
        self,
        *,
        uri: str | None,
        readonly: bool = False,
        keepalive_interval: float | None,
        keepalive_count: int,
        timeout: float | None = None,
    ) -> None:
        """What libvirt's own client does: AUTH_LIST, AUTH_POLKIT if listed, keepalive, CONNECT_OPEN."""
        types = await self.auth_list(timeout=timeout)
        if types and AuthType.NONE not in types:
            if AuthType.POLKIT in types:
                complete = await self.auth_polkit(timeout=timeout)
                if not complete:
                    raise ConnectFailed(f"{self.description}: polkit authentication did not complete")
            else:
                names = ", ".join(
                    AuthType(t).name if t in AuthType._value2member_map_ else str(t) for t in types
                )
                raise ConnectFailed(
                    f"{self.description}: libvirtd requires authentication this client does not speak "
                    f"({names}); allow the SSH user's group on the socket (auth_unix_rw) or use polkit"
                )
        if keepalive_interval:
            try:
                supported = await self.connect_supports_feature(FEATURE_PROGRAM_KEEPALIVE, timeout=timeout)
            except LibvirtError:
                supported = 0
            if supported:
                self._start_keepalive(interval=keepalive_interval, count=keepalive_count)
        await self.connect_open(uri, 1 if readonly else 0, timeout=timeout)

    # -- streams and events ------------------------------------------------------------------------

    async def storage_vol_upload(
        self,
        vol: StorageVol,
        offset: int,
        length: int,
        flags: int,
        data: bytes | bytearray | memoryview | AsyncIterable[bytes],
        *,
        timeout: float | None = None,
    ) -> int:
        """Upload `data` (bytes, or an async iterable of bytes) into the volume; returns the bytes sent.

        `length` 0 means "to the end of the volume". `timeout` bounds every wait for progress (the call's
        reply, each drain of the send buffer, the final confirmation), not the whole transfer. A server
        error mid-upload (e.g. "No space left on device") ends the upload at once with that LibvirtError.
        """
        return await upload(self, BY_NUMBER[208], (vol, offset, length, flags), data, timeout=timeout)

    def storage_vol_download(
        self, vol: StorageVol, offset: int, length: int, flags: int = 0, *, timeout: float | None = None
    ) -> Download:
        """An async iterator over the volume's bytes (`length` 0 = to the end); the call is made on first use.

        Use `async with client.storage_vol_download(...) as chunks:` when you may stop early: leaving the
        block aborts the stream on the server. `timeout` bounds each wait for data.
        """
        return Download(self, BY_NUMBER[209], (vol, offset, length, flags), timeout=timeout)

    def lifecycle_events(
        self, dom: Domain | None = None, *, timeout: float | None = None, max_queue: int | None = None
    ) -> LifecycleSubscription:
        """Lifecycle events of `dom` (None: all domains): `async with ... as events: async for ev in ...`."""
        return LifecycleSubscription(
            self,
            dom,
            timeout=timeout,
            max_queue=max_queue if max_queue is not None else self.event_queue_max,
        )

    def agent_lifecycle_events(
        self, dom: Domain | None = None, *, timeout: float | None = None, max_queue: int | None = None
    ) -> AgentLifecycleSubscription:
        """The guest agent's connects and disconnects for `dom` (None: all domains), used like
        `lifecycle_events`."""
        return AgentLifecycleSubscription(
            self,
            dom,
            timeout=timeout,
            max_queue=max_queue if max_queue is not None else self.event_queue_max,
        )
