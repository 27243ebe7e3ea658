"""Packet meanings (classify) and the packets a client sends, with bytes only."""

from __future__ import annotations

import struct

import pytest

import rpc
from rpc.constants import KEEPALIVE_PROGRAM, REMOTE_PROGRAM
from rpc.errors import error_from_remote
from rpc.framing import PacketDecoder, encode_packet
from rpc.messages import (
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
    classify,
    decode_remote_error,
    encode_call,
    encode_stream_abort,
    encode_stream_finish,
    stream_data_header,
)


def one(
    prog: int = REMOTE_PROGRAM, proc: int = 23, type: int = 1, serial: int = 5, status: int = 0, payload=b""
):  # type: ignore[no-untyped-def]
    [p] = PacketDecoder().feed(
        encode_packet(prog=prog, vers=1, proc=proc, type=type, serial=serial, status=status, payload=payload)
    )
    return p


def remote_error_bytes(code: int, message: str | None) -> bytes:
    out = struct.pack(">ii", code, 10)
    if message is None:
        out += struct.pack(">I", 0)
    else:
        raw = message.encode()
        out += struct.pack(">II", 1, len(raw)) + raw + b"\0" * (-len(raw) % 4)
    out += struct.pack(">i", 2)  # level
    out += struct.pack(">I", 0)  # dom: NULL
    out += struct.pack(">III", 0, 0, 0)  # str1..3: NULL
    out += struct.pack(">ii", 0, 0)  # int1, int2
    out += struct.pack(">I", 0)  # net: NULL
    return out


def test_remote_error_from_hand_written_bytes() -> None:
    err = decode_remote_error(
        remote_error_bytes(50, "Storage volume not found: no storage vol with matching path")
    )
    assert (err.code, err.domain, err.level, err.dom, err.net) == (50, 10, 2, None, None)
    exc = error_from_remote(err)
    assert isinstance(exc, rpc.NotFoundError) and exc.code_name == "NO_STORAGE_VOL"
    assert decode_remote_error(remote_error_bytes(1, None)).message is None
    assert error_from_remote(decode_remote_error(remote_error_bytes(1, None))).message == ""


def test_remote_error_with_unknown_code_keeps_the_number() -> None:
    exc = error_from_remote(decode_remote_error(remote_error_bytes(4242, "new")))
    assert type(exc) is rpc.LibvirtError and exc.code_name == "UNKNOWN_4242"


@pytest.mark.parametrize("cut", [4, 8, 20, 40])
def test_truncated_remote_error_is_a_protocol_error(cut: int) -> None:
    with pytest.raises(rpc.ProtocolError):
        decode_remote_error(remote_error_bytes(42, "x" * 20)[:cut])


def test_classify_every_kind() -> None:
    assert classify(one(payload=b"\0" * 4)) == Reply(5, 23, b"\0" * 4)
    assert isinstance(classify(one(status=1, payload=remote_error_bytes(42, "no"))), ErrorReply)
    assert classify(one(proc=318, type=2, serial=0)) == EventMessage(318, b"")
    assert classify(one(proc=208, type=3, status=2, payload=b"data")) == StreamData(5, 208, b"data")
    assert classify(one(proc=208, type=3, status=0)) == StreamFinished(5, 208)
    failed = classify(
        one(proc=208, type=3, status=1, payload=remote_error_bytes(38, "No space left on device"))
    )
    assert isinstance(failed, StreamFailed) and failed.error.message == "No space left on device"
    assert classify(one(prog=KEEPALIVE_PROGRAM, proc=1, type=2, serial=0)) == Ping()
    assert classify(one(prog=KEEPALIVE_PROGRAM, proc=2, type=2, serial=0)) == Pong()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prog": KEEPALIVE_PROGRAM, "proc": 1, "type": 0}, "keepalive packet of type"),
        ({"prog": KEEPALIVE_PROGRAM, "proc": 9, "type": 2}, "unknown keepalive procedure"),
        ({"type": 1, "status": 2}, "reply with status"),
        ({"type": 0}, "unexpected message type"),
        ({"type": 4}, "unexpected message type"),
    ],
)
def test_combinations_a_server_never_sends_are_refused(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(rpc.ProtocolError, match=match):
        classify(one(**kwargs))


def test_client_packets_on_the_wire() -> None:
    assert encode_call(proc=157, serial=1, payload=b"") == bytes.fromhex(
        "0000001c 20008086 00000001 0000009d 00000000 00000001 00000000"
    )
    assert encode_stream_finish(proc=208, serial=9) == bytes.fromhex(
        "0000001c 20008086 00000001 000000d0 00000003 00000009 00000000"
    )
    assert encode_stream_abort(proc=208, serial=9) == bytes.fromhex(
        "0000001c 20008086 00000001 000000d0 00000003 00000009 00000001"
    )
    assert stream_data_header(proc=208, serial=9, length=4) == bytes.fromhex(
        "00000020 20008086 00000001 000000d0 00000003 00000009 00000002"
    )
    assert bytes.fromhex("0000001c 6b656570 00000001 00000001 00000002 00000000 00000000") == PING
    assert bytes.fromhex("0000001c 6b656570 00000001 00000002 00000002 00000000 00000000") == PONG
