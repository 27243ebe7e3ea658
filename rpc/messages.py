"""What a packet means, and the packets a client sends: the sans-IO layer between framing and I/O.

`classify(packet)` turns a decoded packet into one small immutable event (a reply, an error reply, an
event message, a stream chunk/end/error, a keepalive ping/pong); the `encode_*` functions build the
packets a client writes. Nothing here knows about sockets, tasks or time.
"""

from __future__ import annotations

from dataclasses import dataclass

from .constants import (
    KEEPALIVE_PROC_PING,
    KEEPALIVE_PROC_PONG,
    KEEPALIVE_PROGRAM,
    KEEPALIVE_PROTOCOL_VERSION,
    MIN_PACKET,
    REMOTE_PROGRAM,
    REMOTE_PROTOCOL_VERSION,
    MessageStatus,
    MessageType,
)
from .errors import ProtocolError
from .framing import Packet, encode_header, encode_packet
from .procedures import REMOTE_ERROR
from .types import RemoteError
from .xdr import Reader


@dataclass(frozen=True, slots=True)
class Reply:
    serial: int
    proc: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class ErrorReply:
    serial: int
    proc: int
    error: RemoteError


@dataclass(frozen=True, slots=True)
class EventMessage:
    proc: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class StreamData:
    """STREAM/CONTINUE: raw bytes; an empty payload is the end of a download."""

    serial: int
    proc: int
    data: bytes


@dataclass(frozen=True, slots=True)
class StreamFinished:
    serial: int
    proc: int


@dataclass(frozen=True, slots=True)
class StreamFailed:
    serial: int
    proc: int
    error: RemoteError


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    pass


@dataclass(frozen=True, slots=True)
class Unsupported:
    """A well-framed packet the receiver cannot use: a reply passing file descriptors (REPLY_WITH_FDS), a
    sparse-stream hole (STREAM_HOLE); on a server, a CALL_WITH_FDS. The framing is intact, so it fails
    only the call or stream it belongs to, never the connection."""

    serial: int
    proc: int
    type: int


Incoming = (
    Reply | ErrorReply | EventMessage | StreamData | StreamFinished | StreamFailed | Ping | Pong | Unsupported
)


def decode_remote_error(payload: bytes) -> RemoteError:
    r = Reader(payload, what="remote_error")
    try:
        err: RemoteError = REMOTE_ERROR.unpack(r)
    except EOFError:
        raise ProtocolError("remote_error: truncated") from None
    r.finish()
    return err


def encode_remote_error(err: RemoteError) -> bytes:
    import xdrlib3

    p = xdrlib3.Packer()
    REMOTE_ERROR.pack(p, err)
    return p.get_buffer()


def classify(packet: Packet) -> Incoming:
    """The meaning of one packet a server sent; ProtocolError for combinations a server never sends."""
    h = packet.header
    if h.prog == KEEPALIVE_PROGRAM:
        if h.type != MessageType.MESSAGE:
            raise ProtocolError(f"keepalive packet of type {h.type}")
        if h.proc == KEEPALIVE_PROC_PING:
            return Ping()
        if h.proc == KEEPALIVE_PROC_PONG:
            return Pong()
        raise ProtocolError(f"unknown keepalive procedure {h.proc}")
    if h.type == MessageType.REPLY:
        if h.status == MessageStatus.OK:
            return Reply(h.serial, h.proc, packet.payload)
        if h.status == MessageStatus.ERROR:
            return ErrorReply(h.serial, h.proc, decode_remote_error(packet.payload))
        raise ProtocolError(f"reply with status {h.status}")
    if h.type == MessageType.MESSAGE:
        return EventMessage(h.proc, packet.payload)
    if h.type == MessageType.STREAM:
        if h.status == MessageStatus.CONTINUE:
            return StreamData(h.serial, h.proc, packet.payload)
        if h.status == MessageStatus.OK:
            return StreamFinished(h.serial, h.proc)
        return StreamFailed(h.serial, h.proc, decode_remote_error(packet.payload))
    if h.type == MessageType.REPLY_WITH_FDS or h.type == MessageType.STREAM_HOLE:
        return Unsupported(h.serial, h.proc, h.type)
    raise ProtocolError(f"unexpected message type {h.type} from server")


def encode_call(*, proc: int, serial: int, payload: bytes) -> bytes:
    return encode_packet(
        prog=REMOTE_PROGRAM,
        vers=REMOTE_PROTOCOL_VERSION,
        proc=proc,
        type=MessageType.CALL,
        serial=serial,
        status=MessageStatus.OK,
        payload=payload,
    )


