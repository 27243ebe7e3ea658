"""The simulated host over its real wire: the rpc client on a unix socket, the simulator in the same loop.

Guests take addresses in 127.77.0.0/24 here (all of 127/8 is local), so a booted guest's proxy is
reached for real; in the lab they take the host's VM LAN (docs/lab.md, "Simulated hosts").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import rpc
from rpc.constants import DomainState, ErrorCode, InterfaceAddressesSource
from rpc.errors import ConnectionLost, DeadlineExceeded, LibvirtError, RpcError
from testbed.sim.control import AsyncSimControl, SimControlError
from testbed.sim.host import SimHost, make_host
from testbed.sim.knobs import Knobs

GUEST_NET = "127.77.0.0/24"
VOLUME_XML = "<volume><name>{name}</name><capacity>1</capacity></volume>"
DOMAIN_XML = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
<devices><disk type='volume' device='disk'><source pool='default' volume='{name}.qcow2'/></disk>
<interface type='bridge'><mac address='52:54:00:00:00:{mac}'/></interface></devices></domain>"""


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[SimHost]:
    knobs = Knobs(boot_delay_s=0.05)
    host = make_host(name="sim0", pool_path=str(tmp_path / "pool"), knobs=knobs,
                     socket_path=str(tmp_path / "libvirt-sock"), guest_network=GUEST_NET)
    await host.listen()
    control = await host.serve_control(str(tmp_path / "sim.sock"))
    yield host
    control.close()
    host.kill()


async def client(host: SimHost, **kw: object) -> rpc.Client:
    return await rpc.connect_unix(host.socket_path, **kw)  # type: ignore[arg-type]


async def test_a_domain_boots_gets_an_address_and_serves_a_working_proxy(sim: SimHost) -> None:
    origin = await asyncio.start_server(_hello, "127.0.0.1", 0)
    port = origin.sockets[0].getsockname()[1]
    async with await client(sim) as lv:
        pool = await lv.storage_pool_lookup_by_name("default")
        await lv.storage_vol_create_xml(pool, VOLUME_XML.format(name="g1.qcow2"), 0)
        dom = await lv.domain_define_xml(DOMAIN_XML.format(name="g1", mac="01"))
        dom = await lv.domain_create_with_flags(dom, 0)
        assert (await lv.domain_get_state(dom, 0)).state == DomainState.RUNNING
        with pytest.raises(LibvirtError) as err:  # booting: the agent is not there yet
            await lv.domain_interface_addresses(dom, InterfaceAddressesSource.AGENT, 0)
        assert err.value.code == ErrorCode.AGENT_UNRESPONSIVE
        await asyncio.sleep(0.3)
        ifaces = await lv.domain_interface_addresses(dom, InterfaceAddressesSource.AGENT, 0)
        ip = [a.addr for i in ifaces if i.hwaddr == "52:54:00:00:00:01" for a in i.addrs if a.prefix == 24]
        assert ip == ["127.77.0.2"]
        arp = await lv.domain_interface_addresses(dom, InterfaceAddressesSource.ARP, 0)
        assert [a.addr for i in arp for a in i.addrs] == ["127.77.0.2"]
        reader, writer = await asyncio.open_connection("127.77.0.2", 3128)
        writer.write(f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        reply = await reader.read()
        writer.close()
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"hello")
        await lv.domain_destroy_flags(dom, 0)
        with pytest.raises(OSError):  # the guest is off: nothing serves its address any more
            await asyncio.open_connection("127.77.0.2", 3128)
    origin.close()


async def _hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
    await writer.drain()
    writer.close()


async def test_uploads_and_downloads_stream_and_a_full_pool_fails_the_upload_with_enospc(sim: SimHost
                                                                                          ) -> None:
    data = bytes(range(256)) * 4000  # > 3 stream chunks
    async with await client(sim) as lv:
        pool = await lv.storage_pool_lookup_by_name("default")
        vol = await lv.storage_vol_create_xml(pool, VOLUME_XML.format(name="v"), 0)
        assert await lv.storage_vol_upload(vol, 0, 0, 0, data) == len(data)
        assert await lv.storage_vol_download(vol, 0, 0, 0).read_all() == data
        file = Path(sim.hyp.pool_path, "v")
        assert file.read_bytes() == data  # noqa: ASYNC240  (a file in the pool dir, as libvirt's)
        await AsyncSimControl(sim_control(sim)).request("set", knobs={"pool_capacity_bytes": len(data) + 10})
        with pytest.raises(LibvirtError) as err:
            await lv.storage_vol_upload(vol, len(data), 0, 0, data)
        assert err.value.code == ErrorCode.SYSTEM_ERROR and "No space left on device" in err.value.message
        assert await lv.storage_pool_get_info(pool)  # the connection survives the stream error
        await lv.storage_vol_delete(vol, 0)
        assert not file.exists()  # noqa: ASYNC240


