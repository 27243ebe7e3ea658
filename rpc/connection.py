"""The asyncio shell around the sans-IO ClientProtocol: it moves bytes and completes futures, nothing more.

All protocol state and rules live in protocol.ClientProtocol (serials, pending calls and their
deadlines, streams, tombstones, subscriptions, keepalive). This shell:
- feeds every read from the link into the protocol and turns the events into future results, stream
  wake-ups and subscription pushes, synchronously, so nothing is ever reordered;
- writes every packet with synchronous `write()` calls and no `await` between a packet's parts, so
  packets from concurrent calls never interleave; only stream uploads wait for the buffer to drain;
- keeps ONE loop timer, armed at the protocol's next wakeup (the earliest deadline or keepalive step),
  instead of a timer per call.
The reader never waits on a consumer: events go to bounded per-subscription queues and downloads fail
alone when their consumer falls too far behind (both enforced by the protocol).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .constants import DomainEventID
from .errors import ConnectionLost, DeadlineExceeded, RpcError
from .link import WRITE_HIGH_WATER, BaseLink
from .observe import CallRecord, Observer
from .procedures import BY_NUMBER, Procedure
from .protocol import (
    DOWNLOAD_HIGH_WATER,
    MAX_TOMBSTONES,
    AgentLifecycleReceived,
    CallDone,
    CallFailed,
    ClientProtocol,
    ConnectionClosed,
    EventMalformed,
    LifecycleReceived,
    Stream,
    StreamChanged,
    SubscriptionFailed,
)
from .trace import Tracer

if TYPE_CHECKING:
    from .agentevent import AgentLifecycleEvent
    from .events import Subscription
    from .types import LifecycleEvent

    AnySubscription = Subscription[LifecycleEvent] | Subscription[AgentLifecycleEvent]

DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_KEEPALIVE_INTERVAL = 5.0
DEFAULT_KEEPALIVE_COUNT = 5
DEFAULT_EVENT_QUEUE = 10000

PROC_REGISTER_ANY = 316
PROC_DEREGISTER_ANY = 317

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_EVENT_QUEUE",
    "DEFAULT_KEEPALIVE_COUNT",
    "DEFAULT_KEEPALIVE_INTERVAL",
    "DOWNLOAD_HIGH_WATER",
    "MAX_TOMBSTONES",
    "Connection",
]


class Connection:
    """A libvirt RPC connection over one link. Use the Client subclass; this is its generic machinery."""

    def __init__(
        self,
        link: BaseLink,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        observer: Observer | None = None,
        event_queue_max: int = DEFAULT_EVENT_QUEUE,
        download_high_water: int = DOWNLOAD_HIGH_WATER,
        tracer: Tracer | None = None,
    ) -> None:
        if call_timeout is None or call_timeout <= 0:
            raise ValueError(f"call_timeout must be a positive number of seconds, got {call_timeout!r}")
        self._loop = asyncio.get_running_loop()
        self._link = link
        self.call_timeout = float(call_timeout)
        self.observer = observer
        self._event_queue_max = event_queue_max
        self._core = ClientProtocol(
            now=self._loop.time(),
            download_high_water=download_high_water,
            tracer=tracer,
            description=link.description,
        )
        self._core.write_backlog = link.write_buffer_size
        self._subs: dict[int, AnySubscription] = {}
        self._on_reply: dict[int, Callable[[Any], None]] = {}
        self._stream_waiters: dict[int, asyncio.Future[None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._closing = False
        self._closed = asyncio.Event()
        link.start(self)

    # -- state ------------------------------------------------------------------------------------

    @property
    def protocol(self) -> ClientProtocol:
        """The protocol state machine (read its state; drive it only through this connection)."""
        return self._core

    @property
    def is_connected(self) -> bool:
        return self._core.closed is None

    @property
    def description(self) -> str:
        return self._link.description

    @property
    def late_replies(self) -> int:
        """Replies that arrived for calls no longer waiting (timed out or cancelled): dropped."""
        return self._core.late_replies

    @property
    def pings_received(self) -> int:
        return self._core.pings_received

    @property
    def pongs_received(self) -> int:
        return self._core.pongs_received

    @property
    def bad_events(self) -> int:
        """Events dropped because their body was malformed (each also raised by its subscription's
        iterator as MalformedEvent, where one could be told)."""
        return self._core.bad_events

    @property
    def keepalive_interval(self) -> float | None:
        return self._core.keepalive_interval

    @property
    def keepalive_count(self) -> int:
        return self._core.keepalive_count

    def check_open(self) -> None:
        """ConnectionLost if the connection is closed."""
        lost = self._core.closed
        if lost is not None:
            raise ConnectionLost(f"connection to {self._link.description} is closed: {lost}")

    # -- the generic call path -------------------------------------------------------------------

    async def call(
        self,
        proc: Procedure | int,
        args: Sequence[Any] = (),
        *,
        timeout: float | None = None,
        on_reply: Callable[[Any], None] | None = None,
    ) -> Any:
        """Send one call and return its decoded result (see Procedure.decode_ret). `on_reply` runs with
        the value as the reply is read, before any later packet is handled."""
        procedure = proc if isinstance(proc, Procedure) else BY_NUMBER[proc]
        if procedure.stream:
            raise TypeError(f"{procedure.method} opens a stream: use the client's method for it")
        # One coroutine frame per call, no helper: this is the hot path (docs/performance.md).
        observer = self.observer
        started = time.perf_counter() if observer is not None else 0.0
        loop = self._loop
        fut = loop.create_future()
        now = loop.time()
        wait = self.call_timeout if timeout is None else timeout
        try:
            serial, data = self._core.send_call(procedure, args, now=now, timeout=wait, token=fut)
        except (TypeError, ValueError):
            raise  # bad arguments: nothing was sent, nothing to observe
        except BaseException as e:
            if observer is not None:
                self.record(procedure, args, None, e, started)
            raise
        if on_reply is not None:
            self._on_reply[serial] = on_reply
        try:
            self._link.write(data)
        except ConnectionLost as e:
            self._lost(e)
        if self._timer_at > now + wait:
            self._arm()
        try:
            result = await fut
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                self._core.abandon(serial)
                self._flush()
            if observer is not None:
                self.record(procedure, args, None, e, started)
            raise
        finally:
            if on_reply is not None:
                self._on_reply.pop(serial, None)
        if observer is not None:
            self.record(procedure, args, result, None, started)
        return result

    def record(
        self,
        procedure: Procedure,
        args: Sequence[Any],
        result: Any,
        error: BaseException | None,
        started: float,
    ) -> None:
        """Hand one finished call to the observer (streams call this at their end)."""
        if self.observer is None:
            return
        names = [n for n, _ in procedure.args.fields] if procedure.args else []
        rec = CallRecord(
            procedure=procedure.name,
            method=procedure.method,
            args=dict(zip(names, args, strict=False)),
            result=result,
            error=error,
            duration=time.perf_counter() - started,
        )
        # An observer's bug must not break the call it observes.
        with contextlib.suppress(Exception):
            self.observer(rec)

    # -- what the link feeds (link.Receiver) -------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        events = self._core.receive_data(data, now=self._loop.time())
        if events:
            self._handle(events)
        self._flush()

    def eof_received(self) -> None:
        if self._closing:
            self._lost(ConnectionLost(f"connection to {self._link.description} closed by the client"))
        else:
            self._handle(self._core.receive_data(b"", now=self._loop.time()))

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._core.closed is not None:
            return
        if self._closing:
            self._lost(ConnectionLost(f"connection to {self._link.description} closed by the client"))
        elif exc is None:
            self.eof_received()
        else:
            self._lost(
                ConnectionLost(f"connection to {self._link.description} lost: {exc or type(exc).__name__}")
            )

    def _flush(self) -> None:
        out = self._core.data_to_send()
        if out:
            try:
                self._link.write(out)
            except ConnectionLost as e:
                self._lost(e)

    def _lost(self, exc: ConnectionLost) -> None:
        self._handle(self._core.close(exc))

    def _handle(self, events: list[Any]) -> None:
        for ev in events:
            kind = type(ev)
            if kind is CallDone:
                fut = ev.token
                if not fut.done():
                    cb = self._on_reply.get(ev.serial)
                    if cb is not None:
                        try:
                            cb(ev.value)
                        except RpcError as e:
                            fut.set_exception(e)
                            continue
                    fut.set_result(ev.value)
            elif kind is CallFailed:
                fut = ev.token
                if not fut.done():
                    fut.set_exception(ev.error)
            elif kind is StreamChanged:
                w = self._stream_waiters.get(ev.stream.serial)
                if w is not None and not w.done():
                    w.set_result(None)
            elif kind is LifecycleReceived:
                sub = self._subs.get(ev.callback_id)
                if sub is not None and sub.event_id == DomainEventID.LIFECYCLE:
                    sub._push(ev.event)  # its event_id says which kind
            elif kind is AgentLifecycleReceived:
                sub = self._subs.get(ev.callback_id)
                if sub is not None and sub.event_id == DomainEventID.AGENT_LIFECYCLE:
                    sub._push(ev.event)
            elif kind is EventMalformed:
                sub = self._subs.get(ev.callback_id)
                if sub is not None and sub.event_id == ev.event_id:
                    sub._malformed(ev.error)
            elif kind is SubscriptionFailed:
                sub = self._subs.pop(ev.callback_id, None)
                if sub is not None:
                    sub._fail(ev.error)
            elif kind is ConnectionClosed:
                self._closed_down()

    def _closed_down(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        for sub in list(self._subs.values()):
            sub._fail(ConnectionLost(str(self._core.closed)))
        self._subs.clear()
        for w in self._stream_waiters.values():
            if not w.done():
                w.set_result(None)
        self._link.abort()
        self._closed.set()

    # -- time -------------------------------------------------------------------------------------

    def _arm(self) -> None:
        wake = self._core.next_wakeup()
        if wake is None or wake >= self._timer_at:
            if wake is None and self._timer is not None:
                self._timer.cancel()
                self._timer, self._timer_at = None, math.inf
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = wake
        self._timer = self._loop.call_at(wake, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        events = self._core.tick(self._loop.time())
        if events:
            self._handle(events)
        self._flush()
        self._arm()

    def _start_keepalive(self, *, interval: float, count: int) -> None:
        """PING after `interval` s of silence; declare the peer dead after interval x (count + 1) s."""
        self._core.enable_keepalive(interval=interval, count=count, now=self._loop.time())
        self._arm()

    # -- streams (used by streams.py) --------------------------------------------------------------

    async def open_stream(
        self, procedure: Procedure, args: Sequence[Any], *, timeout: float | None
    ) -> Stream:
        """Make a stream procedure's call; returns its open Stream once the daemon accepted it."""
        loop = self._loop
        fut = loop.create_future()
        wait = self.call_timeout if timeout is None else timeout
        now = loop.time()
        serial, data = self._core.send_call(procedure, args, now=now, timeout=wait, token=fut)
        stream = self._core.stream(serial)
        assert stream is not None
        try:
            self._link.write(data)
        except ConnectionLost as e:
            self._lost(e)
        self._arm()
        try:
            await fut
        except asyncio.CancelledError:
            self._core.abandon(serial)
            self._flush()
            raise
        return stream

    def stream_write(self, stream: Stream, chunk: bytes | memoryview) -> None:
        """Send one STREAM/CONTINUE packet. Data backed by immutable bytes goes out as the second part of
        one vectored write, uncopied (uvloop may hold it until the socket takes it); anything mutable is
        copied now, since its owner may reuse the buffer as soon as this returns."""
        header = self._core.send_stream_data(stream, len(chunk))
        if type(chunk) is bytes or (type(chunk) is memoryview and type(chunk.obj) is bytes):
            self._link.write_parts(header, chunk)
        else:
            self._link.write(header + chunk)

    def stream_finish(self, stream: Stream) -> None:
        self._link.write(self._core.finish_stream(stream))

    def close_stream(self, stream: Stream, *, abort: bool) -> None:
        self._core.close_stream(stream, abort=abort)
        self._stream_waiters.pop(stream.serial, None)
        self._flush()

    async def wait_stream(self, stream: Stream, timeout: float, *, what: str) -> None:
        """Wait until something happens to the stream (data, end, confirmation, error) or `timeout`."""
        waiter = self._loop.create_future()
        self._stream_waiters[stream.serial] = waiter
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            raise DeadlineExceeded(
                f"{stream.proc.method}: {what}: nothing from {self._link.description} within {timeout:g} s"
            ) from None
        finally:
            if self._stream_waiters.get(stream.serial) is waiter:
                del self._stream_waiters[stream.serial]

    def stream_waiter(self, stream: Stream) -> asyncio.Future[None]:
        """A future set when something happens to the stream (for racing it against other waits)."""
        waiter = self._loop.create_future()
        self._stream_waiters[stream.serial] = waiter
        return waiter

    async def drain_for(self, stream: Stream, timeout: float) -> None:
        """Wait for the write buffer to drain, but return at once if the server fails the stream."""
        if self._link.write_buffer_size() < WRITE_HIGH_WATER:
            return
        drain = self._loop.create_task(self._link.drain())
        waiter = self.stream_waiter(stream)
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

    # -- subscriptions (used by events.py) ---------------------------------------------------------

    async def subscribe(self, sub: AnySubscription, dom: Any, *, timeout: float | None) -> int:
        """Register `sub`'s kind of events; they are routed to it from the moment the reply is read."""

        installed: list[int] = []

        def install(callback_id: int) -> None:
            installed.append(callback_id)
            self._subs[callback_id] = sub

        try:
            callback_id: int = await self.call(PROC_REGISTER_ANY, (int(sub.event_id), dom), timeout=timeout,
                                            on_reply=install)
            return callback_id
        except BaseException:
            # Abandoned after the reply was read: the protocol already queued the deregistration.
            for callback_id in installed:
                self._subs.pop(callback_id, None)
            raise

    async def unsubscribe(self, callback_id: int, *, timeout: float | None) -> None:
        """Stop routing `callback_id` and deregister it on the daemon (if the connection is up)."""
        self._subs.pop(callback_id, None)
        if self._core.unsubscribe(callback_id, notify_server=False) and self.is_connected:
            with contextlib.suppress(RpcError):
                await self.call(PROC_DEREGISTER_ANY, (callback_id,), timeout=timeout)

    @property
    def event_queue_max(self) -> int:
        return self._event_queue_max
