"""The egress policy's decisions as tables (egress_kvm/policy/egress.py): no I/O, every row a rule."""

from __future__ import annotations

import ipaddress

import pytest

from egress_kvm.config.models import EgressConfig
from egress_kvm.policy.egress import (
    Allowlist,
    Policy,
    Purpose,
    Rule,
    Verdict,
    address_class,
    decide,
    parse_rule,
    precheck,
)
from egress_kvm.policy.policies import EgressPolicies, url_image_policy

DEFAULT = EgressPolicies.from_config()
PROBE, AUTH, IMG = Purpose.EXTERNAL_PROBE, Purpose.EXTERNAL_AUTH, Purpose.URL_IMAGE
ip = ipaddress.ip_address


@pytest.mark.parametrize(("address", "verdict"), [
    ("127.0.0.1", Verdict.LOOPBACK),
    ("127.8.9.10", Verdict.LOOPBACK),
    ("::1", Verdict.LOOPBACK),
    ("::ffff:127.0.0.1", Verdict.LOOPBACK),  # v4-mapped: the same host on the wire
    ("64:ff9b::a9fe:a9fe", Verdict.METADATA),  # NAT64 of 169.254.169.254
    ("64:ff9b::cb00:7107", Verdict.ALLOWED),  # NAT64 of 203.0.113.7
    ("2002:7f00:1::", Verdict.LOOPBACK),  # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::1", Verdict.METADATA),  # 6to4 of 169.254.169.254
    ("2002:a00:1::", Verdict.CLUSTER),  # 6to4 of 10.0.0.1
    ("2002:cb00:7107::", Verdict.ALLOWED),  # 6to4 of 203.0.113.7
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Verdict.UNSPECIFIED),  # Teredo: the client is hidden
    ("192.0.0.8", Verdict.UNSPECIFIED),  # IETF protocol assignments
    ("198.18.0.1", Verdict.UNSPECIFIED),  # benchmarking
    ("198.19.255.254", Verdict.UNSPECIFIED),
    ("fec0::1", Verdict.UNSPECIFIED),  # site-local
    ("100::1", Verdict.UNSPECIFIED),  # discard prefix
    ("169.254.169.254", Verdict.METADATA),
    ("fd00:ec2::254", Verdict.METADATA),
    ("169.254.1.1", Verdict.LINK_LOCAL),
    ("fe80::1", Verdict.LINK_LOCAL),
    ("0.0.0.0", Verdict.UNSPECIFIED),
    ("0.1.2.3", Verdict.UNSPECIFIED),  # 0/8 reaches the local host on Linux
    ("::", Verdict.UNSPECIFIED),
    ("224.0.0.1", Verdict.UNSPECIFIED),
    ("255.255.255.255", Verdict.UNSPECIFIED),
    ("10.96.0.1", Verdict.CLUSTER),
    ("172.20.0.5", Verdict.CLUSTER),
    ("192.168.1.1", Verdict.CLUSTER),
    ("100.64.0.1", Verdict.CLUSTER),
    ("fd12::1", Verdict.CLUSTER),
    ("203.0.113.7", Verdict.ALLOWED),
    ("2001:db8::1", Verdict.ALLOWED),
])
def test_address_classes_under_the_default_cluster_ranges(address: str, verdict: Verdict) -> None:
    assert address_class(ip(address), DEFAULT.external_probe.cluster) is verdict


def _policy(purpose: Purpose, allow: list[str] | None, **egress: object) -> Policy:
    cfg = EgressConfig.model_validate(egress)
    if purpose is Purpose.URL_IMAGE:
        return url_image_policy(cfg, allow or [])
    base = EgressPolicies.from_config(cfg).external_probe
    return Policy(purpose, None if allow is None else Allowlist.parse(allow), base.cluster, base.exempt)


