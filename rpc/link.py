"""The byte pipe under a connection, behind one small interface (go-libvirt's Dialer, in spirit).

A link pushes what it reads into a Receiver (`data_received`, `eof_received`, `connection_lost`) and
offers: write a whole packet without yielding (so packets of concurrent calls never interleave), the
size of the unsent backlog, a wait for it to drain (stream uploads only), abort and close. Three
implementations, chosen by the dialer in transport.py:
- UnixLink: an asyncio.Protocol on a unix socket. Reads arrive as callbacks, no reader task and no
  StreamReader buffer in between: the cheapest path the event loop offers (and uvloop's fast path).
- SSHLink: the same as an asyncssh session on a direct-streamlocal channel.
- Link: any (reader, writer) pair with read()/write()/drain()/close() (asyncio streams, asyncssh's
  SSHReader/SSHWriter), pumped by one task: for callers that already hold such a pair.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, cast

from .errors import ConnectionLost

#: Write buffer limits: big enough to keep an upload's pipe full between drains, small enough to bound memory.
WRITE_HIGH_WATER = 2 * 1024 * 1024
WRITE_LOW_WATER = 512 * 1024
READ_SIZE = 256 * 1024


class Receiver(Protocol):
    """What a link feeds (the connection)."""

    def data_received(self, data: bytes) -> None: ...

    def eof_received(self) -> None: ...

    def connection_lost(self, exc: BaseException | None) -> None: ...


class _Buffered:
    """Receiver to hand reads to once it is attached (bytes that came before it are kept for it)."""

    def __init__(self) -> None:
        self.early: list[bytes] = []
        self.eof = False
        self.lost: tuple[BaseException | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.early.append(bytes(data))

    def eof_received(self) -> None:
        self.eof = True

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = (exc,)


class BaseLink:
    """Write batching and the receiver hand-over shared by every link.

    A write goes out at once unless another one already went out since the last read (or a batch is
    queued): then it joins a batch written at the end of the loop turn. So a sequential caller pays no
    added latency, and 64 pipelined calls written in one turn become one send() / one SSH packet."""

    description: str

    def __init__(self, *, description: str, on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        self.description = description
        self._on_close = on_close
        self._closed = False
        self._batch: list[bytes | memoryview] = []
        self._dirty = False
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        self._receiver: Receiver = _Buffered()

    def start(self, receiver: Receiver) -> None:
        """Attach the receiver; anything read before it is delivered now, in order."""
        early = self._receiver
        self._receiver = receiver
        if isinstance(early, _Buffered):
            for data in early.early:
                receiver.data_received(data)
            if early.eof:
                receiver.eof_received()
            if early.lost is not None:
                receiver.connection_lost(early.lost[0])

    def _raw_write(self, data: bytes) -> None:
        raise NotImplementedError

    def _got_data(self) -> None:
        if not self._batch:
            self._dirty = False  # a new turn with nothing queued: the next write may go out at once

    def write(self, data: bytes) -> None:
        """Write one whole packet, in order (see the class docstring for batching)."""
        if not self._dirty and not self._batch:
            try:
                self._raw_write(data)
            except Exception as e:  # the link died under us; the receiver hears of it too
                raise ConnectionLost(f"connection to {self.description} lost: {e or type(e).__name__}") from e
            self._dirty = True
            return
        self._batch.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def write_parts(self, head: bytes, body: bytes | memoryview) -> None:
        """Write one whole packet given as two parts (a stream packet's header and its data), in order,
        without joining them where the transport can write both at once (uvloop's vectored write)."""
        if not self._dirty and not self._batch:
            try:
                self._raw_writelines((head, body))
            except Exception as e:
                raise ConnectionLost(f"connection to {self.description} lost: {e or type(e).__name__}") from e
            self._dirty = True
            return
        self._batch.append(head)
        self._batch.append(body)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _raw_writelines(self, parts: Sequence[bytes | memoryview]) -> None:
        """Write several buffers in order; a link whose transport writes vectors overrides this."""
        self._raw_write(b"".join(parts))

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch, self._batch = self._batch, []
        self._dirty = False
        if batch:
            with contextlib.suppress(Exception):  # a dead link: the receiver hears of it
                if len(batch) == 1:
                    self._raw_write(batch[0])  # type: ignore[arg-type]
                else:
                    self._raw_writelines(batch)

    def write_buffer_size(self) -> int:
        raise NotImplementedError

    async def drain(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    async def _close_and_wait(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._close_and_wait(), 5.0)
        if self._on_close is not None:
            with contextlib.suppress(Exception):
                await self._on_close()


class _FlowControl:
    """pause_writing/resume_writing turned into an awaitable drain (asyncio's and asyncssh's protocols)."""

    def __init__(self) -> None:
        self._paused = False
        self._drainers: list[asyncio.Future[None]] = []
        self._lost_exc: BaseException | None = None
        self._gone = False

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake(None)

    def _wake(self, exc: BaseException | None) -> None:
        drainers, self._drainers = self._drainers, []
        for f in drainers:
            if not f.done():
                if exc is None:
                    f.set_result(None)
                else:
                    f.set_exception(exc)

    async def _wait_drained(self, description: str) -> None:
        if self._gone:
            raise ConnectionLost(f"connection to {description} lost: {self._lost_exc or 'closed'}")
        if not self._paused:
            return
        f = asyncio.get_running_loop().create_future()
        self._drainers.append(f)
        await f


class UnixLink(BaseLink, _FlowControl, asyncio.Protocol):
    """An asyncio.Protocol on a stream socket (libvirtd's unix socket)."""

    def __init__(self, *, description: str) -> None:
        BaseLink.__init__(self, description=description)
        _FlowControl.__init__(self)
        self._transport: asyncio.Transport | None = None
        self._closed_fut: asyncio.Future[None] = self._loop.create_future()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport, so no isinstance check).
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)

    def data_received(self, data: bytes) -> None:
        if not self._batch:
            self._dirty = False
        self._receiver.data_received(data)

    def eof_received(self) -> bool:
        self._receiver.eof_received()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone = True
        self._lost_exc = exc
        self._wake(ConnectionLost(f"connection to {self.description} lost: {exc or 'closed'}"))
        if not self._closed_fut.done():
            self._closed_fut.set_result(None)
        self._receiver.connection_lost(exc)

    # Link
    def _raw_write(self, data: bytes) -> None:
        assert self._transport is not None
        if self._transport.is_closing():
            raise ConnectionLost(f"connection to {self.description} is closed")
        self._transport.write(data)

    def _raw_writelines(self, parts: Sequence[bytes | memoryview]) -> None:
        # uvloop writes the parts with one writev and no join; the default loop joins them (one copy).
        assert self._transport is not None
        if self._transport.is_closing():
            raise ConnectionLost(f"connection to {self.description} is closed")
        self._transport.writelines(parts)

    def write_buffer_size(self) -> int:
        self._flush()
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    async def drain(self) -> None:
        self._flush()
        await self._wait_drained(self.description)

    def abort(self) -> None:
        self._batch = []
        if self._transport is not None:
            self._transport.abort()

    async def _close_and_wait(self) -> None:
        if self._transport is not None:
            self._transport.close()
            await self._closed_fut


async def open_unix_link(path: str) -> UnixLink:
    """A UnixLink connected to `path` (OSError if nobody listens there)."""
    loop = asyncio.get_running_loop()
    _, link = await loop.create_unix_connection(lambda: UnixLink(description=f"unix:{path}"), path)
    return link


class SSHLink(BaseLink, _FlowControl):
    """An asyncssh client session on a channel (direct-streamlocal to libvirtd's socket)."""

    def __init__(self, *, description: str, on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        BaseLink.__init__(self, description=description, on_close=on_close)
        _FlowControl.__init__(self)
        self._chan: Any = None

    # asyncssh.SSHClientSession
    def connection_made(self, chan: Any) -> None:
        self._chan = chan
        with contextlib.suppress(Exception):
            chan.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)

    def session_started(self) -> None:
        pass

    def data_received(self, data: bytes, datatype: Any = None) -> None:
        if not self._batch:
            self._dirty = False
        self._receiver.data_received(data)

    def eof_received(self) -> bool:
        self._receiver.eof_received()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self._gone = True
        self._lost_exc = exc
        self._wake(ConnectionLost(f"connection to {self.description} lost: {exc or 'closed'}"))
        self._receiver.connection_lost(exc)

    # Link
    def _raw_write(self, data: bytes) -> None:
        if self._gone:
            raise ConnectionLost(f"connection to {self.description} is closed")
        self._chan.write(data)

    def write_buffer_size(self) -> int:
        self._flush()
        return int(self._chan.get_write_buffer_size()) if self._chan is not None else 0

    async def drain(self) -> None:
        self._flush()
        await self._wait_drained(self.description)

    def abort(self) -> None:
        self._batch = []
        if self._chan is not None:
            with contextlib.suppress(Exception):
                self._chan.abort()

    async def _close_and_wait(self) -> None:
        if self._chan is not None:
            self._chan.close()
            await self._chan.wait_closed()


class Link(BaseLink):
    """A (reader, writer) pair pumped by one task: `await reader.read(n)`, `writer.write/drain/close`.
    `on_close` runs after it is closed (e.g. to close an owned SSH connection)."""

    def __init__(
        self,
        reader: Any,
        writer: Any,
        *,
        description: str,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(description=description, on_close=on_close)
        self._reader = reader
        self._writer = writer
        self._pump: asyncio.Task[None] | None = None
        transport = getattr(writer, "transport", None) or getattr(writer, "channel", None)
        self._transport = transport
        if transport is not None and hasattr(transport, "set_write_buffer_limits"):
            with contextlib.suppress(Exception):
                transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)

    def start(self, receiver: Receiver) -> None:
        super().start(receiver)
        self._pump = self._loop.create_task(self._run(), name=f"libvirt-reader {self.description}")

    async def read(self, n: int) -> bytes:
        """One read, outside a receiver (tests drive the pair by hand with it)."""
        data: bytes = await self._reader.read(n)
        self._got_data()
        return data

    async def _run(self) -> None:
        try:
            while True:
                data = await self._reader.read(READ_SIZE)
                self._got_data()
                if not data:
                    self._receiver.eof_received()
                    return
                self._receiver.data_received(data)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._receiver.connection_lost(e)

    def _raw_write(self, data: bytes) -> None:
        self._writer.write(data)

    def write_buffer_size(self) -> int:
        self._flush()
        if self._transport is not None and hasattr(self._transport, "get_write_buffer_size"):
            return int(self._transport.get_write_buffer_size())
        return WRITE_HIGH_WATER  # unknown: assume full, so the caller drains

    async def drain(self) -> None:
        self._flush()
        await self._writer.drain()

    def abort(self) -> None:
        if self._closed:
            return
        self._batch = []
        with contextlib.suppress(Exception):
            self._writer.close()

    async def _close_and_wait(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()
        wait = getattr(self._writer, "wait_closed", None)
        if wait is None and hasattr(self._writer, "channel"):
            wait = self._writer.channel.wait_closed
        if wait is not None:
            await wait()

    async def aclose(self) -> None:
        await super().aclose()
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump
