"""Data streams (STORAGE_VOL_UPLOAD / DOWNLOAD): per-stream state, upload, and the download iterator.

The reader task feeds each stream's StreamState (by serial); the functions here run on the caller's
side. The rules they follow (libvirt-rpc.md, "Streams"): an upload is not acknowledged chunk by chunk,
and a server failure arrives unasked as STREAM/ERROR, after which the server drops everything we send,
the finish included; so every wait here also watches for that error, and every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterable, Sequence
from typing import TYPE_CHECKING, Any

from .constants import STREAM_CHUNK
from .errors import ProtocolError, RpcError, error_from_remote
from .messages import StreamData, StreamFailed, StreamFinished, encode_stream_finish, stream_data_header
from .procedures import Procedure

if TYPE_CHECKING:
    from .connection import Connection


class StreamState:
    """State of one data stream (upload or download), fed by the reader task."""

    def __init__(self, *, proc: Procedure, serial: int) -> None:
        self.proc = proc
        self.serial = serial
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.eof = False  # download: the zero-length CONTINUE arrived
        self.finished = False  # server sent STREAM/OK
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def new_waiter(self) -> asyncio.Future[None]:
        self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    def on_event(self, ev: StreamData | StreamFinished | StreamFailed) -> None:
        if type(ev) is StreamData:
            if self.proc.stream == "upload":
                # Nobody would ever consume it, and buffering it could stall the reader: refuse.
                if self.error is None:
                    self.error = ProtocolError(f"{self.proc.method}: server sent data on an upload stream")
            elif self.eof:
                pass  # nothing may follow the end of data; ignore rather than buffer
            elif ev.data:
                self.chunks.append(ev.data)
                self.buffered += len(ev.data)
            else:
                self.eof = True
        elif type(ev) is StreamFinished:
            self.finished = True
        else:
            self.error = error_from_remote(ev.error)
        self.wake()

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.wake()

    def overrun(self, exc: BaseException) -> None:
        """The consumer fell too far behind: drop what is buffered (the download is over) and fail."""
        self.chunks.clear()
        self.buffered = 0
        self.fail(exc)


async def upload(
    conn: Connection,
    procedure: Procedure,
    args: Sequence[Any],
    data: bytes | bytearray | memoryview | AsyncIterable[bytes],
    *,
    timeout: float | None,
) -> int:
    """Run an upload stream; return the bytes sent. `timeout` bounds each wait for progress."""
    wait = conn.call_timeout if timeout is None else timeout
    started = time.perf_counter()
    sent = 0
    try:
        stream = await conn._open_stream(procedure, args, timeout=timeout)
        in_memory = isinstance(data, bytes | bytearray | memoryview)
        source = chunks(data if in_memory else _raced(data, stream))
        try:
            while True:
                if stream.error is not None:
                    raise stream.error
                chunk = await anext(source, None)
                if chunk is None:
                    break
                conn._check_open()
                # header + data in one buffer: the one copy of the data this layer makes
                conn._link.write(
                    stream_data_header(proc=procedure.number, serial=stream.serial, length=len(chunk)) + chunk
                )
                sent += len(chunk)
                await conn._drain_for(stream, wait)
            if stream.error is not None:
                raise stream.error
            conn._check_open()
            conn._link.write(encode_stream_finish(proc=procedure.number, serial=stream.serial))
            while not stream.finished:
                if stream.error is not None:
                    raise stream.error
                await conn._wait_stream(stream, wait, what="waiting for the upload to be confirmed")
        except BaseException:
            conn._close_stream(stream, abort=not stream.finished and stream.error is None)
            raise
        finally:
            with contextlib.suppress(Exception):
                await source.aclose()
        conn._close_stream(stream, abort=False)
    except BaseException as e:
        if conn.observer is not None and not isinstance(e, TypeError | ValueError):
            conn._observe(procedure, args, sent, e, started)
        raise
    if conn.observer is not None:
        conn._observe(procedure, args, sent, None, started)
    return sent


_END = object()


async def _raced(data: AsyncIterable[bytes], stream: StreamState) -> Any:
    """The caller's pieces, each wait for the next one racing the stream's error: a server STREAM/ERROR
    or a dropped link ends the upload at once even while the source is waiting (a slow disk, a pipe,
    HTTP). Raced per piece of the caller's, not per stream packet sliced from it: one task per piece."""
    if not hasattr(data, "__aiter__"):
        raise TypeError(f"data must be bytes or an async iterable of bytes, got {type(data).__name__}")
    it = aiter(data)
    while True:
        if stream.error is not None:
            raise stream.error
        fetch = asyncio.ensure_future(anext(it, _END))
        waiter = stream.new_waiter()
        try:
            while not fetch.done() and stream.error is None:
                await asyncio.wait({fetch, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if waiter.done() and not fetch.done():
                    waiter = stream.new_waiter()  # a wake that was not an error (e.g. a stray OK): wait on
        except BaseException:
            fetch.cancel()
            with contextlib.suppress(BaseException):
                await fetch
            raise
        if not fetch.done():  # the stream failed first: stop the source, then raise the stream's error
            fetch.cancel()
            with contextlib.suppress(BaseException):
                await fetch
            aclose = getattr(data, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            assert stream.error is not None
            raise stream.error
        piece = fetch.result()
        if piece is _END:
            return
        yield piece


async def chunks(data: bytes | bytearray | memoryview | AsyncIterable[bytes]) -> Any:
    """Yield the data as read-only views of at most STREAM_CHUNK bytes, copying nothing where it can:
    big pieces are sliced in place, only small pieces (and a big piece's tail) are gathered."""
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data).cast("B")
        for i in range(0, len(view), STREAM_CHUNK):
            yield view[i : i + STREAM_CHUNK]
        return
    if not hasattr(data, "__aiter__"):
        raise TypeError(f"data must be bytes or an async iterable of bytes, got {type(data).__name__}")
    pending = bytearray()  # always shorter than STREAM_CHUNK between pieces
    async for piece in data:
        if not isinstance(piece, bytes | bytearray | memoryview):
            raise TypeError(f"data iterable yielded {type(piece).__name__}, expected bytes")
        view = memoryview(piece).cast("B")
        start = 0
        if pending:
            take = min(STREAM_CHUNK - len(pending), len(view))
            pending += view[:take]
            start = take
            if len(pending) < STREAM_CHUNK:
                continue
            yield memoryview(bytes(pending))
            pending = bytearray()
        while len(view) - start >= STREAM_CHUNK:
            yield view[start : start + STREAM_CHUNK]
            start += STREAM_CHUNK
        pending += view[start:]
    if pending:
        yield memoryview(bytes(pending))


class Download:
    """An async iterator of a download's bytes. Use `async with` (or aclose()) when you may stop early."""

    def __init__(self, conn: Connection, procedure: Procedure, args: Sequence[Any], *, timeout: float | None):
        self._conn = conn
        self._proc = procedure
        self._args = tuple(args)
        self._timeout = timeout
        self._stream: StreamState | None = None
        self._done = False
        self._received = 0
        self._started = 0.0

    async def __aenter__(self) -> Download:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> Download:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        conn = self._conn
        wait = conn.call_timeout if self._timeout is None else self._timeout
        try:
            if self._stream is None:
                self._started = time.perf_counter()
                self._stream = await conn._open_stream(self._proc, self._args, timeout=self._timeout)
            s = self._stream
            while True:
                if s.chunks:
                    chunk = s.chunks.popleft()
                    s.buffered -= len(chunk)
                    self._received += len(chunk)
                    return chunk
                if s.error is not None:
                    raise s.error
                if s.eof:
                    conn._check_open()
                    if not s.finished:
                        conn._link.write(encode_stream_finish(proc=self._proc.number, serial=s.serial))
                    while not s.finished:
                        if s.error is not None:
                            raise s.error
                        await conn._wait_stream(s, wait, what="waiting for the end of the download")
                    self._finish(None)
                    raise StopAsyncIteration
                await conn._wait_stream(s, wait, what="waiting for data")
        except StopAsyncIteration:
            raise
        except BaseException as e:
            self._finish(e)
            raise

    def _finish(self, error: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        if self._stream is not None:
            self._conn._close_stream(self._stream, abort=error is not None and self._stream.error is None)
        if self._conn.observer is not None and not isinstance(error, TypeError | ValueError):
            self._conn._observe(
                self._proc, self._args, self._received if error is None else None, error, self._started
            )

    async def aclose(self) -> None:
        """Stop early: abort the stream on the server (if it was opened) and free its buffers."""
        if not self._done:
            if self._stream is None:
                self._done = True
                return
            self._finish(RpcError("download closed before its end"))

    async def read_all(self) -> bytes:
        """The whole download in memory (convenience for small volumes)."""
        parts = [chunk async for chunk in self]
        return b"".join(parts)
