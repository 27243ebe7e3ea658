"""Static addresses on a bridge without DHCP: which address a new VM gets, and its cloud-init network-config.

A host whose providers-file entry declares `staticAddresses` gets no address from its LAN: the operator
hands each VM one of the range and writes it into the seed (NoCloud `network-config`, version 2, matched
on the VM's deterministic MAC), so the IP is known before the VM boots and no agent or ARP wait is needed.

There is no separate state store: the address is recorded in the domain's metadata element
(metadata.py), and the addresses in use are read back from the host's domains on every allocation
(`AddressBook.allocate`: one listing, plus a metadata read for each domain not seen before). So an
operator restart, a providers-file reload or a VM deleted out of band needs no repair: the host says
which addresses are taken. Domains of another cluster count too (they share the bridge); a domain no
operator made cannot say its address, so the range must be the operators' alone (docs/kvm-provider.md).

Between the allocation and the domain's definition the address lives only in this process
(`AddressBook.pending`): concurrent creates on one host are serialised by the book's lock around the
allocation, and the reservation lasts until the host lists the domain, the same name allocates again, the
create fails before defining its domain, or the instance is deleted (`release`). There is one book per
libvirt endpoint in the process (`shared_book`), not one per provider object: a providers-file reload
builds new providers while creates that picked up the old ones may still be between allocation and
definition, and the new ones must see those reservations. A create cut off by a crash leaves at most a
seed volume with the address in it and no domain; its retry allocates again and replaces that seed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import weakref
from collections.abc import Collection
from dataclasses import dataclass, field

import yaml

from egress_kvm.config.models import StaticAddresses
from egress_kvm.providers.base import QuotaError
from rpc.constants import DOMAIN_METADATA_ELEMENT, ErrorCode
from rpc.errors import LibvirtError
from rpc.types import Domain

from . import metadata
from .hosts import Host

#: The interface name the network-config gives the VM's NIC (cloud-init renames it by MAC at boot):
#: renderers such as Debian's ifupdown write the stanza under this name, so it must be the real one.
GUEST_NIC = "eth0"


def pick_free(*, first: ipaddress.IPv4Address, last: ipaddress.IPv4Address,
              used: Collection[str]) -> ipaddress.IPv4Address | None:
    """The lowest address of `first..last` that is not in `used` (strings, as metadata holds them);
    None when every one is taken. Addresses outside the range in `used` do not matter."""
    taken = {int(ipaddress.IPv4Address(u)) for u in used if _is_ipv4(u)}
    for n in range(int(first), int(last) + 1):
        if n not in taken:
            return ipaddress.IPv4Address(n)
    return None


def exhausted(*, host: str, bridge: str, config: StaticAddresses, in_use: int) -> QuotaError:
    """The error for a full range: retried slowly, and over once any VM on the host is deleted."""
    size = int(config.last) - int(config.first) + 1
    return QuotaError(f"host {host!r}: no free address in staticAddresses.range {config.range} on bridge "
                      f"{bridge!r} ({size} addresses, {in_use} in use); delete a VM on this host or widen "
                      f"the range")


def network_config(*, mac: str, address: str, config: StaticAddresses) -> bytes:
    """cloud-init network-config version 2 for the VM's one NIC: the address, the default gateway and the
    DNS servers. `gateway4` rather than a default route: Debian's ifupdown renderer writes it as the
    stanza's `gateway`, while a `routes` entry becomes a `route add` that needs net-tools."""
    nic: dict[str, object] = {
        "match": {"macaddress": mac.lower()},
        "set-name": GUEST_NIC,
        "dhcp4": False,
        "addresses": [f"{address}/{config.network.prefixlen}"],
        "gateway4": config.gateway,
    }
    if config.dns:
        nic["nameservers"] = {"addresses": list(config.dns)}
    return yaml.safe_dump({"version": 2, "ethernets": {GUEST_NIC: nic}}, sort_keys=False).encode()


