"""Finding a VM's IPv4 address: what the guest agent says, confirmed by the host's neighbour table.

The guest agent runs inside the tenant's VM, so what it reports is the guest's claim, not a fact: taken
alone it would let a tenant point its endpoint (and the operator's probes) at another machine's address.
An agent address becomes the endpoint only when the host's own table maps it to the VM's MAC
(`decide`): first `ip -j neigh show dev <bridge>` over the same SSH connection (no libvirt RPC), else,
if the SSH user may not run `ip`, libvirt's ARP source (which reads the same kernel table). Without the
agent, the host table's address for the MAC is the answer, as before. A source that errors (no agent
yet; libvirt's ARP source failing with "wrong nlmsg len" on some kernels) counts as "no address from
it" and is logged at V(1): a VM still booting is not a failed reconcile. The host learns a VM's address
once the VM talks to it (its DHCP reply, gateway traffic); until then there is no endpoint yet.

The address reported is IPv4, not link-local, on the NIC with the VM's deterministic MAC.

A VM can also be *stranded* (`stranded`): the guest reports addresses and the host maps none of them to
its MAC (it may still map the old one, for a while). That is what a DHCP address change looks like
under the `clean-traffic` nwfilter: libvirt's DHCP snooping pins a NIC's filter to the first address it
learned, so the guest's ARP and IP from the new address are dropped (docs/kvm-provider.md, "When the
VM's DHCP address changes"). A VM on its first boot whose packets have not reached the host yet looks
the same, so the controller weighs it against what it knew (plan.py); `unanswered` adds the host's own
evidence: it tried every claimed address and got no answer (FAILED or INCOMPLETE entries). The guest's
word decides no address: the repair (a fresh definition of the VM, whose filter learns the DHCP
server's lease again at boot) never takes the address from the guest.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from egress_kvm.log import Logger
from rpc.constants import InterfaceAddressesSource, IPAddrType
from rpc.errors import LibvirtError
from rpc.types import Domain, DomainInterface

from .hosts import Host
from .session import ExecNotAllowed
from .together import together

NEIGH_CACHE_SIZE = 16  # recent `ip -j neigh` outputs kept read (_table): one or two per host


def usable_ipv4(addr: str) -> bool:
    try:
        ip = ipaddress.IPv4Address(addr)
    except ValueError:
        return False
    return not (ip.is_link_local or ip.is_loopback or ip.is_unspecified or ip.is_multicast)


def pick_addresses(interfaces: Iterable[DomainInterface], mac: str) -> list[str]:
    """The usable IPv4s of the interfaces whose hwaddr is `mac` (libvirt DomainInterface shapes)."""
    out: list[str] = []
    for iface in interfaces:
        if (iface.hwaddr or "").lower() != mac.lower():
            continue
        out.extend(str(a.addr) for a in iface.addrs if a.type_ == IPAddrType.IPV4 and usable_ipv4(a.addr))
    return out


def pick_address(interfaces: Iterable[DomainInterface], mac: str) -> str | None:
    """The first usable IPv4 of the interface whose hwaddr is `mac`."""
    return next(iter(pick_addresses(interfaces, mac)), None)


@dataclass(frozen=True)
class HostTable:
    """The host's neighbour table as far as one VM is concerned."""

    mapped: tuple[str, ...] = ()  # usable IPv4s mapped to the VM's MAC (not FAILED/INCOMPLETE)
    failed: frozenset[str] = frozenset()  # addresses the host tried and got no answer from (any MAC)
    # False when no source could be read (exec refused or failed, output not JSON, libvirt's ARP call
    # failed): an empty table then says nothing about the VM, so it must not make it stranded.
    read: bool = True


@dataclass(frozen=True)
class Found:
    """What `discover` concluded: the endpoint, or the guest's addresses when the VM is stranded."""

    ip: str | None
    stranded: tuple[str, ...] = ()
    unanswered: bool = False  # the host tried every stranded address and got no answer


