"""The byte pipe under a connection: an asyncio or asyncssh stream pair behind one small interface.

The connection needs four things from its transport: read some bytes, write a whole packet without
yielding (so packets from concurrent calls never interleave), wait for the write buffer to drain (stream
uploads only), and close. asyncio's StreamReader/StreamWriter and asyncssh's SSHReader/SSHWriter both
offer them; this adapter hides their few differences (how to wait for the close, what else to close).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import ConnectionLost

#: Write buffer limits: big enough to keep an upload's pipe full between drains, small enough to bound memory.
WRITE_HIGH_WATER = 2 * 1024 * 1024
WRITE_LOW_WATER = 512 * 1024


class Link:
    """One reader/writer pair; `on_close` runs after it is closed (e.g. to close an owned SSH connection)."""

    def __init__(
        self,
        reader: Any,
        writer: Any,
        *,
        description: str,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.description = description
        self._on_close = on_close
        self._closed = False
        self._batch: list[bytes] = []  # packets waiting for the end of the loop turn
        self._dirty = False  # a packet went out directly since the last read or flush
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        transport = getattr(writer, "transport", None) or getattr(writer, "channel", None)
        self._transport = transport
        if transport is not None and hasattr(transport, "set_write_buffer_limits"):
            with contextlib.suppress(Exception):
                transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)

    async def read(self, n: int) -> bytes:
        data = await self._reader.read(n)
        if not self._batch:
            self._dirty = False  # a new turn with nothing queued: the next write may go out at once
        return data

    def write(self, data: bytes) -> None:
        """Write one whole packet, in order. A write goes out at once unless another one already went
        out since the last read (or a batch is queued): then it joins a batch written at the end of the
        loop turn. So a sequential caller pays no added latency, and 64 pipelined calls written in one
        turn become one send() / one SSH packet instead of 64 (plus asyncssh's IGNORE packet each)."""
        if not self._dirty and not self._batch:
            try:
                self._writer.write(data)
            except Exception as e:  # the link died under us; the reader will fail everyone else too
                raise ConnectionLost(f"connection to {self.description} lost: {e or type(e).__name__}") from e
            self._dirty = True
            return
        self._batch.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch, self._batch = self._batch, []
        self._dirty = False
        if batch:
            with contextlib.suppress(Exception):  # a dead link: the reader reports it
                self._writer.write(batch[0] if len(batch) == 1 else b"".join(batch))

    def write_buffer_size(self) -> int:
        self._flush()
        if self._transport is not None and hasattr(self._transport, "get_write_buffer_size"):
            return int(self._transport.get_write_buffer_size())
        return WRITE_HIGH_WATER  # unknown: assume full, so the caller drains

    async def drain(self) -> None:
        self._flush()
        await self._writer.drain()

    def abort(self) -> None:
        """Close now, without waiting (used when the link is already known dead or hostile)."""
        if self._closed:
            return
        self._batch = []
        with contextlib.suppress(Exception):
            self._writer.close()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush()
        with contextlib.suppress(Exception):
            self._writer.close()
        wait = getattr(self._writer, "wait_closed", None)
        if wait is None and hasattr(self._writer, "channel"):
            wait = self._writer.channel.wait_closed
        if wait is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(wait(), 5.0)
        if self._on_close is not None:
            with contextlib.suppress(Exception):
                await self._on_close()
