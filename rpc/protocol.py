"""The client side of libvirt's RPC protocol as a sans-IO state machine (h11's shape).

`ClientProtocol` owns every piece of protocol state: serials, pending calls and their deadlines,
streams, the tombstones of abandoned calls, event subscriptions and keepalive. It does no I/O and reads
no clock: bytes go in through `receive_data(data, now)` and come back as events; calls go in through
`send_call(...)` and come back as bytes; time goes in through `tick(now)`. Bytes the protocol must send
on its own (PONG, a stream abort, the deregistration of an abandoned callback, a keepalive PING) wait in
`data_to_send()`. The asyncio shell (connection.py) only moves bytes and completes futures, so every
rule below is tested with bytes and a fake clock (tests/unit/rpc/test_rpc_protocol.py).

The rules it keeps (the why of each is in docs/rpc.md):
- A call that is abandoned (deadline, cancel) leaves the pending map at once; its late reply is dropped,
  and if that call opens server-side state (a stream, an event registration) it leaves a tombstone so
  the late reply's state is undone (stream abort, deregistration) rather than leaked on the daemon.
- A download buffers at most `download_high_water` unread bytes; past it that download alone fails.
- A malformed reply or stream body fails only its owner; malformed framing is fatal (nothing after it
  can be trusted) and turns into one ConnectionClosed event.
- Packets the client cannot use but whose framing is intact (REPLY_WITH_FDS, STREAM_HOLE) fail the call
  or stream they belong to and leave the connection up.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import heapq
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .agentevent import AgentLifecycleEvent
from .constants import (
    KEEPALIVE_PROGRAM,
    LEN_SIZE,
    MESSAGE_MAX,
    MIN_PACKET,
    REMOTE_PROGRAM,
    DomainEventID,
    MessageStatus,
    MessageType,
)
from .errors import (
    ConnectionLost,
    DeadlineExceeded,
    DownloadOverrun,
    MalformedEvent,
    ProtocolError,
    error_from_remote,
)
from .framing import Header, PacketDecoder
from .messages import (
    PING,
    PONG,
    ErrorReply,
    EventMessage,
    Ping,
    Pong,
    Reply,
    StreamData,
    StreamFailed,
    StreamFinished,
    Unsupported,
    classify,
    encode_call,
    encode_stream_abort,
    encode_stream_finish,
    stream_data_header,
)
from .procedures import (
    BY_NUMBER,
    LIFECYCLE_MSG,
    PROC_DOMAIN_EVENT_CALLBACK_LIFECYCLE,
    REMOTE_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE_MSG,
    Procedure,
)
from .protocol_constants import (
    REMOTE_PROC_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE as PROC_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE,
)
from .trace import Direction, PacketTrace, Tracer, describe, proc_name
from .types import LifecycleEvent
from .xdr import Reader

#: A download buffers at most this much unread; past it the download fails (DownloadOverrun).
DOWNLOAD_HIGH_WATER = 8 * 1024 * 1024
#: At most this many abandoned calls are remembered for undoing their late replies (oldest forgotten).
MAX_TOMBSTONES = 1024

PROC_REGISTER_ANY = 316
PROC_DEREGISTER_ANY = 317


class StreamKind(enum.Enum):
    UPLOAD = "upload"
    DOWNLOAD = "download"


# -- events (what receive_data / tick report) --------------------------------------------------------


@dataclass(slots=True)
class CallDone:
    """The reply to a call: `value` is the decoded return value."""

    serial: int
    token: Any
    value: Any


@dataclass(slots=True)
class CallFailed:
    """A call failed alone: an error reply, a malformed reply, its deadline, a reply it cannot use."""

    serial: int
    token: Any
    error: BaseException


@dataclass(slots=True)
class StreamChanged:
    """A stream got data, its end, its confirmation or an error: whoever waits on it looks again."""

    stream: Stream


@dataclass(slots=True)
class LifecycleReceived:
    callback_id: int
    event: LifecycleEvent


@dataclass(slots=True)
class AgentLifecycleReceived:
    callback_id: int
    event: AgentLifecycleEvent


@dataclass(slots=True)
class EventMalformed:
    """A well-framed event of kind `event_id` whose body did not decode, for the subscription whose
    callback id its first int names: dropped, and only that event (the connection and the subscription
    stay)."""

    callback_id: int
    event_id: DomainEventID
    error: MalformedEvent


@dataclass(slots=True)
class SubscriptionFailed:
    """The connection closed with this subscription open (`close`, the only emitter): it has ended, and
    its consumer is told why. Always followed by the ConnectionClosed."""

    callback_id: int
    error: ConnectionLost


@dataclass(slots=True)
class ConnectionClosed:
    """The connection is unusable (EOF, malformed framing, keepalive timeout, closed by the client).
    Every pending call, stream and subscription has failed with it; nothing follows this event."""

    error: ConnectionLost


Event = (CallDone | CallFailed | StreamChanged | LifecycleReceived | AgentLifecycleReceived | EventMalformed
         | SubscriptionFailed | ConnectionClosed)


# -- state --------------------------------------------------------------------------------------------


class Stream:
    """One data stream (upload or download): its buffered data and how far it got."""

    __slots__ = ("buffered", "chunks", "eof", "error", "finished", "kind", "open", "proc", "serial")

    def __init__(self, *, proc: Procedure, serial: int) -> None:
        self.proc = proc
        self.serial = serial
        self.kind = StreamKind(proc.stream)
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.open = False  # the call's reply arrived: the daemon holds the stream
        self.eof = False  # download: the zero-length CONTINUE arrived
        self.finished = False  # server sent STREAM/OK
        self.error: BaseException | None = None

    def take(self) -> bytes | None:
        if not self.chunks:
            return None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        return chunk

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc


@dataclass(slots=True)
class _Call:
    proc: Procedure
    token: Any
    deadline: float
    timeout: float
    plain: bool  # opens nothing on the daemon (no stream, no event registration)


_CALL = int(MessageType.CALL)
_REPLY = int(MessageType.REPLY)
_OK = int(MessageStatus.OK)
#: length word + header (prog, vers, proc, type, serial, status): a call's 28 bytes in one pack
_CALL_HEADER = struct.Struct(">IIIiiII")
#: the largest call payload a packet can carry
_MAX_CALL_PAYLOAD = MESSAGE_MAX + LEN_SIZE - MIN_PACKET
#: the largest packet, length word included
_MAX_PACKET = MESSAGE_MAX + LEN_SIZE


@dataclass(slots=True)
class _StreamTally:
    """Trace summary of one stream's data packets in one direction."""

    proc: int
    packets: int = 0
    bytes: int = 0


