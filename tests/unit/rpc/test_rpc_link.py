"""Link: packets keep their order; a burst in one loop turn is joined, a lone write goes out at once."""

from __future__ import annotations

import asyncio

import pytest

import rpc
from rpc.link import Link


class Writer:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.broken = False

    def write(self, data: bytes) -> None:
        if self.broken:
            raise BrokenPipeError("gone")
        self.writes.append(bytes(data))

    def close(self) -> None:
        pass


class Reader:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def read(self, n: int) -> bytes:
        return await self.queue.get()


async def test_lone_writes_go_out_at_once_and_bursts_are_joined_in_order() -> None:
    w, r = Writer(), Reader()
    link = Link(r, w, description="t")
    link.write(b"a")
    assert w.writes == [b"a"]  # immediately, no loop turn needed
    link.write(b"b")
    link.write(b"c")
    assert w.writes == [b"a"]  # queued behind the first until the end of the turn
    await asyncio.sleep(0)
    assert w.writes == [b"a", b"bc"]
    r.queue.put_nowait(b"reply")
    await link.read(10)
    link.write(b"d")  # after a read: straight out again
    assert w.writes == [b"a", b"bc", b"d"]


async def test_a_read_while_a_batch_is_queued_keeps_the_order() -> None:
    w, r = Writer(), Reader()
    link = Link(r, w, description="t")
    link.write(b"1")
    link.write(b"2")  # queued
    r.queue.put_nowait(b"x")
    await link.read(10)  # must not let "3" overtake "2"
    link.write(b"3")
    await asyncio.sleep(0)
    assert b"".join(w.writes) == b"123"


async def test_write_on_a_dead_transport_is_connection_lost() -> None:
    w, r = Writer(), Reader()
    link = Link(r, w, description="t")
    w.broken = True
    with pytest.raises(rpc.ConnectionLost, match="gone"):
        link.write(b"x")


@pytest.mark.parametrize(
    "sizes",
    [
        [],
        [1],
        [262120],
        [262121],
        [10, 262120, 5],
        [8 << 20, 3, 8 << 20],
        [100_000] * 7,
        [262119, 1, 262120, 262121, 262119],
    ],
)
async def test_upload_chunking_is_exact_and_full_sized(sizes: list[int]) -> None:
    from rpc.constants import STREAM_CHUNK
    from rpc.streams import chunks as _chunks

    pieces = [bytes([i % 251]) * n for i, n in enumerate(sizes)]

    async def source():  # type: ignore[no-untyped-def]
        for p in pieces:
            yield p

    out = [bytes(c) async for c in _chunks(source())]
    assert b"".join(out) == b"".join(pieces)
    assert all(len(c) == STREAM_CHUNK for c in out[:-1])
    assert all(0 < len(c) <= STREAM_CHUNK for c in out)
    direct = [bytes(c) async for c in _chunks(b"".join(pieces))]
    assert direct == out


async def test_a_two_part_packet_keeps_its_place_among_whole_packets() -> None:
    w, r = Writer(), Reader()
    link = Link(r, w, description="t")
    link.write_parts(b"H1", memoryview(b"body1"))  # alone in its turn: out at once
    assert b"".join(w.writes) == b"H1body1"
    link.write(b"call")
    link.write_parts(b"H2", b"body2")  # queued behind the call, parts adjacent
    link.write(b"end")
    await asyncio.sleep(0)
    assert b"".join(w.writes) == b"H1body1callH2body2end"