def sim_control(sim: SimHost) -> str:
    return str(Path(sim.socket_path).parent / "sim.sock")


async def test_error_codes_and_lifecycle_events_cross_the_wire(sim: SimHost) -> None:
    async with await client(sim) as lv:
        with pytest.raises(LibvirtError) as err:
            await lv.domain_lookup_by_name("nope")
        assert (err.value.code, err.value.domain) == (ErrorCode.NO_DOMAIN, 10)
        async with lv.lifecycle_events() as events:
            dom = await lv.domain_define_xml(DOMAIN_XML.format(name="g2", mac="02"))
            ev = await asyncio.wait_for(anext(aiter(events)), 5)
            assert (ev.dom.name, ev.event) == ("g2", 0)  # DEFINED
        with pytest.raises(LibvirtError) as err:
            await lv.domain_create_with_flags(dom, 0)  # its disk volume does not exist
        assert err.value.code == ErrorCode.NO_STORAGE_VOL


AGENT_DOMAIN_XML = DOMAIN_XML.replace("</devices>", "<channel type='unix'><target type='virtio' "
                                      "name='org.qemu.guest_agent.0'/></channel></devices>")


async def test_agent_lifecycle_follows_the_guest_as_libvirts_qemu_driver_reports_it(sim: SimHost) -> None:
    """Start: DISCONNECTED (DOMAIN_STARTED); the boot's end, when the agent reports the address: CONNECTED
    (CHANNEL); a destroy: nothing (the next event is the next start's); a guest shutdown: DISCONNECTED
    (CHANNEL) before its STOPPED. Events on one connection keep their order, so "nothing" is shown by what
    comes next, not by waiting."""
    state, reason = rpc.AgentLifecycleState, rpc.AgentLifecycleReason
    async with await client(sim) as lv:
        pool = await lv.storage_pool_lookup_by_name("default")
        await lv.storage_vol_create_xml(pool, VOLUME_XML.format(name="g5.qcow2"), 0)
        dom = await lv.domain_define_xml(AGENT_DOMAIN_XML.format(name="g5", mac="05"))
        async with lv.agent_lifecycle_events() as agent, lv.lifecycle_events() as life:
            async def next_agent() -> tuple[str, object, object]:
                ev = await asyncio.wait_for(anext(aiter(agent)), 5)
                return ev.dom.name, ev.state, ev.reason

            async def until_stopped() -> None:
                while (await asyncio.wait_for(anext(aiter(life)), 5)).event != rpc.DomainEventType.STOPPED:
                    pass

            await lv.domain_create_with_flags(dom, 0)
            assert await next_agent() == ("g5", state.DISCONNECTED, reason.DOMAIN_STARTED)
            assert await next_agent() == ("g5", state.CONNECTED, reason.CHANNEL)
            ifaces = await lv.domain_interface_addresses(dom, InterfaceAddressesSource.AGENT, 0)
            assert "127.77.0.2" in [a.addr for i in ifaces for a in i.addrs]  # visible when it connects

            await lv.domain_destroy_flags(dom, 0)
            await until_stopped()
            await lv.domain_create_with_flags(dom, 0)
            assert await next_agent() == ("g5", state.DISCONNECTED, reason.DOMAIN_STARTED)
            assert await next_agent() == ("g5", state.CONNECTED, reason.CHANNEL)
            sim.hyp.shut_off("g5")
            assert await next_agent() == ("g5", state.DISCONNECTED, reason.CHANNEL)
            await until_stopped()
        # A domain without the agent's channel has no agent to report on.
        await lv.storage_vol_create_xml(pool, VOLUME_XML.format(name="g6.qcow2"), 0)
        plain = await lv.domain_define_xml(DOMAIN_XML.format(name="g6", mac="06"))
        async with lv.agent_lifecycle_events() as agent:
            await lv.domain_create_with_flags(plain, 0)
            await lv.domain_create_with_flags(dom, 0)  # g5 again: its events are the only ones
            assert await next_agent() == ("g5", state.DISCONNECTED, reason.DOMAIN_STARTED)
            assert await next_agent() == ("g5", state.CONNECTED, reason.CHANNEL)  # g6 booted first
        await lv.domain_destroy_flags(plain, 0)