class ClientProtocol:
    """All of a client connection's protocol state; see the module docstring."""

    def __init__(
        self,
        *,
        now: float,
        download_high_water: int = DOWNLOAD_HIGH_WATER,
        tracer: Tracer | None = None,
        description: str = "libvirtd",
    ) -> None:
        if not isinstance(download_high_water, int) or download_high_water <= 0:
            raise ValueError(f"download_high_water must be a positive size, got {download_high_water!r}")
        self.description = description
        self._download_high_water = download_high_water
        self._decoder = PacketDecoder()
        self._serial = 0
        self._pending: dict[int, _Call] = {}
        self._deadlines: list[tuple[float, int]] = []  # heap; entries of finished calls are skipped
        self._streams: dict[int, Stream] = {}
        #: serial -> procedure of abandoned calls whose late reply may have opened server-side state;
        #: None marks our own fire-and-forget cleanup calls, whose replies are dropped silently.
        self._tombstones: dict[int, Procedure | None] = {}
        #: callback id -> serial of the REGISTER_ANY call that made it
        self._subs: dict[int, int] = {}
        self._outbox: list[bytes] = []
        self._closed: ConnectionLost | None = None
        self._tracer = tracer
        self._tally: dict[tuple[Direction, int], _StreamTally] = {}
        # keepalive
        self.last_rx = now
        self._last_ping = now
        self.keepalive_interval: float | None = None
        self.keepalive_count = 0
        # counters
        self.late_replies = 0
        self.pings_received = 0
        self.pongs_received = 0
        #: Events (of either kind) dropped because their body was malformed (framing intact, so not fatal).
        self.bad_events = 0
        #: Packets refused without dropping the connection (FD passing, stream holes).
        self.unsupported_packets = 0
        self.write_backlog: Callable[[], int] = lambda: 0  # the shell tells how full its send buffer is

    # -- state ----------------------------------------------------------------------------------------

    @property
    def closed(self) -> ConnectionLost | None:
        """Why the connection is unusable, or None while it is up."""
        return self._closed

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def streams(self) -> dict[int, Stream]:
        """Open streams by serial (read-only use)."""
        return self._streams

    @property
    def tombstones(self) -> int:
        return len(self._tombstones)

    @property
    def subscriptions(self) -> frozenset[int]:
        return frozenset(self._subs)

    @property
    def at_boundary(self) -> bool:
        return self._decoder.at_boundary()

    def data_to_send(self) -> bytes:
        """Bytes the protocol queued on its own (PONG, aborts, cleanup calls, PING); empty if none."""
        if not self._outbox:
            return b""
        out, self._outbox = self._outbox, []
        return out[0] if len(out) == 1 else b"".join(out)

    def _check_open(self) -> None:
        if self._closed is not None:
            raise ConnectionLost(f"connection to {self.description} is closed: {self._closed}")

    def _next_serial(self) -> int:
        self._serial = (self._serial + 1) & 0xFFFFFFFF or 1
        return self._serial

    # -- calls in, bytes out --------------------------------------------------------------------------

    def send_call(
        self, procedure: Procedure, args: Sequence[Any], *, now: float, timeout: float, token: Any = None
    ) -> tuple[int, bytes]:
        """Encode one call; returns its serial and the packet to write. A stream procedure's call opens a
        Stream (see `stream`), which becomes usable when its CallDone arrives."""
        if self._closed is not None:
            self._check_open()
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        payload = procedure.encode_args(args)
        serial = self._serial = (self._serial + 1) & 0xFFFFFFFF or 1
        deadline = now + timeout
        stream = procedure.stream
        pending = self._pending
        plain = not stream and procedure.number != PROC_REGISTER_ANY
        pending[serial] = _Call(procedure, token, deadline, timeout, plain)
        deadlines = self._deadlines
        heapq.heappush(deadlines, (deadline, serial))
        if len(deadlines) > 2 * len(pending) + 64:
            self._deadlines = [(d, s) for d, s in deadlines if s in pending]
            heapq.heapify(self._deadlines)
        if stream:
            self._streams[serial] = Stream(proc=procedure, serial=serial)
        if len(payload) > _MAX_CALL_PAYLOAD:
            del pending[serial]
            encode_call(proc=procedure.number, serial=serial, payload=payload)  # raises, naming the size
        data = (
            _CALL_HEADER.pack(
                MIN_PACKET + len(payload), REMOTE_PROGRAM, 1, procedure.number, _CALL, serial, _OK
            )
            + payload
        )
        if self._tracer is not None:
            self._trace_out(data)
        return serial, data

    def stream(self, serial: int) -> Stream | None:
        return self._streams.get(serial)

    def abandon(self, serial: int) -> None:
        """The caller stopped waiting for call `serial` (deadline, cancel). Its late reply will be
        dropped; whatever it opened (or will open) on the daemon is undone."""
        call = self._pending.pop(serial, None)
        if self._closed is not None:
            self._streams.pop(serial, None)
            return
        if call is not None:
            self._streams.pop(serial, None)
            if call.proc.stream or call.proc.number == PROC_REGISTER_ANY:
                self._remember(serial, call.proc)
            return
        # The reply already came: undo what it opened.
        stream = self._streams.get(serial)
        if stream is not None:
            self.close_stream(stream, abort=True)
            return
        for callback_id, by in self._subs.items():
            if by == serial:
                self.unsubscribe(callback_id, notify_server=True)
                return

    def _remember(self, serial: int, procedure: Procedure | None) -> None:
        while len(self._tombstones) >= MAX_TOMBSTONES:
            del self._tombstones[next(iter(self._tombstones))]
        self._tombstones[serial] = procedure

    def _send_and_forget(self, procedure: Procedure, args: Sequence[Any]) -> None:
        """A cleanup call made by the protocol itself; its reply is dropped."""
        serial = self._next_serial()
        self._remember(serial, None)
        data = encode_call(proc=procedure.number, serial=serial, payload=procedure.encode_args(args))
        self._queue(data)

    def _queue(self, data: bytes) -> None:
        if self._tracer is not None:
            self._trace_out(data)
        self._outbox.append(data)

    # -- streams: the caller's side -------------------------------------------------------------------

    def send_stream_data(self, stream: Stream, length: int) -> bytes:
        """The 28 bytes to write before `length` bytes of upload data (the data is written as is)."""
        self._check_stream(stream)
        header = stream_data_header(proc=stream.proc.number, serial=stream.serial, length=length)
        if self._tracer is not None:
            t = self._tally.get((Direction.OUT, stream.serial))
            if t is None:
                t = self._tally[(Direction.OUT, stream.serial)] = _StreamTally(stream.proc.number)
            t.packets += 1
            t.bytes += len(header) + length
        return header

    def finish_stream(self, stream: Stream) -> bytes:
        """STREAM/OK: the end of an upload, or the acknowledgement of a download's end."""
        self._check_stream(stream)
        data = encode_stream_finish(proc=stream.proc.number, serial=stream.serial)
        if self._tracer is not None:
            self._trace_out(data)
        return data

    def _check_stream(self, stream: Stream) -> None:
        self._check_open()
        if stream.error is not None:
            raise stream.error

    def close_stream(self, stream: Stream, *, abort: bool) -> None:
        """Forget a stream; with `abort`, tell the daemon to drop it too (queued in data_to_send)."""
        if self._streams.pop(stream.serial, None) is not None and abort and self._closed is None:
            self._queue(encode_stream_abort(proc=stream.proc.number, serial=stream.serial))
        stream.chunks.clear()
        stream.buffered = 0
        self._summarise(stream.serial)

    # -- subscriptions ---------------------------------------------------------------------------------

    def unsubscribe(self, callback_id: int, *, notify_server: bool) -> bool:
        """Stop routing a callback's events; with `notify_server`, queue its deregistration (fire and
        forget). Returns whether the callback was registered."""
        if self._subs.pop(callback_id, None) is None:
            return False
        if notify_server and self._closed is None:
            self._send_and_forget(BY_NUMBER[PROC_DEREGISTER_ANY], (callback_id,))
        return True

    # -- keepalive -----------------------------------------------------------------------------------

    def enable_keepalive(self, *, interval: float, count: int, now: float) -> None:
        """PING after `interval` s of silence; declare the peer dead after interval x (count + 1) s."""
        if interval <= 0 or count < 0:
            raise ValueError(f"keepalive interval must be > 0 and count >= 0, got {interval!r}, {count!r}")
        self.keepalive_interval = float(interval)
        self.keepalive_count = int(count)
        self.last_rx = now
        self._last_ping = now

    def next_wakeup(self) -> float | None:
        """The time `tick` next has something to do (a deadline, a keepalive step), or None."""
        if self._closed is not None:
            return None
        while self._deadlines and self._deadlines[0][1] not in self._pending:
            heapq.heappop(self._deadlines)
        wake = self._deadlines[0][0] if self._deadlines else None
        interval = self.keepalive_interval
        if interval is not None:
            # the next PING, or the moment the peer counts as dead, whichever is first
            ka = min(
                max(self.last_rx, self._last_ping) + interval,
                self.last_rx + interval * (self.keepalive_count + 1),
            )
            wake = ka if wake is None else min(wake, ka)
        return wake

    def tick(self, now: float) -> list[Event]:
        """Expire deadlines and run keepalive at time `now`."""
        events: list[Event] = []
        if self._closed is not None:
            return events
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, serial = heapq.heappop(heap)
            call = self._pending.get(serial)
            if call is None or call.deadline > now:
                continue
            self.abandon(serial)
            events.append(
                CallFailed(
                    serial,
                    call.token,
                    DeadlineExceeded(
                        f"{call.proc.method}: no reply from {self.description} within {call.timeout:g} s"
                    ),
                )
            )
        interval = self.keepalive_interval
        if interval is not None:
            idle = now - self.last_rx
            dead_after = interval * (self.keepalive_count + 1)
            if idle >= dead_after:
                events.extend(
                    self.close(
                        ConnectionLost(
                            f"no data from {self.description} for {idle:.1f} s "
                            f"(keepalive: interval {interval:g} s x {self.keepalive_count + 1})"
                        )
                    )
                )
            elif idle >= interval and now - self._last_ping >= interval:
                self._last_ping = now
                self._queue(PING)
        return events

    # -- bytes in, events out --------------------------------------------------------------------------

    def receive_data(self, data: bytes, *, now: float) -> list[Event]:
        """Feed what the transport read; b"" is EOF. Returns what happened, in order."""
        if self._closed is not None:
            return []
        self.last_rx = now
        if not data:
            where = "" if self._decoder.at_boundary() else " in the middle of a packet"
            return self.close(ConnectionLost(f"connection closed by {self.description}{where}"))
        # The commonest read of all: exactly one REPLY/OK to a plain call, nothing buffered before it.
        # Its header is read with one unpack and matched without building a Header or Packet; anything
        # else (or any doubt) takes the general path below, which checks every field.
        if self._tracer is None and len(data) >= MIN_PACKET and type(data) is bytes:
            length, prog, vers, proc, type_, serial, status = _CALL_HEADER.unpack_from(data)
            if (
                length == len(data)
                and length <= _MAX_PACKET
                and type_ == _REPLY
                and status == _OK
                and prog == REMOTE_PROGRAM
                and vers == 1
                and self._decoder.at_boundary()
            ):
                call = self._pending.get(serial)
                if call is not None and call.plain and call.proc.number == proc:
                    del self._pending[serial]
                    try:
                        value = call.proc.decode_ret(data[MIN_PACKET:])
                    except ProtocolError as e:
                        return [CallFailed(serial, call.token, e)]
                    return [CallDone(serial, call.token, value)]
        try:
            packets = self._decoder.feed(data)
        except ProtocolError as e:
            return self.close(self._protocol_lost(e))
        events: list[Event] = []
        tracer = self._tracer
        pending = self._pending
        for packet in packets:
            header = packet.header
            if tracer is not None:
                self._trace_in(header, len(packet.payload))
            # The common case first, without building a message object: REPLY/OK to a plain call.
            if header.type == _REPLY and header.status == _OK and header.prog == REMOTE_PROGRAM:
                call = pending.get(header.serial)
                if call is not None and call.plain and call.proc.number == header.proc:
                    del pending[header.serial]
                    try:
                        value = call.proc.decode_ret(packet.payload)
                    except ProtocolError as e:
                        events.append(CallFailed(header.serial, call.token, e))
                        continue
                    events.append(CallDone(header.serial, call.token, value))
                    continue
            try:
                ev = classify(packet)
            except ProtocolError as e:
                if self._fail_one(packet.header, e, events):
                    continue
                events.extend(self.close(self._protocol_lost(e)))
                return events
            self._dispatch(ev, events)
            if self._closed is not None:
                return events
        return events

    def _protocol_lost(self, e: ProtocolError) -> ConnectionLost:
        lost = ConnectionLost(f"connection to {self.description} dropped: protocol error: {e}")
        lost.__cause__ = e
        return lost

    def _fail_one(self, header: Header, exc: ProtocolError, events: list[Event]) -> bool:
        """A malformed body (e.g. a remote_error) in a reply or stream packet: fail just its owner."""
        if header.type == MessageType.REPLY:
            call = self._pending.pop(header.serial, None)
            if call is not None:
                self._streams.pop(header.serial, None)
                events.append(CallFailed(header.serial, call.token, exc))
                return True
        elif header.type == MessageType.STREAM:
            stream = self._streams.get(header.serial)
            if stream is not None:
                stream._fail(exc)
                events.append(StreamChanged(stream))
                return True
        return False

    def _dispatch(self, ev: Any, events: list[Event]) -> None:
        kind = type(ev)
        if kind is Reply or kind is ErrorReply:
            call = self._pending.pop(ev.serial, None)
            if call is None:
                self._late_reply(ev)
                return
            if ev.proc != call.proc.number:
                self._streams.pop(ev.serial, None)
                events.append(
                    CallFailed(
                        ev.serial,
                        call.token,
                        ProtocolError(
                            f"reply to serial {ev.serial} names procedure {ev.proc}, not {call.proc.number}"
                        ),
                    )
                )
                return
            if kind is ErrorReply:
                self._streams.pop(ev.serial, None)
                events.append(CallFailed(ev.serial, call.token, error_from_remote(ev.error)))
                return
            try:
                value = call.proc.decode_ret(ev.payload)
            except ProtocolError as e:
                self._streams.pop(ev.serial, None)
                events.append(CallFailed(ev.serial, call.token, e))
                return
            if call.proc.stream:
                stream = self._streams.get(ev.serial)
                if stream is not None:
                    stream.open = True
            elif call.proc.number == PROC_REGISTER_ANY:
                self._subs[value] = ev.serial
            events.append(CallDone(ev.serial, call.token, value))
        elif kind is StreamData or kind is StreamFinished or kind is StreamFailed:
            stream = self._streams.get(ev.serial)
            if stream is None or stream.proc.number != ev.proc:
                return  # an aborted stream's tail
            self._on_stream(stream, ev)
            events.append(StreamChanged(stream))
        elif kind is EventMessage:
            if ev.proc == PROC_DOMAIN_EVENT_CALLBACK_LIFECYCLE:
                self._lifecycle_event(ev.payload, events)
            elif ev.proc == PROC_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE:
                self._agent_lifecycle_event(ev.payload, events)
        elif kind is Ping:
            self.pings_received += 1
            # A peer that pings but never reads would grow our send buffer without bound: answer only
            # while it drains (one PONG answers any number of PINGs anyway).
            if self.write_backlog() + len(self._outbox) * len(PONG) < PONG_BACKLOG_LIMIT:
                self._queue(PONG)
        elif kind is Pong:
            self.pongs_received += 1
        elif kind is Unsupported:
            self._unsupported(ev, events)

    def _unsupported(self, ev: Unsupported, events: list[Event]) -> None:
        """A packet whose framing is fine but whose meaning this client cannot take: fail its owner."""
        self.unsupported_packets += 1
        if ev.type == MessageType.REPLY_WITH_FDS:
            call = self._pending.pop(ev.serial, None)
            if call is None:
                self._late_reply(Reply(ev.serial, ev.proc, b""))  # undo nothing: we cannot read its value
                return
            self._streams.pop(ev.serial, None)
            events.append(
                CallFailed(
                    ev.serial,
                    call.token,
                    ProtocolError(
                        f"{call.proc.method}: the reply passes file descriptors (REPLY_WITH_FDS), which "
                        "this client does not accept; the call failed, the connection stays up"
                    ),
                )
            )
        elif ev.type == MessageType.STREAM_HOLE:
            stream = self._streams.get(ev.serial)
            if stream is None or stream.proc.number != ev.proc:
                return
            stream._fail(
                ProtocolError(
                    f"{stream.proc.method}: the daemon sent a sparse-stream hole (STREAM_HOLE), which this "
                    "client does not support; the stream was aborted, the connection stays up"
                )
            )
            self.close_stream(stream, abort=True)
            events.append(StreamChanged(stream))

    def _on_stream(self, stream: Stream, ev: StreamData | StreamFinished | StreamFailed) -> None:
        if isinstance(ev, StreamData):
            if stream.kind is StreamKind.UPLOAD:
                # Nobody would ever consume it, and buffering it could grow without bound: refuse.
                stream._fail(ProtocolError(f"{stream.proc.method}: server sent data on an upload stream"))
            elif stream.eof:
                pass  # nothing may follow the end of data; ignore rather than buffer
            elif ev.data:
                stream.chunks.append(ev.data)
                stream.buffered += len(ev.data)
                if stream.buffered > self._download_high_water:
                    self._overrun(stream)
            else:
                stream.eof = True
        elif isinstance(ev, StreamFinished):
            stream.finished = True
            self._summarise(stream.serial)
        else:
            stream._fail(error_from_remote(ev.error))
            self._summarise(stream.serial)

    def _overrun(self, stream: Stream) -> None:
        """A download's consumer fell too far behind: fail that download alone, never the connection."""
        mib = stream.buffered / (1024 * 1024)
        stream._fail(
            DownloadOverrun(
                f"{stream.proc.method}: the consumer fell {mib:.1f} MiB behind (download_high_water "
                f"{self._download_high_water} bytes); the download was aborted so that it does not stall "
                "other calls on this connection: read it faster, or give it a connection of its own"
            )
        )
        self.close_stream(stream, abort=True)

    def _late_reply(self, ev: Reply | ErrorReply) -> None:
        """A reply nobody waits for: drop it, undoing what it opened if its call was abandoned."""
        if ev.serial not in self._tombstones:
            self.late_replies += 1
            return
        proc = self._tombstones.pop(ev.serial)
        if proc is None:
            return  # the reply to one of our own cleanup calls
        self.late_replies += 1
        if type(ev) is not Reply or proc.number != ev.proc:
            return  # refused, or not what we sent: nothing was opened
        if proc.stream:
            self._queue(encode_stream_abort(proc=proc.number, serial=ev.serial))
            return
        try:  # PROC_REGISTER_ANY: the daemon registered a callback nobody listens to
            callback_id = proc.decode_ret(ev.payload)
        except ProtocolError:
            return
        self._send_and_forget(BY_NUMBER[PROC_DEREGISTER_ANY], (callback_id,))

    def _lifecycle_event(self, payload: bytes, events: list[Event]) -> None:
        event: LifecycleEvent | None = self._decode_event(payload, LIFECYCLE_MSG, DomainEventID.LIFECYCLE,
                                                          "lifecycle event", events)
        if event is not None and event.callback_id in self._subs:
            events.append(LifecycleReceived(event.callback_id, event))

    def _agent_lifecycle_event(self, payload: bytes, events: list[Event]) -> None:
        msg = self._decode_event(payload, REMOTE_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE_MSG,
                                 DomainEventID.AGENT_LIFECYCLE, "agent lifecycle event", events)
        if msg is not None and msg.callback_id in self._subs:
            events.append(AgentLifecycleReceived(msg.callback_id, AgentLifecycleEvent.from_msg(msg)))

    def _decode_event(self, payload: bytes, struct: Any, event_id: DomainEventID, what: str,
                      events: list[Event]) -> Any:
        """One event body, or None. A malformed body is dropped and counted: the framing is intact (the
        decoder is at the next packet's start), so it is no reason to drop the connection, nor to end a
        subscription that the next event may reach well formed. The subscription it can still be traced
        to hears of it (EventMalformed) in the event's place."""
        try:
            r = Reader(payload, what=what)
            event = struct.unpack(r)
            r.finish()
        except ProtocolError as e:
            self.bad_events += 1
            # The callback id is the body's first int (when there is one).
            callback_id = int.from_bytes(payload[:4], "big", signed=True) if len(payload) >= 4 else None
            if callback_id is not None and callback_id in self._subs:
                error = MalformedEvent(f"malformed {what} for callback {callback_id}: {e}")
                events.append(EventMalformed(callback_id, event_id, error))
            return None
        return event

    # -- the end -----------------------------------------------------------------------------------

    def close(self, error: ConnectionLost) -> list[Event]:
        """The connection is gone (or being closed): fail everything; returns the one ConnectionClosed."""
        if self._closed is not None:
            return []
        self._closed = error
        msg, cause = str(error), error.__cause__

        def lost() -> ConnectionLost:
            e = ConnectionLost(msg)
            e.__cause__ = cause
            return e

        events: list[Event] = []
        pending, self._pending = self._pending, {}
        for serial, call in pending.items():
            events.append(CallFailed(serial, call.token, lost()))
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream._fail(lost())
            self._summarise(stream.serial)  # its trace summary, or the data it moved is never traced
            events.append(StreamChanged(stream))
        subs, self._subs = self._subs, {}
        for callback_id in subs:
            events.append(SubscriptionFailed(callback_id, lost()))
        self._tombstones.clear()
        self._deadlines.clear()
        self._outbox.clear()
        events.append(ConnectionClosed(error))
        return events

    # -- the wire trace ------------------------------------------------------------------------------

    def _trace_in(self, header: Header, payload_len: int) -> None:
        if header.type == MessageType.STREAM and header.status == MessageStatus.CONTINUE and payload_len:
            t = self._tally.get((Direction.IN, header.serial))
            if t is None:
                t = self._tally[(Direction.IN, header.serial)] = _StreamTally(header.proc)
            t.packets += 1
            t.bytes += payload_len + 28
            return
        self._emit(describe(Direction.IN, header, payload_len + 28))

    def _trace_out(self, data: bytes) -> None:
        from .framing import decode_header

        self._emit(describe(Direction.OUT, decode_header(data, 4), len(data)))

    def _summarise(self, serial: int) -> None:
        if self._tracer is None:
            return
        for direction in (Direction.OUT, Direction.IN):
            t = self._tally.pop((direction, serial), None)
            if t is not None:
                self._emit(
                    PacketTrace(
                        direction=direction,
                        program="REMOTE",
                        version=1,
                        procedure=proc_name(REMOTE_PROGRAM, t.proc),
                        type="STREAM",
                        serial=serial,
                        status="CONTINUE",
                        length=t.bytes,
                        packets=t.packets,
                    )
                )

    def _emit(self, record: PacketTrace) -> None:
        with contextlib.suppress(Exception):  # a tracer's bug must not break the protocol it watches
            self._tracer(record)  # type: ignore[misc]


#: Stop answering PINGs while this much is unsent: a peer that pings but never reads gets no more PONGs.
PONG_BACKLOG_LIMIT = 2 * 1024 * 1024


__all__ = [
    "DOWNLOAD_HIGH_WATER",
    "KEEPALIVE_PROGRAM",
    "MAX_TOMBSTONES",
    "REMOTE_PROGRAM",
    "CallDone",
    "CallFailed",
    "ClientProtocol",
    "ConnectionClosed",
    "Event",
    "LifecycleReceived",
    "Stream",
    "StreamChanged",
    "StreamKind",
    "SubscriptionFailed",
]