def stream_data_header(*, proc: int, serial: int, length: int) -> bytes:
    """The 28 bytes that precede `length` raw bytes of an upload chunk (written separately, no copy)."""
    return encode_header(
        length=MIN_PACKET + length,
        prog=REMOTE_PROGRAM,
        vers=REMOTE_PROTOCOL_VERSION,
        proc=proc,
        type=MessageType.STREAM,
        serial=serial,
        status=MessageStatus.CONTINUE,
    )


def encode_stream_finish(*, proc: int, serial: int) -> bytes:
    """STREAM/OK empty: "no more data" from the client (upload end, or download acknowledged)."""
    return encode_packet(
        prog=REMOTE_PROGRAM,
        vers=REMOTE_PROTOCOL_VERSION,
        proc=proc,
        type=MessageType.STREAM,
        serial=serial,
        status=MessageStatus.OK,
    )


def encode_stream_abort(*, proc: int, serial: int) -> bytes:
    """STREAM/ERROR empty: the client aborts the stream."""
    return encode_packet(
        prog=REMOTE_PROGRAM,
        vers=REMOTE_PROTOCOL_VERSION,
        proc=proc,
        type=MessageType.STREAM,
        serial=serial,
        status=MessageStatus.ERROR,
    )


# -- the server's side (a daemon stand-in, a simulator): what a server sends --------------------------


def encode_reply(*, proc: int, serial: int, payload: bytes) -> bytes:
    """REPLY/OK carrying a procedure's encoded return value."""
    return encode_packet(
        prog=REMOTE_PROGRAM,
        vers=REMOTE_PROTOCOL_VERSION,
        proc=proc,
        type=MessageType.REPLY,
        serial=serial,
        status=MessageStatus.OK,
        payload=payload,
    )


def encode_error_reply(*, proc: int, serial: int, error: RemoteError) -> bytes:
    """REPLY/ERROR carrying a remote_error."""
    return encode_packet(
        prog=REMOTE_PROGRAM,
        vers=REMOTE_PROTOCOL_VERSION,
        proc=proc,
        type=MessageType.REPLY,
        serial=serial,
        status=MessageStatus.ERROR,
        payload=encode_remote_error(error),
    )


def encode_event(*, proc: int, payload: bytes) -> bytes:
    """MESSAGE (an event the server pushes), serial 0."""
    return encode_packet(
        prog=REMOTE_PROGRAM,
        vers=REMOTE_PROTOCOL_VERSION,
        proc=proc,
        type=MessageType.MESSAGE,
        serial=0,
        status=MessageStatus.OK,
        payload=payload,
    )


@dataclass(frozen=True, slots=True)
class Call:
    """A call as a server receives it (args still encoded: decode with the procedure's decode_args)."""

    serial: int
    proc: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class StreamAborted:
    """STREAM/ERROR from a client: it aborts the stream (no remote_error in it)."""

    serial: int
    proc: int


FromClient = Call | StreamData | StreamFinished | StreamAborted | Ping | Pong | Unsupported


def classify_from_client(packet: Packet) -> FromClient:
    """The meaning of one packet a client sent: the server's counterpart of `classify`."""
    h = packet.header
    if h.prog == KEEPALIVE_PROGRAM:
        if h.proc == KEEPALIVE_PROC_PING:
            return Ping()
        if h.proc == KEEPALIVE_PROC_PONG:
            return Pong()
        raise ProtocolError(f"unknown keepalive procedure {h.proc}")
    if h.type == MessageType.CALL:
        return Call(h.serial, h.proc, packet.payload)
    if h.type == MessageType.STREAM:
        if h.status == MessageStatus.CONTINUE:
            return StreamData(h.serial, h.proc, packet.payload)
        if h.status == MessageStatus.OK:
            return StreamFinished(h.serial, h.proc)
        return StreamAborted(h.serial, h.proc)
    return Unsupported(h.serial, h.proc, h.type)


def _keepalive(proc: int) -> bytes:
    return encode_packet(
        prog=KEEPALIVE_PROGRAM,
        vers=KEEPALIVE_PROTOCOL_VERSION,
        proc=proc,
        type=MessageType.MESSAGE,
        serial=0,
        status=MessageStatus.OK,
    )


PING = _keepalive(KEEPALIVE_PROC_PING)
PONG = _keepalive(KEEPALIVE_PROC_PONG)
