"""LineSplitter: watch lines of any length, split from arbitrary chunk boundaries."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from egress_kvm.kube.lines import LineSplitter


def test_lines_split_across_chunks() -> None:
    s = LineSplitter()
    assert s.feed(b'{"a":') == []
    assert s.feed(b'1}\n{"b"') == [b'{"a":1}']
    assert s.pending() == 4
    assert s.feed(b':2}\n') == [b'{"b":2}']
    assert s.pending() == 0


def test_several_lines_in_one_chunk_and_blank_lines_skipped() -> None:
    s = LineSplitter()
    assert s.feed(b"one\n\ntwo\r\nthree") == [b"one", b"two"]
    assert s.feed(b"\n") == [b"three"]


def test_a_line_far_longer_than_aiohttps_limit() -> None:
    s = LineSplitter()
    payload = b"x" * (3 * 1024 * 1024)  # 3 MiB: beyond aiohttp's 128 KiB and kubernetes-asyncio's 2 MiB
    out: list[bytes] = []
    for i in range(0, len(payload), 65536):
        out += s.feed(payload[i:i + 65536])
    assert out == []
    assert s.feed(b"\n") == [payload]


@given(st.lists(st.binary(min_size=1).filter(lambda b: b"\n" not in b and b.strip() != b""
                                             and not b.endswith(b"\r")), max_size=20),
       st.lists(st.integers(min_value=1, max_value=50), min_size=1))
def test_any_chunking_gives_the_same_lines(lines: list[bytes], sizes: list[int]) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    s = LineSplitter()
    out: list[bytes] = []
    pos, i = 0, 0
    while pos < len(stream):
        n = sizes[i % len(sizes)]
        out += s.feed(stream[pos:pos + n])
        pos += n
        i += 1
    assert out == lines