def stranded(*, agent: Sequence[str], table: HostTable) -> tuple[str, ...]:
    """The guest's addresses when the host maps none of them to the VM's MAC; empty when there is no
    claim (no agent) or one is confirmed. The host may still map another (an OVERRULED endpoint: most
    often the VM's old address, until the host's next attempt at it fails). Never from a table that could
    not be read: a host whose SSH session limit refuses the exec is no reason to restart a healthy VM."""
    if not table.read:
        return ()
    return () if any(ip in table.mapped for ip in agent) else tuple(agent)


def unanswered(claims: Sequence[str], table: HostTable) -> bool:
    """The host asked for every one of `claims` and nobody answered."""
    return bool(claims) and all(ip in table.failed for ip in claims)


class Verdict(enum.Enum):
    CONFIRMED = "confirmed"  # the agent's address, and the host maps it to the VM's MAC
    HOST_ONLY = "host-only"  # no agent address: the host table's
    OVERRULED = "overruled"  # the agent claims addresses the host does not map to this MAC: the host's
    UNCONFIRMED = "unconfirmed"  # the agent claims an address the host has not seen for this MAC: none yet
    NONE = "none"  # nobody knows an address yet


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    ip: str | None


def decide(*, agent: Sequence[str], host: Sequence[str]) -> Decision:
    """The endpoint from the guest's claim (`agent`) and the host's table for the VM's MAC (`host`).

    The host table is the authority: an agent address only counts when the host agrees."""
    for ip in agent:
        if ip in host:
            return Decision(Verdict.CONFIRMED, ip)
    if host:
        return Decision(Verdict.OVERRULED if agent else Verdict.HOST_ONLY, host[0])
    return Decision(Verdict.UNCONFIRMED if agent else Verdict.NONE, None)


def _states(entry: dict[str, Any]) -> list[Any]:
    states = entry.get("state") or []
    return [states] if isinstance(states, str) else states if isinstance(states, list) else []


def _failed(entries: list[Any]) -> frozenset[str]:
    return frozenset(str(e.get("dst", "")) for e in entries
                     if isinstance(e, dict) and any(s in ("FAILED", "INCOMPLETE") for s in _states(e))
                     and usable_ipv4(str(e.get("dst", ""))))


@dataclass(frozen=True)
class _Table:
    """One `ip -j neigh` output read once: the usable addresses by MAC (lower case), and the failed."""

    by_mac: dict[str, tuple[str, ...]]
    failed: frozenset[str]


@functools.lru_cache(maxsize=NEIGH_CACHE_SIZE)
def _table(neigh_json: str) -> _Table | None:
    """The host's table, by MAC; None when it is not a JSON list. Every Proxy's IP look on a host reads
    the same shared output (Host.shared_exec): read once, it is not parsed again per VM (at 100 VMs a
    host, parsing it whole for each was most of an IP look's cost)."""
    try:
        parsed = json.loads(neigh_json or "[]")
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, list):
        return None
    by_mac: dict[str, list[str]] = {}
    for e in parsed:
        if not isinstance(e, dict) or any(s in ("FAILED", "INCOMPLETE") for s in _states(e)):
            continue
        addr = str(e.get("dst", ""))
        if usable_ipv4(addr):
            by_mac.setdefault(str(e.get("lladdr", "")).lower(), []).append(addr)
    return _Table({mac: tuple(ips) for mac, ips in by_mac.items()}, _failed(parsed))


def host_table(neigh_json: str, mac: str) -> HostTable:
    """`ip -j neigh` output as one VM's table; not `read` when it is not a JSON list."""
    table = _table(neigh_json)
    if table is None:
        return HostTable(read=False)
    return HostTable(table.by_mac.get(mac.lower(), ()), table.failed)


