"""libvirtd's per-connection request limit, the same steps on a real lab host and a simulated one.

libvirtd serves at most `max_client_requests` calls per client connection (libvirtd.conf; read here from
the running daemon's own file, not assumed) and reads nothing more from that connection until a reply has
been written (testbed/sim/slots.py names the places in libvirt's source). The slow calls are starts of
diskless guests: a real start takes its QEMU's launch (0.2 s each on a quiet machine here), a simulated
one `start_service_s` (set here to 0.3 s); the cheap call is CONNECT_GET_LIB_VERSION. With one
start fewer than the limit in flight, the cheap call is read at once and answered before any start; with
the limit in flight it is read only once a start's reply is out, so it comes after one. A stream-opening
call's request ends with its reply: open uploads, as many as the limit, hold none.

While all of a connection's slots are held nothing of it is read, keepalive PONGs included, so the
daemon's own keepalive (keepalive_interval x (keepalive_count + 1) s, 30 s by default) closes it though
its client answers every PING. The calls held that long are suspends of guests whose QEMU is stopped (a
real one with SIGSTOP, a simulated one with its control op `stop`): they wait on the QEMU monitor, which
does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import rpc
from testbed.lab.host import conf_int
from testbed.lab.manifests import domain_type
from testbed.sim.control import SimControl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: libvirtd's built-in max_client_requests, keepalive_interval and keepalive_count (its libvirtd.conf has
#: them commented out, "#max_client_requests = 5" and so on)
LIBVIRTD_DEFAULTS = (5, 5, 5)
START_SERVICE_S = 0.3


@dataclass(frozen=True)
class Daemon:
    """What the host's daemon is configured with: the real one's libvirtd.conf as its own mount namespace
    shows it (what is unset there: libvirtd's built-in defaults), the simulated one's knobs."""

    max_client_requests: int
    keepalive_interval: float
    keepalive_count: int

    @classmethod
    def of(cls, info: Any, hypervisor: str) -> Daemon:
        host = info.hosts[0]
        if hypervisor == "simulated":
            knobs = SimControl(host.sim_control).state()["knobs"]
            return cls(knobs["max_client_requests"], knobs["keepalive_interval_s"], knobs["keepalive_count"])
        conf = Path(f"/proc/{host.libvirtd_pid}/root/etc/libvirt/libvirtd.conf").read_text()
        names = ("max_client_requests", "keepalive_interval", "keepalive_count")
        values = [conf_int(conf, name) for name in names]
        limit, interval, count = (d if v is None else v
                                  for v, d in zip(values, LIBVIRTD_DEFAULTS, strict=True))
        return cls(limit, interval, count)


class Qemu:
    """Stops and continues a guest's QEMU: SIGSTOP/SIGCONT on a real host, the control ops on a simulated
    one."""

    def __init__(self, info: Any, hypervisor: str) -> None:
        self.sim = SimControl(info.hosts[0].sim_control) if hypervisor == "simulated" else None

    def stop(self, name: str) -> None:
        if self.sim is not None:
            self.sim.stop(name)
        else:
            os.kill(qemu_pid(name), signal.SIGSTOP)

    def cont(self, name: str) -> None:
        if self.sim is not None:
            self.sim.cont(name)
        else:
            os.kill(qemu_pid(name), signal.SIGCONT)


def qemu_pid(name: str) -> int:
    out = subprocess.run(["pgrep", "-f", f"guest={name},"], capture_output=True, text=True).stdout.split()
    assert len(out) == 1, f"QEMU of {name}: pids {out}"
    return int(out[0])


def domain_xml(name: str) -> str:
    return (f"<domain type='{domain_type()}'><name>{name}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>"
            "<os><type arch='x86_64'>hvm</type></os><cpu mode='maximum' check='none'/><devices/></domain>")


def socket_of(info: Any) -> str:
    return f"/proc/{info.hosts[0].libvirtd_pid}/root/run/libvirt/libvirt-sock"


@pytest.fixture
async def lv(lab_host: Any) -> AsyncIterator[rpc.Client]:
    async with await rpc.connect_unix(socket_of(lab_host), call_timeout=120) as client:
        yield client


@pytest.fixture
def start_service(lab_host: Any, hypervisor: str) -> Iterator[None]:
    """A simulated start takes daemon time, as a real one does; put back after the test."""
    if hypervisor != "simulated":
        yield
        return
    sim = SimControl(lab_host.hosts[0].sim_control)
    before = sim.state()["knobs"]["start_service_s"]
    sim.set(start_service_s=START_SERVICE_S)
    try:
        yield
    finally:
        sim.set(start_service_s=before)


async def sent(client: rpc.Client, n: int) -> None:
    """Until `n` calls have left (a serial is pending once its call is written)."""
    for _ in range(500):
        if client.protocol.pending >= n:
            await asyncio.sleep(0.01)
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} calls never sent")


async def starts_then_a_cheap_call(client: rpc.Client, doms: list[Any]) -> tuple[list[str], float]:
    """Start `doms` at once, then make the cheap call: the order the replies came in, and how long the
    cheap call took."""
    order: list[str] = []

    async def start(dom: Any) -> None:
        await client.domain_create_with_flags(dom, 0)
        order.append("start")

    tasks = [asyncio.create_task(start(d)) for d in doms]
    await sent(client, len(doms))
    began = time.monotonic()
    await client.connect_get_lib_version()
    order.append("cheap")
    took = time.monotonic() - began
    await asyncio.gather(*tasks)
    for dom in doms:
        await client.domain_destroy_flags(dom, 0)
    return order, took


async def remove(client: rpc.Client, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(rpc.LibvirtError):  # never defined, if the test failed early
            dom = await client.domain_lookup_by_name(name)
            with contextlib.suppress(rpc.LibvirtError):  # not running (the usual case)
                await client.domain_destroy_flags(dom, 0)
            await client.domain_undefine_flags(dom, 0)


async def test_a_call_past_max_client_requests_waits_for_a_reply(lab_host: Any, hypervisor: str,
                                                                 lv: rpc.Client, start_service: None) -> None:
    limit = Daemon.of(lab_host, hypervisor).max_client_requests
    assert limit >= 2, f"max_client_requests {limit}: this test needs room for one slow call at least"
    names = [f"slots-{uuid.uuid4().hex[:8]}-{i}" for i in range(limit)]
    try:
        doms = [await lv.domain_define_xml(domain_xml(name)) for name in names]
        under, cheap_under = await starts_then_a_cheap_call(lv, doms[:limit - 1])
        at, cheap_at = await starts_then_a_cheap_call(lv, doms)
        print(f"{hypervisor}: max_client_requests {limit}; cheap call with {limit - 1} starts in flight "
              f"{cheap_under:.3f} s ({under}), with {limit} {cheap_at:.3f} s ({at})")
        assert under[0] == "cheap", under  # read at once: a slot was free
        assert at[0] == "start" and "cheap" in at, at  # read only once a start's reply was written
    finally:
        await remove(lv, names)


async def test_the_daemons_keepalive_closes_a_connection_whose_slots_stay_held(lab_host: Any, hypervisor: str,
                                                                              lv: rpc.Client) -> None:
    daemon = Daemon.of(lab_host, hypervisor)
    closes_after = daemon.keepalive_interval * (daemon.keepalive_count + 1)
    assert closes_after > 0, f"{daemon}: this daemon never closes a silent connection"
    qemu = Qemu(lab_host, hypervisor)
    names = [f"slots-ka-{uuid.uuid4().hex[:8]}-{i}" for i in range(daemon.max_client_requests)]
    stopped: list[str] = []
    try:
        for name in names:
            await lv.domain_create_with_flags(await lv.domain_define_xml(domain_xml(name)), 0)
            qemu.stop(name)
            stopped.append(name)
        # the client's own keepalive far longer than the daemon's: the daemon is the one to decide
        async with await rpc.connect_unix(socket_of(lab_host), keepalive_interval=closes_after * 4,
                                          call_timeout=closes_after * 4) as held:
            doms = [await held.domain_lookup_by_name(name) for name in names]
            suspends = [asyncio.create_task(held.domain_suspend(d)) for d in doms]
            await sent(held, len(suspends))
            began = time.monotonic()
            with pytest.raises(rpc.ConnectionLost):
                await held.connect_get_lib_version()  # never read: every slot waits on a stopped QEMU
            took = time.monotonic() - began
            results = await asyncio.gather(*suspends, return_exceptions=True)
        print(f"{hypervisor}: {daemon}; connection closed {took:.1f} s after its slots filled "
              f"(keepalive {closes_after:g} s)")
        assert all(isinstance(r, rpc.ConnectionLost) for r in results), results
        assert closes_after - 2 <= took <= closes_after + 10, took
    finally:
        for name in stopped:
            qemu.cont(name)
        await remove(lv, names)


async def test_an_open_upload_stream_holds_no_slot(lab_host: Any, hypervisor: str, lv: rpc.Client) -> None:
    """A stream-opening call's request ends with its reply (the stream lives on without one), so as many
    open uploads as the limit, none sending yet, leave a cheap call to be read at once."""
    limit = Daemon.of(lab_host, hypervisor).max_client_requests
    pool = await lv.storage_pool_lookup_by_name(lab_host.hosts[0].pool)
    names = [f"slots-up-{uuid.uuid4().hex[:8]}-{i}.img" for i in range(limit)]
    xml = "<volume><name>{}</name><capacity>4096</capacity><target><format type='raw'/></target></volume>"
    vols = [await lv.storage_vol_create_xml(pool, xml.format(n), 0) for n in names]
    opened = asyncio.Semaphore(0)
    go = asyncio.Event()

    async def data() -> AsyncIterator[bytes]:
        opened.release()  # pulled only once the stream-opening call was answered
        await go.wait()
        yield b"x" * 4096

    try:
        uploads = [asyncio.create_task(lv.storage_vol_upload(v, 0, 4096, 0, data())) for v in vols]
        for _ in vols:
            await asyncio.wait_for(opened.acquire(), 30)
        assert await asyncio.wait_for(lv.connect_get_lib_version(), 10) > 0
        go.set()
        assert await asyncio.gather(*uploads) == [4096] * limit
    finally:
        go.set()
        for vol in vols:
            await lv.storage_vol_delete(vol, 0)