async def test_knobs_freeze_fail_and_kill_and_the_control_socket_refuses_unknown_knobs(sim: SimHost) -> None:
    ctl = AsyncSimControl(sim_control(sim))
    with pytest.raises(SimControlError, match="knob 'boot_dealy'"):
        await ctl.request("set", knobs={"boot_dealy": 1})
    async with await client(sim, call_timeout=0.3) as lv:
        await ctl.request("set", knobs={"frozen": True})
        with pytest.raises(DeadlineExceeded):
            await lv.node_get_free_memory()
        await ctl.request("set", knobs={"frozen": False, "fail_rate": 1.0})
        with pytest.raises(LibvirtError) as err:
            await lv.node_get_free_memory()
        assert err.value.code == ErrorCode.OPERATION_TIMEOUT
        await ctl.request("set", knobs={"fail_rate": 0.0})
        assert await lv.node_get_free_memory() == 16 * 1024**3
        await ctl.request("kill")
        with pytest.raises((ConnectionLost, RpcError)):
            await lv.node_get_free_memory()
    with pytest.raises(OSError), contextlib.closing(socket.socket(socket.AF_UNIX)) as s:
        s.connect(sim.socket_path)
    await ctl.request("revive")
    async with await client(sim) as lv:
        assert (await ctl.request("state"))["killed"] is False
        assert await lv.node_get_free_memory() > 0


async def test_state_counts_errors_by_code_and_kill_says_how_many_guests_it_stopped(sim: SimHost) -> None:
    """What a chaos run asserts its faults with: the injected failures and the host kill took effect."""
    ctl = AsyncSimControl(sim_control(sim))
    async with await client(sim) as lv:
        pool = await lv.storage_pool_lookup_by_name("default")
        await lv.storage_vol_create_xml(pool, VOLUME_XML.format(name="g3.qcow2"), 0)
        dom = await lv.domain_define_xml(DOMAIN_XML.format(name="g3", mac="03"))
        await lv.domain_create_with_flags(dom, 0)
        await lv.domain_define_xml(DOMAIN_XML.format(name="g4", mac="04"))  # defined, not running
        with pytest.raises(LibvirtError):
            await lv.domain_lookup_by_name("nope")
        await ctl.request("set", knobs={"fail_rate": 1.0})
        for _ in range(2):
            with pytest.raises(LibvirtError):
                await lv.node_get_free_memory()
        await ctl.request("set", knobs={"fail_rate": 0.0})
        assert (await ctl.request("state"))["errors"] == {"NO_DOMAIN": 1, "OPERATION_TIMEOUT": 2}
    assert await ctl.request("kill") == {"stopped": 1}
    await ctl.request("revive")


