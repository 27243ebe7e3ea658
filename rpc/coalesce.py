"""One send per event-loop turn for an SSH connection's writes.

asyncssh writes every SSH packet to its transport on its own, and since 2.24 it sends an
`SSH_MSG_IGNORE` packet before each packet it sends: a libvirt call over SSH is two `transport.write`s,
two `send()` system calls and, on loopback or a fast link, two wake-ups of the peer's sshd. Calls that
go out together (a Create's waves, many Proxies' reconciles at once) add two more each. Measured on the
fleet bench (docs/performance.md), those sends were a fifth of the operator's CPU samples.

`CoalescingConnector` is handed to `asyncssh.connect` as its `tunnel`: it opens the TCP connection itself
and gives asyncssh a transport that collects the writes made during one turn of the loop and sends
them with one `writelines` at the end of it (uvloop: one `writev`). The bytes on the wire are the same,
in the same order; nothing waits longer than the current turn. Reads go straight to asyncssh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast


class CoalescingTransport(asyncio.Transport):
    """Wraps a connected transport; `write`s made in one loop turn leave in one `writelines`."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data) if not isinstance(data, bytes) else data)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def _flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if self._transport.is_closing():
            return  # closed under us: a plain transport drops writes after close as well
        try:
            if len(pending) == 1:
                self._transport.write(pending[0])
            else:
                self._transport.writelines(pending)
        except ConnectionError:
            pass  # as asyncssh's own write: connection_lost follows
        except Exception:
            # Raised in a loop callback, not to asyncssh: the connection would go on with these bytes
            # missing from its stream. End it instead (asyncssh hears connection_lost); the loop logs it.
            self._transport.abort()
            raise

    def close(self) -> None:
        self._flush()  # what was written before the close still goes out, as with a plain transport
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(d) for d in self._pending)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class _Handover(asyncio.Protocol):
    """Gives the connection's protocol the coalescing transport, then steps out of the read path."""

    def __init__(self, protocol: asyncio.Protocol, loop: asyncio.AbstractEventLoop) -> None:
        self.protocol = protocol
        self._loop = loop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        real = cast(asyncio.Transport, transport)  # uvloop's TCPTransport is one without subclassing it
        real.set_protocol(self.protocol)  # reads, pauses and connection_lost go straight to asyncssh
        self.protocol.connection_made(CoalescingTransport(real, self._loop))


class CoalescingConnector:
    """asyncssh's `tunnel=` protocol (an object with `create_connection`): a direct TCP connection whose
    transport is a `CoalescingTransport`."""

    def __init__(self, **create_options: Any) -> None:
        self._options = create_options  # passed on to loop.create_connection (family, local_addr, ...)

    async def create_connection(self, session_factory: Callable[[], asyncio.Protocol], remote_host: str,
                                remote_port: int) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        loop = asyncio.get_running_loop()
        # The session (asyncssh's connection, which starts its login timer when made) is made once TCP
        # is connected, as on asyncssh's own path: a failed dial leaves no connection object behind.
        transport, handover = await loop.create_connection(lambda: _Handover(session_factory(), loop),
                                                           remote_host, remote_port, **self._options)
        return transport, handover.protocol

    def close(self) -> None:
        """Nothing of its own to close (asyncssh calls this only for tunnels it opened itself)."""

    async def wait_closed(self) -> None:
        """See close."""
