"""An in-process libvirtd stand-in that speaks the wire protocol over a real socket pair.

Tests script it: a handler per procedure number returns a value (encoded with the procedure's ret
codec), raises FakeError (sent as REPLY/ERROR), or returns NO_REPLY to stay silent. It can also push raw
bytes, events, pings and stream packets, so hostile input, timeouts and stream errors are deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rpc.client import Client
from rpc.connection import Connection
from rpc.constants import (
    KEEPALIVE_PROC_PING,
    KEEPALIVE_PROC_PONG,
    KEEPALIVE_PROGRAM,
    REMOTE_PROGRAM,
    MessageStatus,
    MessageType,
)
from rpc.framing import PacketDecoder, encode_packet
from rpc.link import Link
from rpc.messages import encode_remote_error
from rpc.procedures import BY_NUMBER, LIFECYCLE_MSG
from rpc.types import Domain, LifecycleEvent, RemoteError

NO_REPLY = object()


class FakeError(Exception):
    def __init__(self, code: int, message: str, domain: int = 10) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.domain = domain


def remote_error(code: int, message: str, domain: int = 10) -> RemoteError:
    return RemoteError(code, domain, message, 2, None, None, None, None, 0, 0, None)


@dataclass
class Received:
    proc: int
    type: int
    serial: int
    status: int
    payload: bytes
    prog: int = REMOTE_PROGRAM


@dataclass
class FakeServer:
    handlers: dict[int, Callable[..., Any]] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    answer_pings: bool = True
    sock: socket.socket | None = None  # an accepted socket to serve; default: one end of a new socketpair

    def __post_init__(self) -> None:
        if self.sock is not None:
            self._sock, self.client_sock = self.sock, socket.socket()
        else:
            self._sock, self.client_sock = socket.socketpair()
        self._sock.setblocking(False)
        self.client_sock.setblocking(False)
        self._decoder = PacketDecoder()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self.stream_packets: asyncio.Queue[Received] = asyncio.Queue()
        self.calls: asyncio.Queue[Received] = asyncio.Queue()
        self.frozen = False  # read and record, but answer nothing (a hung daemon)
        self.reading = asyncio.Event()  # cleared: stop reading the socket (a daemon that is not draining)
        self.reading.set()
        self.handlers.setdefault(66, lambda: ())
        self.handlers.setdefault(60, lambda feature: 1)
        self.handlers.setdefault(1, lambda name, flags: None)
        self.handlers.setdefault(2, lambda: None)

    async def start(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(sock=self._sock)
        self._task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        assert self.reader is not None
        while True:
            await self.reading.wait()
            data = await self.reader.read(1 << 16)
            if not data:
                return
            for pkt in self._decoder.feed(data):
                h = pkt.header
                rec = Received(h.proc, h.type, h.serial, h.status, pkt.payload, h.prog)
                self.received.append(rec)
                if self.frozen:
                    continue
                if h.prog == KEEPALIVE_PROGRAM:
                    if h.proc == KEEPALIVE_PROC_PING and self.answer_pings:
                        self.send_keepalive(KEEPALIVE_PROC_PONG)
                    continue
                if h.type == MessageType.STREAM:
                    self.stream_packets.put_nowait(rec)
                    continue
                self.calls.put_nowait(rec)
                await self._answer(rec)

    async def _answer(self, rec: Received) -> None:
        proc = BY_NUMBER[rec.proc]
        handler = self.handlers.get(rec.proc)
        if handler is None:
            self.reply_error(rec, remote_error(39, f"unknown procedure: {rec.proc}", domain=7))
            return
        args = proc.decode_args(rec.payload)
        try:
            value = handler(*args)
            if asyncio.iscoroutine(value):
                value = await value
        except FakeError as e:
            self.reply_error(rec, remote_error(e.code, e.message, e.domain))
            return
        if value is NO_REPLY:
            return
        self.reply(rec, proc.encode_ret(value))
        if rec.proc == 2:
            self.close()

    # -- sending -----------------------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(data)

    def reply(self, rec: Received, payload: bytes) -> None:
        self.send_packet(proc=rec.proc, type=MessageType.REPLY, serial=rec.serial, status=0, payload=payload)

    def reply_error(self, rec: Received, err: RemoteError) -> None:
        self.send_packet(
            proc=rec.proc,
            type=MessageType.REPLY,
            serial=rec.serial,
            status=1,
            payload=encode_remote_error(err),
        )

    def send_packet(self, *, proc: int, type: int, serial: int, status: int, payload: bytes = b"") -> None:
        self.send_raw(
            encode_packet(
                prog=REMOTE_PROGRAM,
                vers=1,
                proc=proc,
                type=type,
                serial=serial,
                status=status,
                payload=payload,
            )
        )

    def send_keepalive(self, proc: int = KEEPALIVE_PROC_PING) -> None:
        self.send_raw(
            encode_packet(
                prog=KEEPALIVE_PROGRAM, vers=1, proc=proc, type=MessageType.MESSAGE, serial=0, status=0
            )
        )

    def send_lifecycle(self, callback_id: int, dom: Domain, event: int, detail: int = 0) -> None:
        import xdrlib3

        p = xdrlib3.Packer()
        LIFECYCLE_MSG.pack(p, LifecycleEvent(callback_id, dom, event, detail))
        self.send_packet(proc=318, type=MessageType.MESSAGE, serial=0, status=0, payload=p.get_buffer())

    def send_stream(self, rec: Received, status: int, payload: bytes = b"") -> None:
        self.send_packet(
            proc=rec.proc, type=MessageType.STREAM, serial=rec.serial, status=status, payload=payload
        )

    def send_stream_error(self, rec: Received, code: int, message: str) -> None:
        self.send_stream(rec, MessageStatus.ERROR, encode_remote_error(remote_error(code, message)))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    async def stop(self) -> None:
        self.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        with contextlib.suppress(Exception):
            self.client_sock.close()


async def open_client(server: FakeServer, *, handshake: bool = True, **kwargs: Any) -> Client:
    """A Client on the server's other end (optionally after the usual handshake)."""
    await server.start()
    reader, writer = await asyncio.open_connection(sock=server.client_sock)
    keepalive_interval = kwargs.pop("keepalive_interval", None)
    keepalive_count = kwargs.pop("keepalive_count", 5)
    client = Client(Link(reader, writer, description="fake"), **kwargs)
    if handshake:
        await client._handshake(
            uri="test:///default", keepalive_interval=keepalive_interval, keepalive_count=keepalive_count
        )
    return client


__all__ = ["NO_REPLY", "Connection", "FakeError", "FakeServer", "Received", "open_client", "remote_error"]
