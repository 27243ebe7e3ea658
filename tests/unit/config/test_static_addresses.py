"""The providers file's `staticAddresses`: a good entry parses; every bad one names the field and value."""

from __future__ import annotations

from typing import Any

import pytest

from egress_kvm.config import ConfigError, parse_providers

SA = "providers[0].kvm.hosts[0].staticAddresses"
GOOD = {"cidr": "192.168.10.0/24", "gateway": "192.168.10.1", "dns": ["192.168.10.1", "9.9.9.9"],
        "range": "192.168.10.100-192.168.10.199"}


def doc(*static: dict[str, Any] | None) -> list[dict[str, Any]]:
    hosts = []
    for i, s in enumerate(static):
        h: dict[str, Any] = {"name": f"nas{i}", "address": f"nas{i}.lan:22", "user": "virt", "bridge": "br0"}
        if s is not None:
            h["staticAddresses"] = s
        hosts.append(h)
    return [{"name": "kvm-home", "type": "kvm", "kvm": {
        "sshKeyFile": "/keys/id", "insecureIgnoreHostKey": True,
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 512}}, "hosts": hosts}}]


def error_of(document: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_providers(document, source="f.yaml")
    return str(info.value)


def test_a_good_entry_parses_and_is_optional() -> None:
    cfg = parse_providers(doc(GOOD, None), source="f.yaml").providers[0].kvm
    assert cfg is not None
    s = cfg.hosts[0].static_addresses
    assert s is not None
    assert (str(s.first), str(s.last), s.network.prefixlen) == ("192.168.10.100", "192.168.10.199", 24)
    assert s.dns == ["192.168.10.1", "9.9.9.9"]
    assert cfg.hosts[1].static_addresses is None
    spaced = parse_providers(doc({**GOOD, "range": "192.168.10.5 - 192.168.10.5", "dns": []}), source="f")
    assert spaced.providers[0].kvm.hosts[0].static_addresses.range == "192.168.10.5-192.168.10.5"  # type: ignore[union-attr]


@pytest.mark.parametrize(("change", "path", "fragment"), [
    ({"cidr": "192.168.10.0/33"}, f"{SA}.cidr", "is not an IPv4 CIDR"),
    ({"cidr": "fd00::/64"}, f"{SA}.cidr", "is not an IPv4 CIDR"),
    ({"cidr": "192.168.10.7/24"}, f"{SA}.cidr", "host bits set: the network is 192.168.10.0/24"),
    ({"cidr": "192.168.10.0/31"}, f"{SA}.cidr", "smaller than a /30"),
    ({"gateway": "gw.lan"}, f"{SA}.gateway", "gateway 'gw.lan' is not an IPv4 address"),
    ({"dns": ["1.1.1.1", "dns.lan"]}, f"{SA}.dns", "entry [1] 'dns.lan' is not an IPv4"),
    ({"range": "192.168.10.100"}, f"{SA}.range", "is not first-last"),
    ({"range": "192.168.10.9-192.168.10.2"}, f"{SA}.range", "first address is after the last"),
    ({"range": "192.168.10.100-x"}, f"{SA}.range", "last address 'x' is not an IPv4"),
    ({"range": "192.168.10.100-192.168.11.5"}, f"{SA}",
     "its last address 192.168.11.5 is outside cidr 192.168.10.0/24"),
    ({"range": "192.168.9.250-192.168.10.5"}, f"{SA}",
     "its first address 192.168.9.250 is outside cidr"),
    ({"range": "192.168.10.0-192.168.10.5"}, f"{SA}", "network or broadcast address"),
    ({"range": "192.168.10.200-192.168.10.255"}, f"{SA}", "network or broadcast address"),
    ({"gateway": "192.168.11.1"}, f"{SA}", "gateway 192.168.11.1 is not a host address of cidr"),
    ({"gateway": "192.168.10.255"}, f"{SA}", "gateway 192.168.10.255 is not a host address"),
    ({"gateway": "192.168.10.150"}, f"{SA}",
     "gateway 192.168.10.150 is inside range 192.168.10.100-192.168.10.199"),
    ({"netmask": "255.255.255.0"}, f"{SA}.netmask", "unknown key"),
])
def test_each_rejection_names_the_field_and_the_value(change: dict[str, Any], path: str,
                                                      fragment: str) -> None:
    message = error_of(doc({**GOOD, **change}))
    assert f"{path}: " in message
    assert fragment in message


def test_missing_fields_are_named() -> None:
    message = error_of(doc({"cidr": "192.168.10.0/24"}))
    assert f"{SA}.gateway: is required" in message
    assert f"{SA}.range: is required" in message


def test_two_hosts_ranges_must_not_overlap() -> None:
    other = {**GOOD, "range": "192.168.10.199-192.168.10.210"}
    message = error_of(doc(GOOD, other))
    assert "hosts[1].staticAddresses.range overlaps hosts[0].staticAddresses.range" in message
    apart = {**GOOD, "range": "192.168.10.200-192.168.10.210"}
    assert parse_providers(doc(GOOD, None, apart), source="f").providers[0].kvm is not None