def _is_ipv4(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


@dataclass
class AddressBook:
    """One host's static addresses as this process knows them (see the module docstring)."""

    #: instance name -> address allocated to a create whose domain the host has not listed yet
    pending: dict[str, str] = field(default_factory=dict)
    #: (domain name, uuid) -> the address its metadata records ("" for none): read once per domain
    known: dict[tuple[str, bytes], str] = field(default_factory=dict)
    #: one allocation at a time per host endpoint, across every provider object sharing this book; made
    #: per event loop (a book outliving a loop, as in tests, must not hand a lock bound to it to the next)
    _lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def _loop_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    async def allocate(self, host: Host, name: str, config: StaticAddresses) -> str:
        """The address for instance `name`: its reservation if it has one, else the lowest free one.
        Raises QuotaError when the range is full."""
        async with self._loop_lock():
            listed = await self._listed(host)
            for (dom_name, _), ip in listed.items():
                if dom_name == name and ip:
                    return ip  # defined meanwhile (by a create of ours that raced this one)
            mine = self.pending.get(name)
            if mine is not None:
                return mine
            used = {ip for ip in listed.values() if ip} | set(self.pending.values())
            free = pick_free(first=config.first, last=config.last, used=used)
            if free is None:
                raise exhausted(host=host.name, bridge=host.config.bridge, config=config,
                                in_use=len({u for u in used if _is_ipv4(u) and
                                            config.first <= ipaddress.IPv4Address(u) <= config.last}))
            self.pending[name] = str(free)
            host.log.with_values(name=name).v(1).info("static address allocated", address=str(free),
                                                     range=config.range)
            return str(free)

    def release(self, name: str, address: str | None = None) -> None:
        """The instance is deleted (or, given `address`, its create failed before defining the domain): a
        reservation it still held is free again; with `address`, only if it is still that one."""
        if address is None or self.pending.get(name) == address:
            self.pending.pop(name, None)

    async def _listed(self, host: Host) -> dict[tuple[str, bytes], str]:
        """Every domain on the host with the address its metadata records; reservations of domains the
        host now lists are dropped (the metadata holds them from here on)."""
        listing = await host.call("connect_list_all_domains", lambda lv: lv.connect_list_all_domains(1, 0))
        keys = {(d.name, bytes(d.uuid)): d for d in listing.domains}
        unseen = [d for key, d in keys.items() if key not in self.known]
        for dom, ip in zip(unseen, await asyncio.gather(*(_recorded(host, d) for d in unseen)), strict=True):
            if ip is not None:
                self.known[(dom.name, bytes(dom.uuid))] = ip
        self.known = {k: v for k, v in self.known.items() if k in keys}
        for dom_name, _ in keys:
            self.pending.pop(dom_name, None)
        return dict(self.known)


_BOOKS: weakref.WeakValueDictionary[tuple[object, ...], AddressBook] = weakref.WeakValueDictionary()


def shared_book(*endpoint: object) -> AddressBook:
    """The process's one book for a libvirt endpoint (the provider's dialer, the host's address and
    socket): every provider object over that host, old and new across a providers-file reload, takes
    turns on it and sees the others' reservations. Kept while any provider holds it."""
    book = _BOOKS.get(endpoint)
    if book is None:
        book = AddressBook()
        _BOOKS[endpoint] = book
    return book


async def _recorded(host: Host, dom: Domain) -> str | None:
    """The address a domain's metadata records: "" for none (no element, another shape, no address),
    None when the domain vanished since the listing (not cached: a new one may take the name)."""
    try:
        xml = await host.call("domain_get_metadata", lambda lv: lv.domain_get_metadata(
            dom, DOMAIN_METADATA_ELEMENT, metadata.NAMESPACE, 0))
    except LibvirtError as exc:
        if exc.code == ErrorCode.NO_DOMAIN_METADATA:
            return ""
        if exc.code == ErrorCode.NO_DOMAIN:
            return None
        raise
    try:
        return metadata.parse(xml).address
    except metadata.MetadataError:
        return ""
