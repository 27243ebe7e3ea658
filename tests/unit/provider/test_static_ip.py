"""Static addresses on a bridge without DHCP: the allocation rule as a table, the network-config, and the
provider over the fake libvirt (never twice, also concurrently; freed on delete; rebuilt after a restart
from the domains' metadata; the IP known before boot; the nwfilter pinned to it)."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

import pytest
import yaml
from fakes import FakeHypervisors, fake_kvm_provider, kvm_config, seed_of
from lxml import etree
from provider_helpers import request

from egress_kvm.config.models import StaticAddresses
from egress_kvm.providers.base import PowerState, QuotaError
from egress_kvm.providers.kvm import KvmProvider, metadata, naming, seed
from egress_kvm.providers.kvm.static_ip import exhausted, network_config, pick_free

A = ipaddress.IPv4Address
STATIC = {"cidr": "192.0.2.0/24", "gateway": "192.0.2.1", "dns": ["192.0.2.53"],
          "range": "192.0.2.10-192.0.2.12"}


def provider_on(hv: FakeHypervisors, *, cluster_id: str) -> KvmProvider:
    """Another KvmProvider (a restarted operator, or another cluster's) over the same fake hosts."""
    entry = kvm_config(hosts=["host0"], host_entries=hosts())
    return KvmProvider(name=entry.name, config=entry.kvm, cluster_id=cluster_id, dial=hv.dial)


def hosts(static: dict[str, Any] | None = None, names: tuple[str, ...] = ("host0",)) -> list[dict[str, Any]]:
    return [{"name": h, "address": f"{h}.test:22", "user": "virt", "bridge": "br0",
             "staticAddresses": static or STATIC} for h in names]


@pytest.mark.parametrize(("first", "last", "used", "expected"), [
    ("10.0.0.10", "10.0.0.12", [], "10.0.0.10"),
    ("10.0.0.10", "10.0.0.12", ["10.0.0.10"], "10.0.0.11"),
    ("10.0.0.10", "10.0.0.12", ["10.0.0.11"], "10.0.0.10"),  # the lowest free, not the next after the last
    ("10.0.0.10", "10.0.0.12", ["10.0.0.10", "10.0.0.11"], "10.0.0.12"),
    ("10.0.0.10", "10.0.0.12", ["10.0.0.10", "10.0.0.11", "10.0.0.12"], None),  # exhausted
    ("10.0.0.10", "10.0.0.10", [], "10.0.0.10"),  # a range of one
    ("10.0.0.10", "10.0.0.10", ["10.0.0.10"], None),
    ("10.0.0.10", "10.0.0.12", ["10.0.0.9", "10.0.0.13", "", "garbage"], "10.0.0.10"),  # outside: no matter
    ("10.0.0.254", "10.0.1.1", ["10.0.0.254", "10.0.0.255"], "10.0.1.0"),  # integer order across octets
])
def test_pick_free(first: str, last: str, used: list[str], expected: str | None) -> None:
    got = pick_free(first=A(first), last=A(last), used=used)
    assert (str(got) if got is not None else None) == expected


def test_exhaustion_is_a_quota_error_naming_host_bridge_and_range() -> None:
    err = exhausted(host="nas1", bridge="br0", config=StaticAddresses.model_validate(STATIC), in_use=3)
    assert isinstance(err, QuotaError)
    assert str(err) == ("host 'nas1': no free address in staticAddresses.range 192.0.2.10-192.0.2.12 on "
                        "bridge 'br0' (3 addresses, 3 in use); delete a VM on this host or widen the range")


def test_network_config_is_v2_matching_the_mac() -> None:
    cfg = StaticAddresses.model_validate(STATIC)
    doc = yaml.safe_load(network_config(mac="52:54:00:AB:cd:01", address="192.0.2.11", config=cfg))
    assert doc == {"version": 2, "ethernets": {"eth0": {
        "match": {"macaddress": "52:54:00:ab:cd:01"}, "set-name": "eth0", "dhcp4": False,
        "addresses": ["192.0.2.11/24"], "gateway4": "192.0.2.1",
        "nameservers": {"addresses": ["192.0.2.53"]}}}}
    no_dns = yaml.safe_load(network_config(mac="52:54:00:ab:cd:01", address="192.0.2.11",
                                           config=StaticAddresses.model_validate({**STATIC, "dns": []})))
    assert "nameservers" not in no_dns["ethernets"]["eth0"]


def test_metadata_round_trips_the_address_and_refuses_a_bad_one() -> None:
    from datetime import UTC, datetime

    meta = metadata.InstanceMetadata(cluster_id="c1", owner_uid="u",
                                     created_at=datetime(2026, 1, 1, tzinfo=UTC), address="192.0.2.10")
    assert metadata.parse(metadata.to_xml(meta)).address == "192.0.2.10"
    assert "address" not in metadata.to_xml(metadata.InstanceMetadata(
        cluster_id="c1", owner_uid="u", created_at=datetime(2026, 1, 1, tzinfo=UTC)))
    for bad in ("192.0.2.10; rm -rf /", " 192.0.2.10", "192.0.2.010", "", "fd00::1"):
        with pytest.raises(metadata.MetadataError, match="metadata address"):  # strict, like `created`
            metadata.parse(metadata.to_xml(meta).replace('ip="192.0.2.10"', f'ip="{bad}"'))


async def test_create_knows_the_ip_before_boot_and_writes_seed_metadata_and_filter() -> None:
    provider, hv = fake_kvm_provider(host_entries=hosts())
    h = hv["host0"]
    name = "proxy-static"
    try:
        inst = await provider.create(request(name))
        assert inst.ip == "192.0.2.10"
        files = seed.read_seed_iso(bytes(h.volumes[seed_of(name)].data[:])).files
        net = yaml.safe_load(files["network-config"])
        assert net["ethernets"]["eth0"]["match"]["macaddress"] == naming.mac_address(name)
        assert net["ethernets"]["eth0"]["addresses"] == ["192.0.2.10/24"]
        dom = etree.fromstring(h.domains[name].xml.encode())
        element = etree.tostring(dom.find("metadata")[0], encoding="unicode")
        assert metadata.parse(element).address == "192.0.2.10"
        params = {p.get("name"): p.get("value")
                  for p in dom.iterfind("devices/interface/filterref/parameter")}
        assert params == {"IP": "192.0.2.10"}  # pinned to it; nothing to learn without DHCP
        # No agent, no neighbour entry: the address is the metadata's, and no address source is asked.
        h.calls.clear()
        h.exec_log.clear()
        got = await provider.get(name, "host0")
        assert got is not None and got.power_state == PowerState.RUNNING and got.ip == "192.0.2.10"
        assert h.calls == ["domain_lookup_by_name", "domain_get_metadata", "domain_get_state"]
        assert h.exec_log == []  # no `ip neigh` either
    finally:
        await provider.close()


async def test_a_dhcp_host_gets_no_network_config_and_learns_its_ip() -> None:
    provider, hv = fake_kvm_provider()
    try:
        inst = await provider.create(request("proxy-dhcp"))
        assert inst.ip is None
        iso = bytes(hv["host0"].volumes[seed_of("proxy-dhcp")].data[:])
        files = seed.read_seed_iso(iso).files
        assert "network-config" not in files
        dom = etree.fromstring(hv["host0"].domains["proxy-dhcp"].xml.encode())
        assert [p.get("name") for p in dom.iterfind("devices/interface/filterref/parameter")] == [
            "CTRL_IP_LEARNING"]
    finally:
        await provider.close()


async def test_concurrent_creates_never_share_an_address_and_the_full_range_is_a_quota_error() -> None:
    provider, hv = fake_kvm_provider(host_entries=hosts())
    try:
        names = [f"proxy-c{i}" for i in range(4)]
        results = await asyncio.gather(*(provider.create(request(n, uid=n)) for n in names),
                                       return_exceptions=True)
        ok = [r for r in results if not isinstance(r, BaseException)]
        failed = [r for r in results if isinstance(r, BaseException)]
        assert sorted(i.ip for i in ok) == ["192.0.2.10", "192.0.2.11", "192.0.2.12"]
        assert len(failed) == 1 and isinstance(failed[0], QuotaError), failed
        assert "host 'host0': no free address in staticAddresses.range 192.0.2.10-192.0.2.12" in str(
            failed[0])
        assert len(hv["host0"].domains) == 3
        assert provider.host("host0").locks == {}
    finally:
        await provider.close()


async def test_delete_frees_the_address_for_the_next_create() -> None:
    provider, _ = fake_kvm_provider(host_entries=hosts())
    try:
        for n in ("proxy-a", "proxy-b", "proxy-c"):
            await provider.create(request(n, uid=n))
        await provider.delete("proxy-b", "host0")
        assert (await provider.create(request("proxy-d", uid="d"))).ip == "192.0.2.11"
    finally:
        await provider.close()


async def test_a_restarted_operator_rebuilds_the_used_set_from_the_hosts_metadata() -> None:
    first, hv = fake_kvm_provider(host_entries=hosts(), cluster_id="c1")
    try:
        await first.create(request("proxy-a", uid="a"))
        await first.create(request("proxy-b", uid="b"))
    finally:
        await first.close()
    # A new process: nothing in memory, the same host. Another cluster's VMs on the bridge count too.
    restarted, other = provider_on(hv, cluster_id="c1"), provider_on(hv, cluster_id="c2")
    try:
        got = await restarted.get("proxy-a", "host0")
        assert got is not None and got.ip == "192.0.2.10"
        assert (await restarted.create(request("proxy-c", uid="c"))).ip == "192.0.2.12"
        await restarted.delete("proxy-a", "host0")
        assert (await other.create(request("proxy-x", uid="x"))).ip == "192.0.2.10"  # freed, taken by c2
        with pytest.raises(QuotaError):  # .10 is c2's, .11 and .12 ours
            await restarted.create(request("proxy-d", uid="d"))
    finally:
        await restarted.close()
        await other.close()


async def test_a_retried_create_keeps_its_reservation() -> None:
    provider, hv = fake_kvm_provider(host_entries=hosts())
    h = hv["host0"]
    try:
        # A create that allocated and then failed before defining its domain leaves its reservation.
        host = provider.host("host0")
        book = provider._addresses["host0"]
        assert host.config.static_addresses is not None
        assert await book.allocate(host, "proxy-r", host.config.static_addresses) == "192.0.2.10"
        assert "proxy-r" not in h.domains
        # Another create meanwhile does not get it, the same name gets it again, delete frees it.
        assert (await provider.create(request("proxy-o", uid="o"))).ip == "192.0.2.11"
        assert (await provider.create(request("proxy-r", uid="r"))).ip == "192.0.2.10"
        await provider.delete("proxy-r", "host0")
        assert book.pending == {}
    finally:
        await provider.close()


async def test_a_reloaded_provider_sees_the_reservations_of_the_one_it_replaces() -> None:
    # A providers-file reload builds a new provider while a create on the old one may sit between its
    # allocation and its domain's definition: the new one must not hand that address out again.
    old, hv = fake_kvm_provider(host_entries=hosts(), cluster_id="c1")
    new = provider_on(hv, cluster_id="c1")
    try:
        host = old.host("host0")
        assert host.config.static_addresses is not None
        assert await old._addresses["host0"].allocate(host, "proxy-r", host.config.static_addresses) == (
            "192.0.2.10")
        assert (await new.create(request("proxy-o", uid="o"))).ip == "192.0.2.11"
        assert (await old.create(request("proxy-r", uid="r"))).ip == "192.0.2.10"
    finally:
        await old.close()
        await new.close()
    # Another set of hosts (another endpoint) shares nothing.
    other, _ = fake_kvm_provider(host_entries=hosts(), cluster_id="c1")
    try:
        assert other._addresses["host0"].pending == {}
    finally:
        await other.close()


async def test_a_create_failing_before_its_domain_is_defined_frees_its_address() -> None:
    from egress_kvm.providers.base import TransientError
    from rpc.constants import ErrorCode
    from rpc.errors import LibvirtError

    provider, hv = fake_kvm_provider(host_entries=hosts())
    try:
        hv["host0"].fail["domain_define_xml"] = LibvirtError(ErrorCode.INTERNAL_ERROR, "INTERNAL_ERROR", 0,
                                                             "boom")
        with pytest.raises(TransientError, match="boom"):
            await provider.create(request("proxy-f", uid="f"))
        assert provider._addresses["host0"].pending == {}
        assert (await provider.create(request("proxy-g", uid="g"))).ip == "192.0.2.10"
    finally:
        await provider.close()
