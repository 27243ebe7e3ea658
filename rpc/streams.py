"""Data streams (STORAGE_VOL_UPLOAD / DOWNLOAD): upload, and the download iterator.

The protocol (protocol.ClientProtocol) keeps each stream's state; the functions here run on the
caller's side, through the small StreamHost interface the connection offers. The rules they follow
(docs/rpc.md, "Streams"): an upload is not acknowledged chunk by chunk, and a server failure
arrives unasked as STREAM/ERROR, after which the server drops everything we send, the finish included;
so every wait here also watches for that error, and every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterable, Sequence
from typing import Any, Protocol, cast

from .constants import STREAM_CHUNK
from .errors import RpcError
from .procedures import Procedure
from .protocol import Stream

#: Flags asking for a sparse stream (VIR_STORAGE_VOL_UPLOAD_SPARSE_STREAM / _DOWNLOAD_SPARSE_STREAM):
#: the daemon would send or expect STREAM_HOLE packets, which this client does not speak.
SPARSE_STREAM_FLAG = 1


class StreamHost(Protocol):
    """What the stream code needs from a connection (Connection implements it)."""

    call_timeout: float

    def check_open(self) -> None: ...

    async def open_stream(
        self, procedure: Procedure, args: Sequence[Any], *, timeout: float | None
    ) -> Stream: ...

    def stream_write(self, stream: Stream, chunk: bytes | memoryview) -> None: ...

    def stream_finish(self, stream: Stream) -> None: ...

    def close_stream(self, stream: Stream, *, abort: bool) -> None: ...

    async def wait_stream(self, stream: Stream, timeout: float, *, what: str) -> None: ...

    def stream_waiter(self, stream: Stream) -> asyncio.Future[None]: ...

    async def drain_for(self, stream: Stream, timeout: float) -> None: ...

    def record(
        self,
        procedure: Procedure,
        args: Sequence[Any],
        result: Any,
        error: BaseException | None,
        started: float,
    ) -> None: ...


def refuse_sparse(procedure: Procedure, flags: int) -> None:
    """ValueError before the call if `flags` ask for a sparse stream (holes are not supported)."""
    if flags & SPARSE_STREAM_FLAG:
        raise ValueError(
            f"{procedure.method}: flags={flags:#x} asks for a sparse stream (SPARSE_STREAM, 0x1), which this "
            "client does not support: pass flags without it"
        )


async def upload(
    conn: StreamHost,
    procedure: Procedure,
    args: Sequence[Any],
    data: bytes | bytearray | memoryview | AsyncIterable[bytes],
    *,
    timeout: float | None,
) -> int:
    """Run an upload stream; return the bytes sent. `timeout` bounds each wait for progress."""
    refuse_sparse(procedure, int(args[-1]))
    wait = conn.call_timeout if timeout is None else timeout
    started = time.perf_counter()
    sent = 0
    try:
        stream = await conn.open_stream(procedure, args, timeout=timeout)
        raw = data if isinstance(data, bytes | bytearray | memoryview) else None
        source = chunks(raw if raw is not None else _raced(cast(AsyncIterable[bytes], data), stream, conn))
        try:
            while True:
                if stream.error is not None:
                    raise stream.error
                chunk = await anext(source, None)
                if chunk is None:
                    break
                conn.stream_write(stream, chunk)
                sent += len(chunk)
                await conn.drain_for(stream, wait)
            conn.stream_finish(stream)
            while not stream.finished:
                if stream.error is not None:
                    raise stream.error
                await conn.wait_stream(stream, wait, what="waiting for the upload to be confirmed")
        except BaseException:
            conn.close_stream(stream, abort=not stream.finished and stream.error is None)
            raise
        finally:
            with contextlib.suppress(Exception):
                await source.aclose()
        conn.close_stream(stream, abort=False)
    except BaseException as e:
        if not isinstance(e, TypeError | ValueError):
            conn.record(procedure, args, sent, e, started)
        raise
    conn.record(procedure, args, sent, None, started)
    return sent


_END = object()


async def _raced(data: AsyncIterable[bytes], stream: Stream, conn: StreamHost) -> Any:
    """The caller's pieces, each wait for the next one racing the stream's error: a server STREAM/ERROR
    or a dropped link ends the upload at once even while the source is waiting (a slow disk, a pipe,
    HTTP). Raced per piece of the caller's, not per stream packet sliced from it: one task per piece."""
    if not hasattr(data, "__aiter__"):
        raise TypeError(f"data must be bytes or an async iterable of bytes, got {type(data).__name__}")
    it = aiter(data)
    while True:
        if stream.error is not None:
            raise stream.error
        fetch: asyncio.Future[Any] = asyncio.ensure_future(anext(it, _END))
        waiter: asyncio.Future[Any] = conn.stream_waiter(stream)
        try:
            while not fetch.done() and stream.error is None:
                await asyncio.wait({fetch, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if waiter.done() and not fetch.done():
                    # a wake that was not an error (e.g. a stray OK): wait on
                    waiter = conn.stream_waiter(stream)
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

    def __init__(self, conn: StreamHost, procedure: Procedure, args: Sequence[Any], *, timeout: float | None):
        refuse_sparse(procedure, int(args[-1]))
        self._conn = conn
        self._proc = procedure
        self._args = tuple(args)
        self._timeout = timeout
        self._stream: Stream | None = None
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
                self._stream = await conn.open_stream(self._proc, self._args, timeout=self._timeout)
            s = self._stream
            while True:
                chunk = s.take()
                if chunk is not None:
                    self._received += len(chunk)
                    return chunk
                if s.error is not None:
                    raise s.error
                if s.eof:
                    conn.check_open()
                    if not s.finished:
                        conn.stream_finish(s)
                    while not s.finished:
                        if s.error is not None:
                            raise s.error
                        await conn.wait_stream(s, wait, what="waiting for the end of the download")
                    self._finish(None)
                    raise StopAsyncIteration
                await conn.wait_stream(s, wait, what="waiting for data")
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
            self._conn.close_stream(self._stream, abort=error is not None and self._stream.error is None)
        if not isinstance(error, TypeError | ValueError):
            self._conn.record(
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
