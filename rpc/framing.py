"""Packet framing: the length word, the 24-byte header, and an incremental decoder fed raw bytes.

Sans-IO in the h11 manner: `PacketDecoder.feed(data)` takes whatever the socket produced and returns
the complete packets it now holds. The length word is checked the moment its 4 bytes are in, so a
hostile peer declaring a 4 GiB packet is refused before a single byte of it is buffered; the buffer
therefore never holds more than one legal packet plus one read.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .constants import (
    HEADER_SIZE,
    KEEPALIVE_PROGRAM,
    LEN_SIZE,
    MESSAGE_MAX,
    MIN_PACKET,
    QEMU_PROGRAM,
    REMOTE_PROGRAM,
    MessageStatus,
    MessageType,
)
from .errors import ProtocolError

_LEN = struct.Struct(">I")
_HEADER = struct.Struct(">IIiiII")  # prog, vers, proc, type, serial, status
_LEN_HEADER = struct.Struct(">IIIiiII")
_KNOWN_PROGRAMS = frozenset({REMOTE_PROGRAM, KEEPALIVE_PROGRAM, QEMU_PROGRAM})
_TYPES = frozenset(int(t) for t in MessageType)
_STATUSES = frozenset(int(s) for s in MessageStatus)


class Header(NamedTuple):
    """Immutable; a NamedTuple because one is built per packet (several times cheaper than a frozen
    dataclass, measured in the profile in docs/performance.md)."""

    prog: int
    vers: int
    proc: int
    type: int
    serial: int
    status: int


class Packet(NamedTuple):
    header: Header
    payload: bytes


def encode_packet(
    *, prog: int, vers: int, proc: int, type: int, serial: int, status: int, payload: bytes = b""
) -> bytes:
    """One packet on the wire: length word (counting itself), header, payload."""
    total = MIN_PACKET + len(payload)
    if total - LEN_SIZE > MESSAGE_MAX:
        raise ValueError(f"packet of {total} bytes exceeds the protocol maximum {MESSAGE_MAX + LEN_SIZE}")
    return _LEN_HEADER.pack(total, prog, vers, proc, type, serial, status) + payload


def encode_header(
    *, length: int, prog: int, vers: int, proc: int, type: int, serial: int, status: int
) -> bytes:
    """The 28 bytes before a payload of `length - 28` bytes (lets a stream chunk be sent without a copy)."""
    return _LEN_HEADER.pack(length, prog, vers, proc, type, serial, status)


def check_length(length: int, *, max_message: int = MESSAGE_MAX) -> None:
    if length < MIN_PACKET:
        raise ProtocolError(f"packet length {length} is below the minimum {MIN_PACKET}")
    if length - LEN_SIZE > max_message:
        raise ProtocolError(f"packet length {length} exceeds the maximum {max_message + LEN_SIZE}")


def decode_header(data: bytes | bytearray, offset: int = 0) -> Header:
    """The header from the 24 bytes at `offset`, refusing programs, types and statuses libvirt never sends."""
    if len(data) - offset < HEADER_SIZE:
        raise ProtocolError(f"header must be {HEADER_SIZE} bytes, got {len(data) - offset}")
    return check_header(_HEADER.unpack_from(data, offset))


def check_header(fields: tuple[int, int, int, int, int, int]) -> Header:
    """A Header from the six unpacked words, refusing values libvirt never sends."""
    prog, vers, proc, type_, serial, status = fields
    if prog not in _KNOWN_PROGRAMS:
        raise ProtocolError(f"unknown program 0x{prog:08x}")
    if vers != 1:
        raise ProtocolError(f"unknown version {vers} of program 0x{prog:08x}")
    if type_ not in _TYPES:
        raise ProtocolError(f"unknown message type {type_}")
    if status not in _STATUSES:
        raise ProtocolError(f"unknown message status {status}")
    return Header(prog, vers, proc, type_, serial, status)


class PacketDecoder:
    """Feed bytes in, get whole packets out. After a ProtocolError the decoder is dead (stream desynced)."""

    def __init__(self, *, max_message: int = MESSAGE_MAX) -> None:
        self._buf = bytearray()
        self._need: int | None = None  # length of the packet being assembled, once known
        self._max = max_message
        self._failed: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        if self._failed is not None:
            raise self._failed
        if not self._buf and type(data) is bytes:
            return self._feed_fresh(data)
        return self._feed_buffered(data)

    def _feed_fresh(self, data: bytes) -> list[Packet]:
        """Nothing buffered: cut packets straight out of `data` (the usual case: one read, whole replies),
        buffering only a trailing partial packet."""
        out: list[Packet] = []
        pos = 0
        n = len(data)
        try:
            while n - pos >= MIN_PACKET:
                (length,) = _LEN.unpack_from(data, pos)
                check_length(length, max_message=self._max)
                if n - pos < length:
                    break
                header = check_header(_HEADER.unpack_from(data, pos + LEN_SIZE))
                out.append(Packet(header, data[pos + MIN_PACKET : pos + length]))
                pos += length
        except ProtocolError as e:
            self._failed = e
            raise
        if pos < n:
            self._feed_buffered(data[pos:] if pos else data)
        return out

    def _feed_buffered(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        buf = self._buf
        buf += data
        out: list[Packet] = []
        pos = 0
        n = len(buf)
        try:
            while True:
                if self._need is None:
                    if n - pos < LEN_SIZE:
                        break
                    (length,) = _LEN.unpack_from(buf, pos)
                    check_length(length, max_message=self._max)
                    self._need = length
                length = self._need
                if n - pos < length:
                    break
                header = check_header(_HEADER.unpack_from(buf, pos + LEN_SIZE))
                payload = bytes(buf[pos + MIN_PACKET : pos + length])
                out.append(Packet(header, payload))
                pos += length
                self._need = None
        except ProtocolError as e:
            self._failed = e
            self._buf = bytearray()
            raise
        if pos:
            del buf[:pos]
        return out

    def at_boundary(self) -> bool:
        """True when no partial packet is buffered (an EOF here is clean, elsewhere a truncation)."""
        return not self._buf
