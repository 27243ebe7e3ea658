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
- The reader never waits on a consumer. A download whose consumer falls `download_high_water` bytes
  behind fails alone (DownloadOverrun, aborted on the server, its buffer freed) rather than pausing the
  reader, which would stall every other call, event and PING on the connection.
- A call that opens server-side state (a stream, an event registration) and is abandoned (deadline,
  cancel) leaves a tombstone: if its late reply says the state was opened, the client undoes it (stream
  abort, deregistration) instead of letting the daemon push data or events nobody reads.
- When the link dies (EOF, error, keepalive timeout, malformed framing) every waiter fails at once with
  ConnectionLost; only the packet at fault (if it can be told apart) gets ProtocolError.
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
    DownloadOverrun,
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
#: A download buffers at most this much unread; past it the download fails (DownloadOverrun).
DOWNLOAD_HIGH_WATER = 8 * 1024 * 1024
#: At most this many abandoned calls are remembered for undoing their late replies (oldest forgotten).
MAX_TOMBSTONES = 1024

PROC_REGISTER_ANY = 316
PROC_DEREGISTER_ANY = 317


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
        if not isinstance(download_high_water, int) or download_high_water <= 0:
            raise ValueError(f"download_high_water must be a positive size, got {download_high_water!r}")
        self._download_high_water = download_high_water
        self._decoder = PacketDecoder()
        self._pending: dict[int, _Pending] = {}
        self._streams: dict[int, StreamState] = {}
        self._subs: dict[int, LifecycleSubscription] = {}
        self._serial = 0
        self._lost: BaseException | None = None
        self._closing = False
        self._last_rx = self._loop.time()
        #: serial -> procedure of abandoned calls whose late reply may have opened server-side state;
        #: None marks our own fire-and-forget cleanup calls, whose replies are dropped silently.
        self._tombstones: dict[int, Procedure | None] = {}
        #: Lifecycle events dropped because their body was malformed (framing intact, so not fatal).
        self.bad_events = 0
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
        except (DeadlineExceeded, asyncio.CancelledError):
            # Abandoned (not failed by the link) by a call that may open something on the daemon: undo it
            # now if the reply already came, else when its late reply comes.
            if self._lost is None and (procedure.stream or procedure.number == PROC_REGISTER_ANY):
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    self._undo(procedure, serial, fut.result())
                else:
                    self._remember(serial, procedure)
            raise
        finally:
            timer.cancel()
            self._pending.pop(serial, None)

    def _remember(self, serial: int, procedure: Procedure | None) -> None:
        while len(self._tombstones) >= MAX_TOMBSTONES:
            del self._tombstones[next(iter(self._tombstones))]
        self._tombstones[serial] = procedure

    def _late_reply(self, ev: Reply | ErrorReply) -> None:
        """A reply nobody waits for: drop it, undoing what it opened if its call was abandoned."""
        if ev.serial not in self._tombstones:
            self.late_replies += 1
            return
        proc = self._tombstones.pop(ev.serial)
        if proc is None:
            return  # the reply to one of our own cleanup calls
        self.late_replies += 1
        if type(ev) is not Reply or proc.number != ev.proc or self._lost is not None:
            return  # refused, or not what we sent: nothing was opened
        with contextlib.suppress(ProtocolError):
            self._undo(proc, ev.serial, None if proc.stream else proc.decode_ret(ev.payload))

    def _undo(self, proc: Procedure, serial: int, value: Any) -> None:
        """Close what an abandoned call opened: abort its stream, or deregister its event callback."""
        with contextlib.suppress(ConnectionLost):
            if proc.stream:
                self._link.write(encode_stream_abort(proc=proc.number, serial=serial))
            else:  # PROC_REGISTER_ANY: the daemon registered a callback (id `value`) nobody listens to
                self._send_and_forget(BY_NUMBER[PROC_DEREGISTER_ANY], (value,))

    def _send_and_forget(self, procedure: Procedure, args: Sequence[Any]) -> None:
        """Send a cleanup call from inside the reader (which cannot await); its reply is dropped."""
        serial = self._next_serial()
        self._remember(serial, None)
        payload = procedure.encode_args(args)
        self._link.write(encode_call(proc=procedure.number, serial=serial, payload=payload))

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
        except asyncio.CancelledError:
            self._fail(ConnectionLost(f"connection to {link.description} closed by the client"))
            raise
        except ConnectionLost as e:
            self._fail(e)
        except ProtocolError as e:
            # Framing is broken: nothing after this can be trusted, so the link is dropped. For every
            # waiter that is a lost connection (what callers reconnect on); the cause stays chained.
            lost = ConnectionLost(f"connection to {link.description} dropped: protocol error: {e}")
            lost.__cause__ = e
            self._fail(lost)
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
                self._late_reply(ev)
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
            if stream.buffered > self._download_high_water:
                self._overrun(stream)
        elif kind is EventMessage:
            if ev.proc == PROC_DOMAIN_EVENT_CALLBACK_LIFECYCLE:
                self._lifecycle_event(ev.payload)
        elif kind is Ping:
            self.pings_received += 1
            # A peer that pings but never reads would grow our send buffer without bound: answer only
            # while it is draining (one PONG answers any number of PINGs anyway).
            if self._lost is None and self._link.write_buffer_size() < WRITE_HIGH_WATER:
                self._link.write(PONG)
        else:  # Pong: liveness is already recorded
            self.pongs_received += 1

    def _lifecycle_event(self, payload: bytes) -> None:
        """Route one lifecycle event. A malformed body is dropped and counted: the framing is intact, so
        it is no reason to drop the connection; a subscription it can still be traced to is failed."""
        try:
            r = Reader(payload, what="lifecycle event")
            event: LifecycleEvent = LIFECYCLE_MSG.unpack(r)
            r.finish()
        except ProtocolError as e:
            self.bad_events += 1
            # The callback id is the body's first int; the subscription stays registered so that its
            # aclose() still deregisters it.
            callback_id = int.from_bytes(payload[:4], "big", signed=True) if len(payload) >= 4 else None
            sub = self._subs.get(callback_id) if callback_id is not None else None
            if sub is not None:
                sub._fail(ProtocolError(f"malformed lifecycle event for callback {sub.callback_id}: {e}"))
            return
        sub = self._subs.get(event.callback_id)
        if sub is not None:
            sub._push(event)

    def _overrun(self, stream: StreamState) -> None:
        """A download's consumer fell too far behind: fail that download alone, never the reader."""
        mib = stream.buffered / (1024 * 1024)
        stream.overrun(
            DownloadOverrun(
                f"{stream.proc.method}: the consumer fell {mib:.1f} MiB behind (download_high_water "
                f"{self._download_high_water} bytes); the download was aborted so that it does not stall "
                "other calls on this connection: read it faster, or give it a connection of its own"
            )
        )
        self._close_stream(stream, abort=True)

    def _fail(self, exc: BaseException) -> None:
        """The link is gone: fail every waiter at once, each with its own exception instance."""
        if self._lost is not None:
            return
        self._lost = exc
        msg = str(exc)
        cause = exc.__cause__

        def lost() -> ConnectionLost:
            e = ConnectionLost(msg)
            e.__cause__ = cause
            return e

        pending, self._pending = self._pending, {}
        for p in pending.values():
            if not p.fut.done():
                p.fut.set_exception(lost())
        streams, self._streams = self._streams, {}
        for s in streams.values():
            s.fail(lost())
        subs, self._subs = self._subs, {}
        for sub in subs.values():
            sub._fail(lost())
        self._tombstones.clear()
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
        drain_error: BaseException | None = None
        try:
            done, _ = await asyncio.wait(
                {drain, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not drain.done():
                drain.cancel()
                with contextlib.suppress(BaseException):
                    await drain
            elif not drain.cancelled():
                # Always retrieved, whatever is raised below: a drain that failed together with the
                # stream (a dropped connection fails both) must not log "exception was never retrieved".
                drain_error = drain.exception()
        if stream.error is not None:
            raise stream.error
        if drain_error is not None:
            raise ConnectionLost(
                f"connection to {self._link.description} lost: {drain_error}"
            ) from drain_error
        if not done:
            raise DeadlineExceeded(
                f"{stream.proc.method}: {self._link.description} accepted no data for {timeout:g} s"
            )
