"""Finding a VM's IPv4 address: the guest agent first, then ARP, then the host's neighbour table.

A source that errors (no agent yet; libvirt's ARP source failing with "wrong nlmsg len" on some
kernels) counts as "no address from it" and is logged at V(1): a VM still booting is not a failed
reconcile. Where libvirt's ARP source errors, the host's neighbour table is read over the same SSH
connection (`ip -j neigh show dev <bridge>`) and matched by the VM's MAC; if the SSH user may not run
`ip`, that fallback is skipped. ARP is best effort either way: the host only learns a VM's address once
the VM talks to it (DHCP, gateway traffic).

The address reported is IPv4, not link-local, on the NIC with the VM's deterministic MAC.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable

from rpc.constants import InterfaceAddressesSource, IPAddrType
from rpc.errors import LibvirtError
from rpc.types import Domain, DomainInterface

from .hosts import Host
from .session import ExecNotAllowed


def usable_ipv4(addr: str) -> bool:
    try:
        ip = ipaddress.IPv4Address(addr)
    except ValueError:
        return False
    return not (ip.is_link_local or ip.is_loopback or ip.is_unspecified or ip.is_multicast)


def pick_address(interfaces: Iterable[DomainInterface], mac: str) -> str | None:
    """The first usable IPv4 of the interface whose hwaddr is `mac` (libvirt DomainInterface shapes)."""
    for iface in interfaces:
        if (iface.hwaddr or "").lower() != mac.lower():
            continue
        for a in iface.addrs:
            if a.type_ == IPAddrType.IPV4 and usable_ipv4(a.addr):
                return str(a.addr)
    return None


def pick_neighbour(neigh_json: str, mac: str) -> str | None:
    """From `ip -j neigh show dev BR`: a usable IPv4 whose lladdr is `mac` and whose entry is not FAILED."""
    try:
        entries = json.loads(neigh_json or "[]")
    except json.JSONDecodeError:
        return None
    if not isinstance(entries, list):
        return None
    for e in entries:
        if not isinstance(e, dict) or str(e.get("lladdr", "")).lower() != mac.lower():
            continue
        states = e.get("state") or []
        if isinstance(states, str):
            states = [states]
        if any(s in ("FAILED", "INCOMPLETE") for s in states):
            continue
        addr = str(e.get("dst", ""))
        if usable_ipv4(addr):
            return addr
    return None


async def discover(host: Host, dom: Domain, *, mac: str, bridge: str, name: str) -> str | None:
    log = host.log.with_values(name=name).v(1)
    agent_error: str | None = None
    try:
        agent = InterfaceAddressesSource.AGENT
        ifaces = await host.call("domain_interface_addresses",
                                 lambda lv: lv.domain_interface_addresses(dom, agent, 0))
        ip = pick_address(ifaces, mac)
        if ip:
            return ip
    except LibvirtError as exc:
        agent_error = exc.message
        log.info("address source gave nothing", source="agent", error=exc.message,
                 libvirtCode=exc.code, libvirtCodeName=exc.code_name)
    try:
        arp = InterfaceAddressesSource.ARP
        ifaces = await host.call("domain_interface_addresses",
                                 lambda lv: lv.domain_interface_addresses(dom, arp, 0))
        return pick_address(ifaces, mac)
    except LibvirtError as exc:
        log.info("address source gave nothing", source="arp", error=exc.message,
                 libvirtCode=exc.code, libvirtCodeName=exc.code_name, agentError=agent_error)
    try:
        result = await host.exec(["ip", "-j", "neigh", "show", "dev", bridge])
    except ExecNotAllowed as exc:
        log.info("address source gave nothing", source="neighbour-table", error=str(exc))
        return None
    if result.exit_status != 0:
        log.info("address source gave nothing", source="neighbour-table",
                 error=(result.stderr.strip() or f"ip exited {result.exit_status}")[:300])
        return None
    ip = pick_neighbour(result.stdout, mac)
    if ip:
        extra = {"addresses": [ip]} if log.enabled(1) else {}  # addresses are V(2) detail
        log.info("address from the host's neighbour table", mac=mac, bridge=bridge, **extra)
    return ip