async def _host_table(host: Host, dom: Domain, *, mac: str, bridge: str, log: Logger) -> HostTable:
    """The host's IPv4s for `mac`: `ip -j neigh` over SSH, else libvirt's ARP source (which tells no
    failed entries); not `read` if neither answered."""
    neigh_error: str
    try:
        result = await host.shared_exec(["ip", "-j", "neigh", "show", "dev", bridge])
    except ExecNotAllowed as exc:
        neigh_error = str(exc)
    else:
        if result.exit_status == 0 and (table := host_table(result.stdout, mac)).read:
            return table
        elif result.exit_status == 0:
            neigh_error = "ip printed no JSON list"
        else:
            neigh_error = (result.stderr.strip() or f"ip exited {result.exit_status}")[:300]
    log.info("address source gave nothing", source="neighbour-table", error=neigh_error)
    try:
        arp = InterfaceAddressesSource.ARP
        ifaces = await host.call("domain_interface_addresses",
                                 lambda lv: lv.domain_interface_addresses(dom, arp, 0))
    except LibvirtError as exc:
        log.info("address source gave nothing", source="arp", error=exc.message,
                 libvirtCode=exc.code, libvirtCodeName=exc.code_name)
        return HostTable(read=False)
    return HostTable(tuple(pick_addresses(ifaces, mac)))


@dataclass(frozen=True)
class Sources:
    """What the two address sources said: the guest's claim and the host's table for the VM's MAC."""

    agent: tuple[str, ...]
    table: HostTable


async def read_sources(host: Host, dom: Domain, *, mac: str, bridge: str, name: str) -> Sources:
    """Ask both sources at once. Reads only, and neither needs anything but the domain handle, so a Get
    may send them beside its metadata and state reads (provider.py) and drop them if the VM turns out not
    to be running: an error of either is "no address from it", never the Get's failure."""
    log = host.log.with_values(name=name).v(1)

    async def from_agent() -> list[str]:
        try:
            source = InterfaceAddressesSource.AGENT
            ifaces = await host.call("domain_interface_addresses",
                                     lambda lv: lv.domain_interface_addresses(dom, source, 0))
        except LibvirtError as exc:
            log.info("address source gave nothing", source="agent", error=exc.message,
                     libvirtCode=exc.code, libvirtCodeName=exc.code_name)
            return []
        return pick_addresses(ifaces, mac)

    # The guest's claim and the host's table are independent: asked at once (together.py).
    agent, table = await together(from_agent(), _host_table(host, dom, mac=mac, bridge=bridge, log=log))
    return Sources(tuple(agent), table)


async def discover(host: Host, dom: Domain, *, mac: str, bridge: str, name: str) -> Found:
    return conclude(host, await read_sources(host, dom, mac=mac, bridge=bridge, name=name),
                    mac=mac, bridge=bridge, name=name)


def conclude(host: Host, sources: Sources, *, mac: str, bridge: str, name: str) -> Found:
    """The endpoint from what the sources said (`decide`), logged as before."""
    log = host.log.with_values(name=name).v(1)
    agent, table = list(sources.agent), sources.table
    decision = decide(agent=agent, host=table.mapped)
    lost = stranded(agent=agent, table=table)  # non-empty beside an OVERRULED endpoint too
    silent = unanswered(lost, table)
    extra: dict[str, Any] = {"agentAddresses": agent, "address": decision.ip} if log.enabled(1) else {}
    if decision.verdict is Verdict.HOST_ONLY:
        log.info("address from the host's neighbour table", mac=mac, bridge=bridge, **extra)
    elif decision.verdict in (Verdict.OVERRULED, Verdict.UNCONFIRMED):
        # Not an error (a VM whose first packet has not reached the host yet is UNCONFIRMED too), but a
        # guest that keeps claiming an address its MAC does not hold is worth seeing.
        host.log.with_values(name=name).info("guest agent address not confirmed by the host's neighbour "
                                             "table", verdict=decision.verdict.value, mac=mac,
                                             **extra, unanswered=silent)
    return Found(decision.ip, lost, silent)