@pytest.mark.parametrize(("purpose", "allow", "egress", "host", "port", "address", "verdict"), [
    # External probes: no allowlist -> anything outside the denied ranges
    (PROBE, None, {}, "proxy.example", 3128, "203.0.113.7", Verdict.ALLOWED),
    (PROBE, None, {}, "proxy.example", 3128, "10.0.0.5", Verdict.CLUSTER),
    (PROBE, None, {}, "rebind.example", 3128, "169.254.169.254", Verdict.METADATA),
    # ... a configured allowlist limits them; a CIDR entry lifts a denial, a name entry does not
    (PROBE, ["proxy.example"], {}, "other.example", 3128, "203.0.113.7", Verdict.NOT_ALLOWED),
    (PROBE, ["proxy.example"], {}, "proxy.example", 3128, "10.0.0.5", Verdict.CLUSTER),
    (PROBE, ["10.0.0.0/24:3128"], {}, "proxy.corp", 3128, "10.0.0.5", Verdict.ALLOWED),
    (PROBE, ["10.0.0.0/24:3128"], {}, "proxy.corp", 22, "10.0.0.5", Verdict.CLUSTER),
    # egress.clusterCIDRs replaces the default private ranges; allowedCIDRs exempts, ports included
    (PROBE, None, {"clusterCIDRs": ["10.96.0.0/12"]}, "p", 3128, "10.0.0.5", Verdict.ALLOWED),
    (PROBE, None, {"clusterCIDRs": ["10.96.0.0/12"]}, "p", 3128, "10.96.0.1", Verdict.CLUSTER),
    (PROBE, None, {"allowedCIDRs": ["127.0.0.1/32:8080"]}, "p", 8080, "127.0.0.1",
     Verdict.ALLOWED),
    (PROBE, None, {"allowedCIDRs": ["127.0.0.1/32:8080"]}, "p", 8081, "127.0.0.1",
     Verdict.LOOPBACK),
    # credentials: off without entries, and only where an entry matches
    (AUTH, [], {}, "proxy.example", 3128, "203.0.113.7", Verdict.OFF),
    (AUTH, ["proxy.example:3128"], {}, "proxy.example", 3128, "203.0.113.7", Verdict.ALLOWED),
    (AUTH, ["proxy.example:3128"], {}, "proxy.example", 8080, "203.0.113.7",
     Verdict.NOT_ALLOWED),
    (AUTH, ["*.example"], {}, "a.proxy.example", 1, "203.0.113.7", Verdict.ALLOWED),
    (AUTH, ["*.example"], {}, "example", 1, "203.0.113.7", Verdict.NOT_ALLOWED),
    (AUTH, ["*.example"], {}, "evil-example", 1, "203.0.113.7", Verdict.NOT_ALLOWED),
    # URL images: off without entries
    (IMG, [], {}, "images.example", 443, "203.0.113.7", Verdict.OFF),
    (IMG, ["images.example"], {}, "images.example", 443, "203.0.113.7", Verdict.ALLOWED),
    (IMG, ["images.example"], {}, "images.example", 443, "127.0.0.1", Verdict.LOOPBACK),
    (IMG, ["203.0.113.0/24"], {}, "cdn.example", 443, "203.0.113.7", Verdict.ALLOWED),
])
def test_decisions(purpose: Purpose, allow: list[str] | None, egress: dict, host: str, port: int,
                   address: str,
                   verdict: Verdict) -> None:
    assert decide(_policy(purpose, allow, **egress), host=host, port=port, address=ip(address)) is verdict


@pytest.mark.parametrize(("purpose", "allow", "host", "port", "verdict"), [
    (IMG, [], "images.example", 443, Verdict.OFF),
    (IMG, ["images.example"], "images.example", 443, Verdict.ALLOWED),
    (IMG, ["images.example"], "other.example", 443, Verdict.NOT_ALLOWED),
    (IMG, ["203.0.113.0/24"], "cdn.example", 443, Verdict.ALLOWED),  # DNS decides later
    (IMG, ["images.example"], "169.254.169.254", 80, Verdict.METADATA),  # literal: decided now
    (PROBE, None, "proxy.example", 3128, Verdict.ALLOWED),
    (PROBE, None, "127.0.0.1", 3128, Verdict.LOOPBACK),
    (PROBE, None, "[::1]", 3128, Verdict.LOOPBACK),
    (AUTH, [], "proxy.example", 3128, Verdict.OFF),
])
def test_prechecks_before_dns(purpose: Purpose, allow: list[str] | None, host: str, port: int,
                              verdict: Verdict) -> None:
    assert precheck(_policy(purpose, allow), host=host, port=port) is verdict


@pytest.mark.parametrize(("text", "rule"), [
    ("images.example", Rule(host="images.example")),
    ("Images.Example.:8443", Rule(host="images.example", port=8443)),
    ("*.example.com", Rule(host="*.example.com")),
    ("10.0.0.0/8", Rule(network=ipaddress.ip_network("10.0.0.0/8"))),
    ("10.1.2.3", Rule(network=ipaddress.ip_network("10.1.2.3/32"))),
    ("10.1.2.3:80", Rule(network=ipaddress.ip_network("10.1.2.3/32"), port=80)),
    ("2001:db8::/32", Rule(network=ipaddress.ip_network("2001:db8::/32"))),
    ("[2001:db8::/32]:443", Rule(network=ipaddress.ip_network("2001:db8::/32"), port=443)),
])
def test_rule_syntax(text: str, rule: Rule) -> None:
    assert parse_rule(text) == rule


@pytest.mark.parametrize("text", ["", "a b", "host:0", "host:99999", "host:x", "ex\x00ample", "[::1",
                                  "-bad-.example", "a..b", "http://x/", "*.", "[2001:db8::]x"])
def test_bad_rules_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rule(text)
