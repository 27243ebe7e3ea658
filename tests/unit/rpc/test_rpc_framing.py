"""Framing: the length word, the header, and the incremental decoder fed in arbitrary pieces."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpc.constants import KEEPALIVE_PROGRAM, MESSAGE_MAX, MIN_PACKET, REMOTE_PROGRAM
from rpc.errors import ProtocolError
from rpc.framing import PacketDecoder, encode_packet


def pkt(payload: bytes = b"", *, proc: int = 157, type: int = 1, serial: int = 7, status: int = 0) -> bytes:
    return encode_packet(
        prog=REMOTE_PROGRAM, vers=1, proc=proc, type=type, serial=serial, status=status, payload=payload
    )


def test_empty_payload_packet_is_28_bytes_and_len_counts_itself() -> None:
    data = pkt()
    assert len(data) == MIN_PACKET == 28
    assert data == bytes.fromhex("0000001c20008086000000010000009d000000010000000700000000")


def test_decoder_returns_header_and_payload() -> None:
    [p] = PacketDecoder().feed(pkt(b"\x00\x00\x00\x00\x00\x89\x54\x40", serial=42))
    assert (p.header.prog, p.header.vers, p.header.proc, p.header.type, p.header.serial, p.header.status) == (
        REMOTE_PROGRAM,
        1,
        157,
        1,
        42,
        0,
    )
    assert p.payload == b"\x00\x00\x00\x00\x00\x89\x54\x40"


def test_byte_at_a_time_and_many_per_read() -> None:
    stream = pkt(b"abcd", serial=1) + pkt(serial=2) + pkt(b"x" * 100, serial=3)
    d = PacketDecoder()
    got = []
    for b in stream:
        got += d.feed(bytes([b]))
    assert [p.header.serial for p in got] == [1, 2, 3]
    assert d.at_boundary()
    assert [p.header.serial for p in PacketDecoder().feed(stream)] == [1, 2, 3]


def test_partial_packet_is_not_at_boundary() -> None:
    d = PacketDecoder()
    assert d.feed(pkt(b"abcd")[:-1]) == []
    assert not d.at_boundary()


@pytest.mark.parametrize("length", [0, 4, 27])
def test_length_below_minimum_refused(length: int) -> None:
    with pytest.raises(ProtocolError, match="below the minimum"):
        PacketDecoder().feed(struct.pack(">I", length))


def test_oversized_length_refused_from_the_length_word_alone() -> None:
    d = PacketDecoder()
    with pytest.raises(ProtocolError, match="exceeds the maximum"):
        d.feed(struct.pack(">I", 0xFFFFFFFF))  # nothing else: refused before waiting for 4 GiB
    assert d.buffered == 0


def test_largest_legal_length_is_accepted_and_one_more_is_not() -> None:
    d = PacketDecoder()
    assert d.feed(struct.pack(">I", MESSAGE_MAX + 4)) == []  # legal: waits for the rest
    with pytest.raises(ProtocolError):
        PacketDecoder().feed(struct.pack(">I", MESSAGE_MAX + 5))


def test_smaller_configured_maximum() -> None:
    with pytest.raises(ProtocolError):
        PacketDecoder(max_message=1024).feed(pkt(b"x" * 2000))


@pytest.mark.parametrize(
    ("offset", "value", "match"),
    [
        (4, 0x12345678, "unknown program"),
        (8, 2, "unknown version"),
        (16, 9, "unknown message type"),
        (24, 7, "unknown message status"),
    ],
)
def test_bad_header_fields_refused(offset: int, value: int, match: str) -> None:
    data = bytearray(pkt())
    struct.pack_into(">I", data, offset, value)
    with pytest.raises(ProtocolError, match=match):
        PacketDecoder().feed(bytes(data))


def test_decoder_stays_failed_after_an_error() -> None:
    d = PacketDecoder()
    with pytest.raises(ProtocolError):
        d.feed(struct.pack(">I", 3))
    with pytest.raises(ProtocolError):
        d.feed(pkt())


def test_keepalive_program_accepted() -> None:
    data = encode_packet(prog=KEEPALIVE_PROGRAM, vers=1, proc=1, type=2, serial=0, status=0)
    [p] = PacketDecoder().feed(data)
    assert p.header.prog == KEEPALIVE_PROGRAM


def test_encode_refuses_oversized_payload() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        encode_packet(
            prog=REMOTE_PROGRAM, vers=1, proc=1, type=0, serial=1, status=0, payload=b"\0" * MESSAGE_MAX
        )


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
)
def test_any_split_gives_the_same_packets(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(pkt(p, serial=i) for i, p in enumerate(payloads))
    points = sorted({c % (len(stream) + 1) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    d = PacketDecoder()
    got = [p for piece in pieces for p in d.feed(piece)]
    assert [p.payload for p in got] == payloads
    assert [p.header.serial for p in got] == list(range(len(payloads)))


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(min_size=0, max_size=200))
def test_garbage_yields_packets_or_protocol_error_never_anything_else(garbage: bytes) -> None:
    d = PacketDecoder()
    try:
        d.feed(garbage)
    except ProtocolError:
        return
    assert d.buffered <= len(garbage)
