"""The asyncio connection: one reader task, many calls in flight matched by serial, streams, events.

Why it is shaped this way:
- One reader task owns the socket's read side; it decodes every packet and completes the matching future,
  feeds the matching stream, or queues the event for its subscription. Callers never read.
- Every packet is written with synchronous `write()` calls and no `await` between a packet's parts, so
  packets from concurrent calls can never interleave; only stream uploads wait for the buffer to drain.
- Every call has a deadline, enforced with a timer on the call's future (no task per call). A call that
  times out or is cancelled leaves the serial map at once, so its late reply is recognised and dropped.
- Events go to a bounded per-subscription queue that the reader never waits on: a slow consumer loses
  events (and is told so with EventsLost), it never stalls replies.
- A download whose consumer falls behind pauses the reader (bounded memory beats unbounded buffering);
  the keepalive check does not count that pause as peer silence.
- When the link dies (EOF, error, keepalive timeout, malformed input) every waiter fails at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .constants import MessageType
from .errors import (
    ConnectionLost,
    DeadlineExceeded,
    ProtocolError,
    error_from_remote,
)
from .framing import Header, PacketDecoder
from .link import WRITE_HIGH_WATER, Link
from .messages import (
    PING,
    PONG,
    ErrorReply,
    EventMessage,
    Ping,
    Reply,
    StreamData,
    StreamFailed,
    StreamFinished,
    classify,
    encode_call,
    encode_stream_abort,
)
from .observe import CallRecord, Observer
from .procedures import BY_NUMBER, LIFECYCLE_MSG, PROC_DOMAIN_EVENT_CALLBACK_LIFECYCLE, Procedure
from .streams import StreamState
from .types import LifecycleEvent
from .xdr import Reader

if TYPE_CHECKING:
    from .events import LifecycleSubscription

READ_SIZE = 256 * 1024
DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_KEEPALIVE_INTERVAL = 5.0
DEFAULT_KEEPALIVE_COUNT = 5
DEFAULT_EVENT_QUEUE = 10000
#: A download buffers at most this much before the reader waits for its consumer.
DOWNLOAD_HIGH_WATER = 8 * 1024 * 1024

PROC_CONNECT_CLOSE = 2


@dataclass(slots=True)
class _Pending:
    proc: Procedure
    fut: asyncio.Future[Any]
    on_reply: Callable[[Any], None] | None


class Connection:
    """A libvirt RPC connection over one Link. Use the Client subclass; this is its generic machinery."""

    def __init__(
        self,
        link: Link,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        observer: Observer | None = None,
        event_queue_max: int = DEFAULT_EVENT_QUEUE,
        download_high_water: int = DOWNLOAD_HIGH_WATER,
    ) -> None:
        if call_timeout is None or call_timeout <= 0:
            raise ValueError(f"call_timeout must be a positive number of seconds, got {call_timeout!r}")
        self._loop = asyncio.get_running_loop()
        self._link = link
        self.call_timeout = float(call_timeout)
        self.observer = observer
        self._event_queue_max = event_queue_max
        self._download_high_water = download_high_water
        self._decoder = PacketDecoder()
        self._pending: dict[int, _Pending] = {}
        self._streams: dict[int, StreamState] = {}
        self._subs: dict[int, LifecycleSubscription] = {}
        self._serial = 0
        self._lost: BaseException | None = None
        self._closing = False
        self._last_rx = self._loop.time()
        self._throttle: asyncio.Future[None] | None = None
        self._keepalive_task: asyncio.Task[None] | None = None
        self.keepalive_interval: float | None = None
        self.keepalive_count = 0
        #: Replies that arrived for calls no longer waiting (timed out or cancelled): dropped.
        self.late_replies = 0
        self.pings_received = 0
        self.pongs_received = 0
        self._reader_task = self._loop.create_task(
            self._read_loop(), name=f"libvirt-reader {link.description}"
        )

    # -- state ------------------------------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        return self._lost is None

    @property
    def description(self) -> str:
        return self._link.description

    def _check_open(self) -> None:
        if self._lost is not None:
            raise ConnectionLost(f"connection to {self._link.description} is closed: {self._lost}")

    def _next_serial(self) -> int:
        self._serial = (self._serial + 1) & 0xFFFFFFFF or 1
        return self._serial

    # -- the generic call path -------------------------------------------------------------------

    async def call(
        self,
        proc: Procedure | int,
        args: Sequence[Any] = (),
        *,
        timeout: float | None = None,
        on_reply: Callable[[Any], None] | None = None,
    ) -> Any:
        """Send one call and return its decoded result (see Procedure.decode_ret)."""
        procedure = proc if isinstance(proc, Procedure) else BY_NUMBER[proc]
        if procedure.stream:
            raise TypeError(f"{procedure.method} opens a stream: use the client's method for it")
        started = time.perf_counter()
        try:
            result = await self._roundtrip(procedure, args, timeout=timeout, on_reply=on_reply)
        except BaseException as e:
            if self.observer is not None and not isinstance(e, TypeError | ValueError):
                self._observe(procedure, args, None, e, started)
            raise
        if self.observer is not None:
            self._observe(procedure, args, result, None, started)
        return result

    async def _roundtrip(
        self,
        procedure: Procedure,
        args: Sequence[Any],
        *,
        timeout: float | None,
        on_reply: Callable[[Any], None] | None = None,
        stream: StreamState | None = None,
    ) -> Any:
        self._check_open()
        payload = procedure.encode_args(args)
        deadline = self.call_timeout if timeout is None else timeout
        if deadline <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        serial = self._next_serial()
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending[serial] = _Pending(procedure, fut, on_reply)
        if stream is not None:
            stream.serial = serial
            self._streams[serial] = stream
        timer = self._loop.call_later(deadline, self._expire, serial, deadline)
        try:
            self._link.write(encode_call(proc=procedure.number, serial=serial, payload=payload))
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(serial, None)

    def _expire(self, serial: int, deadline: float) -> None:
        p = self._pending.pop(serial, None)
        if p is not None and not p.fut.done():
            p.fut.set_exception(
                DeadlineExceeded(
                    f"{p.proc.method}: no reply from {self._link.description} within {deadline:g} s"
                )
            )

    def _observe(
        self,
        procedure: Procedure,
        args: Sequence[Any],
        result: Any,
        error: BaseException | None,
        started: float,
    ) -> None:
        names = [n for n, _ in procedure.args.fields] if procedure.args else []
        record = CallRecord(
            procedure=procedure.name,
            method=procedure.method,
            args=dict(zip(names, args, strict=False)),
            result=result,
            error=error,
            duration=time.perf_counter() - started,
        )
        # An observer's bug must not break the call it observes.
        with contextlib.suppress(Exception):
            self.observer(record)  # type: ignore[misc]

    # -- the reader task -------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        link = self._link
        decoder = self._decoder
        dispatch = self._dispatch
        loop = self._loop
        try:
            while True:
                data = await link.read(READ_SIZE)
                if not data:
                    if self._closing:
                        raise ConnectionLost(f"connection to {link.description} closed by the client")
                    where = "" if decoder.at_boundary() else " in the middle of a packet"
                    raise ConnectionLost(f"connection closed by {link.description}{where}")
                self._last_rx = loop.time()
                for packet in decoder.feed(data):
                    try:
                        event = classify(packet)
                    except ProtocolError as e:
                        if self._fail_one(packet.header, e):
                            continue  # framing is intact: only that call (or stream) is lost
                        raise
                    dispatch(event)
                while self._throttle is not None:
                    await self._throttle
                    self._last_rx = loop.time()
        except asyncio.CancelledError:
            self._fail(ConnectionLost(f"connection to {link.description} closed by the client"))
            raise
        except (ProtocolError, ConnectionLost) as e:
            self._fail(e)
        except Exception as e:
            self._fail(ConnectionLost(f"connection to {link.description} lost: {e or type(e).__name__}"))

    def _fail_one(self, header: Header, exc: ProtocolError) -> bool:
        """A malformed body (e.g. a remote_error) in a reply or stream packet: fail just its owner."""
        if header.type == MessageType.REPLY:
            p = self._pending.pop(header.serial, None)
            if p is not None and not p.fut.done():
                p.fut.set_exception(exc)
                self._streams.pop(header.serial, None)
                return True
        elif header.type == MessageType.STREAM:
            stream = self._streams.get(header.serial)
            if stream is not None:
                stream.fail(exc)
                return True
        return False

    def _dispatch(self, ev: Any) -> None:
        kind = type(ev)
        if kind is Reply or kind is ErrorReply:
            p = self._pending.pop(ev.serial, None)
            if p is None or p.fut.done():
                self.late_replies += 1
                return
            if ev.proc != p.proc.number:
                p.fut.set_exception(
                    ProtocolError(
                        f"reply to serial {ev.serial} names procedure {ev.proc}, not {p.proc.number}"
                    )
                )
                return
            if kind is ErrorReply:
                p.fut.set_exception(error_from_remote(ev.error))
                stream = self._streams.pop(ev.serial, None)
                if stream is not None:
                    stream.fail(error_from_remote(ev.error))
                return
            try:
                value = p.proc.decode_ret(ev.payload)
                if p.on_reply is not None:
                    p.on_reply(value)
            except ProtocolError as e:
                p.fut.set_exception(e)
                return
            p.fut.set_result(value)
        elif kind is StreamData or kind is StreamFinished or kind is StreamFailed:
            stream = self._streams.get(ev.serial)
            if stream is None or stream.proc.number != ev.proc:
                return  # an aborted stream's tail
            stream.on_event(ev)
            if stream.buffered > self._download_high_water and self._throttle is None:
                self._throttle = self._loop.create_future()
        elif kind is EventMessage:
            if ev.proc == PROC_DOMAIN_EVENT_CALLBACK_LIFECYCLE:
                r = Reader(ev.payload, what="lifecycle event")
                event: LifecycleEvent = LIFECYCLE_MSG.unpack(r)
                r.finish()
                sub = self._subs.get(event.callback_id)
                if sub is not None:
                    sub._push(event)
        elif kind is Ping:
            self.pings_received += 1
            # A peer that pings but never reads would grow our send buffer without bound: answer only
            # while it is draining (one PONG answers any number of PINGs anyway).
            if self._lost is None and self._link.write_buffer_size() < WRITE_HIGH_WATER:
                self._link.write(PONG)
        else:  # Pong: liveness is already recorded
            self.pongs_received += 1

    def _release_throttle(self) -> None:
        t = self._throttle
        if t is None:
            return
        if any(s.buffered > self._download_high_water // 2 for s in self._streams.values()):
            return
        self._throttle = None
        if not t.done():
            t.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        """The link is gone: fail every waiter at once, each with its own exception instance."""
        if self._lost is not None:
            return
        self._lost = exc
        cls = type(exc) if isinstance(exc, ProtocolError | ConnectionLost) else ConnectionLost
        msg = str(exc)
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if not p.fut.done():
                p.fut.set_exception(cls(msg))
        streams, self._streams = self._streams, {}
        for s in streams.values():
            s.fail(cls(msg))
        subs, self._subs = self._subs, {}
        for sub in subs.values():
            sub._fail(cls(msg))
        if self._throttle is not None and not self._throttle.done():
            self._throttle.set_result(None)
        self._throttle = None
        if self._keepalive_task is not None and self._keepalive_task is not asyncio.current_task():
            self._keepalive_task.cancel()
        self._link.abort()

    # -- keepalive -------------------------------------------------------------------------------

    def _start_keepalive(self, *, interval: float, count: int) -> None:
        """PING after `interval` s of silence; declare the peer dead after interval x (count + 1) s."""
        if interval <= 0 or count < 0:
            raise ValueError(f"keepalive interval must be > 0 and count >= 0, got {interval!r}, {count!r}")
        self.keepalive_interval = float(interval)
        self.keepalive_count = int(count)
        self._keepalive_task = self._loop.create_task(self._keepalive_loop(), name="libvirt-keepalive")

    async def _keepalive_loop(self) -> None:
        interval = self.keepalive_interval or 0.0
        dead_after = interval * (self.keepalive_count + 1)
        last_ping = 0.0
        while self._lost is None:
            now = self._loop.time()
            if self._throttle is not None:
                self._last_rx = now  # we stopped reading on purpose: not the peer's silence
            idle = now - self._last_rx
            if idle >= dead_after:
                self._fail(
                    ConnectionLost(
                        f"no data from {self._link.description} for {idle:.1f} s "
                        f"(keepalive: interval {interval:g} s x {self.keepalive_count + 1})"
                    )
                )
                return
            if idle >= interval and now - last_ping >= interval:
                last_ping = now
                try:
                    self._link.write(PING)
                except ConnectionLost as e:
                    self._fail(e)
                    return
            wake_in = min(
                interval - (now - last_ping) if idle >= interval else interval - idle, dead_after - idle
            )
            await asyncio.sleep(max(wake_in, 0.01))

    # -- streams ---------------------------------------------------------------------------------

    async def _open_stream(
        self, procedure: Procedure, args: Sequence[Any], *, timeout: float | None
    ) -> StreamState:
        stream = StreamState(proc=procedure, serial=0)
        try:
            await self._roundtrip(procedure, args, timeout=timeout, stream=stream)
        except BaseException:
            self._streams.pop(stream.serial, None)
            raise
        return stream

    def _close_stream(self, stream: StreamState, *, abort: bool) -> None:
        if self._streams.pop(stream.serial, None) is not None and abort and self._lost is None:
            with contextlib.suppress(ConnectionLost):  # the link is gone: nothing left to abort
                self._link.write(encode_stream_abort(proc=stream.proc.number, serial=stream.serial))
        stream.chunks.clear()
        stream.buffered = 0
        self._release_throttle()

    async def _wait_stream(self, stream: StreamState, timeout: float, *, what: str) -> None:
        waiter = stream.new_waiter()
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            raise DeadlineExceeded(
                f"{stream.proc.method}: {what}: nothing from {self._link.description} within {timeout:g} s"
            ) from None

    async def _drain_for(self, stream: StreamState, timeout: float) -> None:
        """Wait for the write buffer to drain, but return at once if the server fails the stream."""
        if self._link.write_buffer_size() < WRITE_HIGH_WATER:
            return
        drain = self._loop.create_task(self._link.drain())
        waiter = stream.new_waiter()
        try:
            done, _ = await asyncio.wait(
                {drain, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not drain.done():
                drain.cancel()
                with contextlib.suppress(BaseException):
                    await drain
        if stream.error is not None:
            raise stream.error
        if drain in done:
            exc = drain.exception()
            if exc is not None:
                raise ConnectionLost(f"connection to {self._link.description} lost: {exc}") from exc
        elif not done:
            raise DeadlineExceeded(
                f"{stream.proc.method}: {self._link.description} accepted no data for {timeout:g} s"
            )
