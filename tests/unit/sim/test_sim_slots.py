"""The simulated host reads a connection as libvirtd does, over its real wire: at most
`max_client_requests` calls in service, the rest (keepalive PINGs too) unread until a reply goes out;
`rpc_latency_s` is network time and holds no slot, `start_service_s` is the daemon's and does; the
daemon's own keepalive closes a connection it could not read for interval x (count + 1) s.

A raw client (rpc's framing, no rpc.Client) shows exactly what comes back and when; the rules themselves
are tables in test_slots.py and test_keepalive.py.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import rpc
from rpc.constants import (
    FEATURE_PROGRAM_KEEPALIVE,
    REMOTE_PROGRAM,
    REMOTE_PROTOCOL_VERSION,
    DomainState,
    ErrorCode,
    MessageStatus,
)
from rpc.constants import MessageType as T
from rpc.errors import ConnectionLost
from rpc.framing import PacketDecoder, encode_packet
from rpc.messages import PING, PONG, Ping, Pong, Reply, classify
from rpc.protocol_constants import REMOTE_PROC_AUTH_LIST, REMOTE_PROC_CONNECT_SUPPORTS_FEATURE
from testbed.sim.host import SimHost, make_host
from testbed.sim.knobs import Knobs

VOLUME_XML = "<volume><name>{name}</name><capacity>1</capacity></volume>"
DOMAIN_XML = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
<devices><disk type='volume' device='disk'><source pool='default' volume='{name}.qcow2'/></disk>
</devices></domain>"""


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[SimHost]:
    host = make_host(name="sim0", pool_path=str(tmp_path / "pool"), knobs=Knobs(boot_delay_s=3600.0),
                     socket_path=str(tmp_path / "libvirt-sock"), guest_network=None)
    await host.listen()
    yield host
    host.kill()


def knobs(host: SimHost, **values: Any) -> None:
    host.knobs.update(values)
    host.apply_knobs()


class Raw:
    """A client that writes packets as given and reads what comes back, nothing else (no keepalive)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = PacketDecoder()
        self.got: list[Any] = []

    @classmethod
    async def open(cls, host: SimHost) -> Raw:
        return cls(*await asyncio.open_unix_connection(host.socket_path))

    def call(self, serial: int, proc: int = REMOTE_PROC_AUTH_LIST, payload: bytes = b"") -> None:
        self.writer.write(encode_packet(prog=REMOTE_PROGRAM, vers=REMOTE_PROTOCOL_VERSION, proc=proc,
                                        type=T.CALL, serial=serial, status=MessageStatus.OK, payload=payload))

    def send(self, packet: bytes) -> None:
        self.writer.write(packet)

    async def wait(self, n: int, within: float) -> list[str]:
        """Until `n` packets came (or `within` s passed): all that came, named 'reply 3', 'ping', 'pong'."""
        deadline = time.monotonic() + within
        while len(self.got) < n and (left := deadline - time.monotonic()) > 0:
            try:
                data = await asyncio.wait_for(self.reader.read(65536), left)
            except TimeoutError:
                break
            if not data:
                self.got.append("eof")
                break
            for packet in self.decoder.feed(data):
                msg = classify(packet)
                self.got.append(f"reply {msg.serial}" if isinstance(msg, Reply) else
                                "ping" if isinstance(msg, Ping) else "pong" if isinstance(msg, Pong) else msg)
        return self.got

    def close(self) -> None:
        self.writer.close()


async def test_past_the_limit_calls_and_pings_wait_unread_until_a_reply_goes_out(sim: SimHost) -> None:
    knobs(sim, max_client_requests=2, frozen=True)
    raw = await Raw.open(sim)
    raw.call(1)
    raw.call(2)
    raw.send(PING)  # libvirtd reads a PING only when it has a receive buffer, as any packet
    raw.call(3)
    assert await raw.wait(1, 0.3) == []  # two calls in service, frozen: the PING was not even read
    knobs(sim, frozen=False)
    got = await raw.wait(4, 2.0)
    assert sorted(got[:2]) == ["reply 1", "reply 2"], got  # the PING waited for a call to end
    assert sorted(got[2:]) == ["pong", "reply 3"], got
    raw.close()


async def test_under_the_limit_a_ping_is_answered_while_calls_are_in_service(sim: SimHost) -> None:
    knobs(sim, max_client_requests=3, frozen=True)
    raw = await Raw.open(sim)
    raw.call(1)
    raw.call(2)
    raw.send(PING)
    assert await raw.wait(1, 1.0) == ["pong"]
    knobs(sim, frozen=False)
    assert sorted(await raw.wait(3, 2.0)) == ["pong", "reply 1", "reply 2"]
    raw.close()


async def test_a_limit_raised_at_run_time_reads_what_waited(sim: SimHost) -> None:
    knobs(sim, max_client_requests=1, frozen=True)
    raw = await Raw.open(sim)
    raw.call(1)
    raw.send(PING)
    assert await raw.wait(1, 0.3) == []
    knobs(sim, max_client_requests=2)
    assert await raw.wait(1, 1.0) == ["pong"]
    knobs(sim, frozen=False)
    raw.close()


async def test_rpc_latency_is_network_time_and_holds_no_slot(sim: SimHost) -> None:
    """Four calls at once through one slot, each a 0.3 s round trip: all answered after one round trip
    (had the latency held the slot, the last would take four)."""
    async with await rpc.connect_unix(sim.socket_path) as lv:
        knobs(sim, max_client_requests=1, rpc_latency_s=0.3)
        start = time.monotonic()
        versions = await asyncio.gather(*(lv.connect_get_lib_version() for _ in range(4)))
        took = time.monotonic() - start
        assert len(set(versions)) == 1
        assert 0.3 <= took < 0.9, took  # four round trips would be 1.2 s; the margin is a loaded machine's
        knobs(sim, rpc_latency_s=0.0)


async def test_a_domain_start_holds_its_slot_for_start_service_s(sim: SimHost) -> None:
    async with await rpc.connect_unix(sim.socket_path) as lv:
        pool = await lv.storage_pool_lookup_by_name("default")
        doms = []
        for name in ("s1", "s2"):
            await lv.storage_vol_create_xml(pool, VOLUME_XML.format(name=f"{name}.qcow2"), 0)
            doms.append(await lv.domain_define_xml(DOMAIN_XML.format(name=name)))
        knobs(sim, max_client_requests=2, start_service_s=0.5)

        async def cheap_call_after(starts: list[Any]) -> float:
            begin = time.monotonic()
            tasks = [asyncio.ensure_future(lv.domain_create_with_flags(d, 0)) for d in starts]
            await asyncio.sleep(0.1)
            await lv.connect_get_lib_version()
            took = time.monotonic() - begin
            await asyncio.gather(*tasks)
            return took

        assert await cheap_call_after(doms[:1]) < 0.45  # one start in service: a slot is free (not 0.5 s)
        for dom in doms[:1]:
            await lv.domain_destroy_flags(dom, 0)
        assert await cheap_call_after(doms) >= 0.5  # both slots starting domains: it waits for one


async def test_the_daemon_closes_a_connection_it_cannot_read_for_its_keepalive_time(sim: SimHost) -> None:
    """The client answers every PING, but its PONGs wait unread behind a frozen call: closed
    interval x (count + 1) s after the daemon last read anything, as libvirtd's keepalive does."""
    knobs(sim, keepalive_interval_s=0.2, keepalive_count=2, max_client_requests=1)
    async with await rpc.connect_unix(sim.socket_path, keepalive_interval=30) as lv:
        knobs(sim, frozen=True)
        start = time.monotonic()
        with pytest.raises(ConnectionLost):
            await lv.connect_get_lib_version()
        assert 0.6 <= time.monotonic() - start < 1.5
    knobs(sim, frozen=False)


