"""The raw wire trace: one record per packet in each direction, header fields only, never a payload.

The payload can be anything the caller sent, cloud-init user-data included, so a trace record holds
only what the header says plus the packet's length. A stream's data packets (up to 256 KiB each, an
upload of a disk image is thousands of them) are summarised: one record per stream and direction with
the packet count and total bytes, written when the stream ends. The rpc package never logs: the caller
passes `tracer=` (e.g. the operator's V(5) logger) and formats records as it likes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from .constants import (
    KEEPALIVE_PROC_PING,
    KEEPALIVE_PROC_PONG,
    KEEPALIVE_PROGRAM,
    REMOTE_PROGRAM,
    MessageStatus,
    MessageType,
)
from .framing import Header
from .procedures import BY_NUMBER


class Direction(enum.Enum):
    IN = "in"  # daemon -> client
    OUT = "out"  # client -> daemon


@dataclass(frozen=True, slots=True)
class PacketTrace:
    """One packet (or, for stream data, `packets` of them) as the header describes it."""

    direction: Direction
    program: str
    version: int
    procedure: str
    type: str
    serial: int
    status: str
    length: int  # bytes on the wire, length word included
    packets: int = 1


Tracer = Callable[[PacketTrace], None]

_PROGRAMS = {REMOTE_PROGRAM: "REMOTE", KEEPALIVE_PROGRAM: "KEEPALIVE"}
_KEEPALIVE_PROCS = {KEEPALIVE_PROC_PING: "PING", KEEPALIVE_PROC_PONG: "PONG"}


def proc_name(program: int, number: int) -> str:
    if program == KEEPALIVE_PROGRAM:
        return _KEEPALIVE_PROCS.get(number, f"PROC_{number}")
    p = BY_NUMBER.get(number)
    return p.name if p is not None else f"PROC_{number}"


def _enum_name(enum_type: type[enum.IntEnum], value: int) -> str:
    try:
        return enum_type(value).name
    except ValueError:
        return str(value)


def describe(direction: Direction, header: Header, length: int) -> PacketTrace:
    return PacketTrace(
        direction=direction,
        program=_PROGRAMS.get(header.prog, f"0x{header.prog:08x}"),
        version=header.vers,
        procedure=proc_name(header.prog, header.proc),
        type=_enum_name(MessageType, header.type),
        serial=header.serial,
        status=_enum_name(MessageStatus, header.status),
        length=length,
    )