STATIC_XML = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
<devices><disk type='volume' device='disk'><source pool='default' volume='{name}.qcow2'/></disk>
<disk type='volume' device='cdrom'><source pool='default' volume='{name}-seed.iso'/></disk>
<interface type='bridge'><mac address='{mac}'/></interface></devices></domain>"""


async def test_a_guest_takes_the_static_address_its_seed_gives_its_mac(sim: SimHost, tmp_path: Path) -> None:
    from egress_kvm.config.models import StaticAddresses
    from egress_kvm.providers.kvm import seed, static_ip

    mac = "52:54:00:00:00:05"
    cfg = StaticAddresses.model_validate({"cidr": "127.77.0.0/24", "gateway": "127.77.0.1",
                                          "range": "127.77.0.50-127.77.0.60"})
    net = static_ip.network_config(mac=mac, address="127.77.0.55", config=cfg)
    iso = seed.build_seed_iso(name="g5", user_data=b"#cloud-config\n", vendor_data="", network_config=net)
    sim.hyp.put_volume("g5-seed.iso", iso)
    sim.leases = tmp_path / "leases"
    async with await client(sim) as lv:
        pool = await lv.storage_pool_lookup_by_name("default")
        for name in ("g5", "g6"):
            await lv.storage_vol_create_xml(pool, VOLUME_XML.format(name=f"{name}.qcow2"), 0)
        static = await lv.domain_create_with_flags(await lv.domain_define_xml(
            STATIC_XML.format(name="g5", mac=mac)), 0)
        dhcp = await lv.domain_create_with_flags(await lv.domain_define_xml(
            DOMAIN_XML.format(name="g6", mac="06")), 0)
        await asyncio.sleep(0.3)

        async def agent_ips(dom: object) -> list[str]:
            ifaces = await lv.domain_interface_addresses(dom, InterfaceAddressesSource.AGENT, 0)  # type: ignore[arg-type]
            return [a.addr for i in ifaces if i.name != "lo" for a in i.addrs if a.prefix == 24]

        assert await agent_ips(static) == ["127.77.0.55"]
        assert await agent_ips(dhcp) == ["127.77.0.2"]  # a DHCP guest still takes the next free one
        _, writer = await asyncio.open_connection("127.77.0.55", 3128)  # its proxy serves there
        writer.close()
        # Only the DHCP guest left a lease: no DHCP ran for the static one.
        assert [line.split()[1] for line in sim.leases.read_text().splitlines()] == ["52:54:00:00:00:06"]


@pytest.mark.parametrize(("doc", "mac", "expected"), [
    (b"version: 2\nethernets:\n  eth0:\n    match: {macaddress: '52:54:00:AA:00:01'}\n"
     b"    addresses: [10.0.0.5/24]\n", "52:54:00:aa:00:01", "10.0.0.5"),
    (b"version: 2\nethernets:\n  eth0:\n    match: {macaddress: '52:54:00:aa:00:02'}\n"
     b"    addresses: [10.0.0.5/24]\n", "52:54:00:aa:00:01", None),  # another NIC's
    (b"version: 2\nethernets:\n  eth0:\n    match: {macaddress: '52:54:00:aa:00:01'}\n"
     b"    addresses: ['fd00::5/64', 10.0.0.6/24]\n", "52:54:00:aa:00:01", "10.0.0.6"),  # IPv4 only
    (b"version: 2\nethernets:\n  eth0:\n    match: {macaddress: '52:54:00:aa:00:01'}\n    dhcp4: true\n",
     "52:54:00:aa:00:01", None),
    (b"version: 1\nconfig: []\n", "52:54:00:aa:00:01", None),
    (b"{{{", "52:54:00:aa:00:01", None),
    (None, "52:54:00:aa:00:01", None),
])
def test_static_address_from_network_config(doc: bytes | None, mac: str, expected: str | None) -> None:
    from testbed.sim.host import static_address

    assert static_address(doc, mac=mac) == expected


async def test_a_malformed_event_over_the_wire_costs_that_event_only(sim: SimHost) -> None:
    """The `malformed_events` knob cuts the next event's body short: the client's subscription raises
    MalformedEvent in its place, then yields the next event; the connection answers calls throughout."""
    state, reason = rpc.AgentLifecycleState, rpc.AgentLifecycleReason
    async with await client(sim) as lv:
        pool = await lv.storage_pool_lookup_by_name("default")
        await lv.storage_vol_create_xml(pool, VOLUME_XML.format(name="g7.qcow2"), 0)
        dom = await lv.domain_define_xml(AGENT_DOMAIN_XML.format(name="g7", mac="07"))
        async with lv.agent_lifecycle_events() as agent:
            await AsyncSimControl(sim_control(sim)).request("set", knobs={"malformed_events": 1})
            await lv.domain_create_with_flags(dom, 0)  # DISCONNECTED (DOMAIN_STARTED): cut short
            with pytest.raises(rpc.MalformedEvent, match="malformed agent lifecycle event"):
                await asyncio.wait_for(anext(aiter(agent)), 5)
            ev = await asyncio.wait_for(anext(aiter(agent)), 5)  # the boot's end: whole
            assert (ev.dom.name, ev.state, ev.reason) == ("g7", state.CONNECTED, reason.CHANNEL)
            assert lv.bad_events == 1 and sim.knobs.malformed_events == 0
            assert lv.is_connected and (await lv.domain_lookup_by_name("g7")).name == "g7"
        await lv.domain_destroy_flags(dom, 0)