async def test_with_a_slot_free_the_pongs_are_read_and_the_connection_lives(sim: SimHost) -> None:
    knobs(sim, keepalive_interval_s=0.2, keepalive_count=2, max_client_requests=2)
    async with await rpc.connect_unix(sim.socket_path, keepalive_interval=30) as lv:
        knobs(sim, frozen=True)
        frozen_call = asyncio.ensure_future(lv.connect_get_lib_version())
        await asyncio.sleep(1.2)  # twice the daemon's keepalive time
        knobs(sim, frozen=False)
        assert await frozen_call > 0


async def test_a_client_that_never_asks_about_keepalive_is_never_pinged(sim: SimHost) -> None:
    knobs(sim, keepalive_interval_s=0.1, keepalive_count=1)
    raw = await Raw.open(sim)
    assert await raw.wait(1, 0.5) == []
    raw.call(1, REMOTE_PROC_CONNECT_SUPPORTS_FEATURE, struct.pack(">i", FEATURE_PROGRAM_KEEPALIVE))
    raw.send(PONG)  # an unsolicited PONG is read and dropped, as libvirtd does
    assert await raw.wait(4, 1.0) == ["reply 1", "ping", "eof"]  # count 1: one PING, then closed
    raw.close()


async def test_a_stopped_qemu_holds_the_calls_that_need_its_monitor(sim: SimHost) -> None:
    """As SIGSTOP on a real domain's QEMU: a suspend waits (in its slot) until the QEMU continues; a call
    that needs no monitor (the state) is answered meanwhile."""
    async with await rpc.connect_unix(sim.socket_path) as lv:
        pool = await lv.storage_pool_lookup_by_name("default")
        await lv.storage_vol_create_xml(pool, VOLUME_XML.format(name="q1.qcow2"), 0)
        dom = await lv.domain_create_with_flags(await lv.domain_define_xml(DOMAIN_XML.format(name="q1")), 0)
        await sim.control({"op": "stop", "domain": "q1"})
        suspend = asyncio.ensure_future(lv.domain_suspend(dom))
        await asyncio.sleep(0.3)
        assert not suspend.done()
        assert (await lv.domain_get_state(dom, 0)).state == DomainState.RUNNING
        await sim.control({"op": "cont", "domain": "q1"})
        await asyncio.wait_for(suspend, 1.0)
        assert (await lv.domain_get_state(dom, 0)).state == DomainState.PAUSED
        await sim.control({"op": "stop", "domain": "q1"})
        resume = asyncio.ensure_future(lv.domain_resume(dom))
        await asyncio.sleep(0.1)
        sim.crash_guest("q1")  # QEMU gone: the waiting call is answered (the domain is not running now)
        with pytest.raises(rpc.LibvirtError) as err:
            await asyncio.wait_for(resume, 1.0)
        assert err.value.code == ErrorCode.OPERATION_INVALID


async def test_packets_on_the_way_keep_their_order_when_the_latency_is_lowered(sim: SimHost) -> None:
    """A stream socket never reorders: calls sent after `rpc_latency_s` was lowered arrive after the one
    still on the way, each in the order sent (a reply per call says in which order they were read)."""
    knobs(sim, rpc_latency_s=0.3)
    raw = await Raw.open(sim)
    raw.call(1)
    for _ in range(100):  # until the daemon has call 1 on the way
        await asyncio.sleep(0.01)
        if any(conn.transit.on_the_way for conn in sim.connections):
            break
    knobs(sim, rpc_latency_s=0.0)
    for serial in range(2, 41):
        raw.call(serial)
    assert await raw.wait(40, 2.0) == [f"reply {serial}" for serial in range(1, 41)]
    raw.close()
