"""The simulator's neighbour requests (testbed/sim/neigh.py) are the bytes iproute2 sends, and the
kernel's answers are read right. The kernel side itself: tests/integration/test_sim_neighbours.py."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import struct
import threading

import pytest

from testbed.sim.neigh import NeighbourError, Neighbours, Op, Request, ack_errno, encode

#: What `ip neigh replace 10.99.0.3 lladdr 52:54:00:00:00:03 dev br0 nud permanent` and
#: `ip neigh del 10.99.0.3 dev br0` send (iproute2 6.1, strace -xx; br0 = ifindex 2), with seq 1.
IPROUTE2_REPLACE = ("300000001c0005050100000000000000" "020000000200000080000000"
                    "080001000a630003" "0a0002005254000000030000")
IPROUTE2_DEL = "240000001d0005000100000000000000" "020000000200000080000000" "080001000a630003"


@pytest.mark.parametrize(("request_", "wire"), [
    (Request(Op.REPLACE, "10.99.0.3", "br0", "52:54:00:00:00:03"), IPROUTE2_REPLACE),
    (Request(Op.DELETE, "10.99.0.3", "br0"), IPROUTE2_DEL),
])
def test_requests_are_the_bytes_iproute2_sends(request_: Request, wire: str) -> None:
    assert encode(request_, ifindex=2, seq=1).hex() == wire


def test_requests_name_themselves_as_the_ip_command_they_stand_for() -> None:
    assert Request(Op.REPLACE, "10.99.0.3", "br0", "52:54:00:00:00:03").command() == \
        "ip neigh replace 10.99.0.3 lladdr 52:54:00:00:00:03 dev br0 nud permanent"
    assert Request(Op.DELETE, "10.99.0.3", "br0").command() == "ip neigh del 10.99.0.3 dev br0"


@pytest.mark.parametrize(("op", "ip", "mac", "named"), [
    (Op.REPLACE, "10.99.0.300", "52:54:00:00:00:03", "10.99.0.300"),
    (Op.REPLACE, "fe80::1", "52:54:00:00:00:03", "fe80::1"),
    (Op.REPLACE, "10.99.0.3", None, "lladdr None"),
    (Op.REPLACE, "10.99.0.3", "", "lladdr ''"),
    (Op.REPLACE, "10.99.0.3", "52:54:00:00:03", "lladdr '52:54:00:00:03'"),
    (Op.REPLACE, "10.99.0.3", "52:54:00:00:00:0g", "lladdr '52:54:00:00:00:0g'"),
    (Op.DELETE, "10.99.0.3", "52:54:00:00:00:03", "lladdr '52:54:00:00:00:03'"),
])
def test_a_malformed_request_is_refused_naming_the_value(op: Op, ip: str, mac: str | None,
                                                          named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Request(op, ip, "br0", mac)


def _msg(kind: int, seq: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, 0, seq, 0) + body


def _ack(seq: int, error: int) -> bytes:
    return _msg(2, seq, struct.pack("=i", error) + struct.pack("=IHHII", 36, 28, 0x505, seq, 0))


@pytest.mark.parametrize(("data", "seq", "expected"), [
    (_ack(7, 0), 7, 0),  # acknowledged
    (_ack(7, -errno.ENOENT), 7, errno.ENOENT),  # refused: the errno, positive
    (_ack(6, -errno.EEXIST), 7, None),  # an answer to another request
    (_msg(28, 7, b"\0" * 12) + _ack(7, -errno.ENODEV), 7, errno.ENODEV),  # after another message
    (_ack(7, 0)[:20], 7, None),  # cut short
    (b"", 7, None),
    (struct.pack("=IHHII", 8, 2, 0, 7, 0), 7, None),  # a length below the header's own: not read further
])
def test_the_kernels_answer_is_read_for_its_request(data: bytes, seq: int, expected: int | None) -> None:
    assert ack_errno(data, seq=seq) == expected


class _DroppingSocket:
    """A netlink socket whose answer the kernel dropped (a full receive buffer: recv fails ENOBUFS)."""

    closed = False

    def send(self, data: bytes) -> int:
        return len(data)

    def recv(self, size: int) -> bytes:
        raise OSError(errno.ENOBUFS, os.strerror(errno.ENOBUFS))

    def close(self) -> None:
        self.closed = True


def _writers() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("sim-neigh"))


def test_a_socket_failure_is_a_neighbour_error_naming_the_command_and_the_socket_is_replaced() -> None:
    neighbours, dropping = Neighbours(), _DroppingSocket()
    neighbours._sock = dropping  # type: ignore[assignment]

    async def run() -> None:
        dropped = re.escape("ip neigh del 10.99.0.3 dev lo: No buffer space")
        with pytest.raises(NeighbourError, match=dropped) as exc:
            await neighbours.apply(Request(Op.DELETE, "10.99.0.3", "lo"))
        assert exc.value.errno == errno.ENOBUFS
        neighbours.close()

    asyncio.run(run())
    assert dropping.closed and neighbours._sock is None


def test_a_request_after_close_is_refused_and_starts_no_thread() -> None:
    neighbours = Neighbours()
    neighbours.close()
    neighbours.close()  # twice: nothing to do

    async def run() -> None:
        closed = re.escape("ip neigh del 10.99.0.3 dev lo: the neighbour writer is closed")
        with pytest.raises(NeighbourError, match=closed):
            await neighbours.apply(Request(Op.DELETE, "10.99.0.3", "lo"))

    before = _writers()
    asyncio.run(run())
    assert _writers() == before
