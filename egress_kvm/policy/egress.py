"""The egress policy for requests the operator makes on a tenant's behalf, as pure decisions.

Tenants name destinations (a URL image, an External endpoint); the operator then connects from inside
the cluster network, where a request can reach what the tenant cannot: the cloud metadata service,
loopback services of the operator's own pod, the cluster's Services and Pods. So every such request is
decided here, on the address it will really connect to (after DNS resolution, on every redirect hop):

1. an admin's entry *by CIDR* that contains the address (and matches the port) lifts the denials below:
   one in `egress.allowedCIDRs` (any purpose) or in the purpose's own allowlist. An admin who writes
   `127.0.0.1/32` means it; a host-name entry never lifts a denial (the name may resolve anywhere);
2. otherwise an address in a denied range is refused: the fixed set (loopback, link-local with the
   metadata addresses 169.254.169.254 and fd00:ec2::254, unspecified, multicast, reserved) and the
   configurable cluster ranges (default: the private ranges, where pods and Services live);
3. otherwise, where the purpose needs an allowlist (URL images, credentials), the host must match an
   entry by name or the address an entry by CIDR; without one the purpose is off;
4. otherwise (an External probe with no allowlist configured) the address is admitted.

A Managed VM's IP (which its guest reports) is held to the fixed set only: cluster ranges do not apply,
since the VMs themselves live on private LANs.

No I/O here: `connect.py` resolves names and connects to the address that was decided on, so a DNS
answer that changes between check and use (rebinding) cannot redirect the connection.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_CLUSTER_CIDRS: tuple[str, ...] = (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # 0.x.y.z reaches the local host on Linux
#: Special-purpose ranges Python's `is_reserved` leaves out and no public service lives in: IETF protocol
#: assignments, benchmarking, IPv6 site-local (deprecated, still routed on old LANs), Teredo (tunnels
#: to an obfuscated IPv4 the policy cannot see) and the discard prefix.
_SPECIAL = tuple(ipaddress.ip_network(n) for n in (
    "192.0.0.0/24", "198.18.0.0/15", "fec0::/10", "2001::/32", "100::/64"))
_METADATA = (ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"))
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*$")


class Purpose(enum.Enum):
    """Why the operator connects: decides whether an allowlist is required."""

    URL_IMAGE = "URL image"  # placement.image as a URL: off unless allowed
    CONFIGURED_IMAGE = "configured image"  # the admin's own images[].url: denied ranges only
    EXTERNAL_PROBE = "External probe"  # health probe of spec.external.address: allowlist optional
    EXTERNAL_AUTH = "credentials"  # Proxy-Authorization to an External endpoint: allowlist required
    VM_PROBE = "VM probe"  # a Managed VM's IP (reported by its guest): only the fixed denied set applies


class Verdict(enum.Enum):
    """The decision; its value is the fixed phrase shown in status (never remote or library text)."""

    ALLOWED = "allowed"
    LOOPBACK = "is a loopback address"
    METADATA = "is a cloud metadata address"
    LINK_LOCAL = "is a link-local address"
    UNSPECIFIED = "is an unspecified, multicast or reserved address"
    CLUSTER = "is in a cluster range (egress.clusterCIDRs)"
    NOT_ALLOWED = "is not in the allowlist"
    OFF = "is off: the providers file allows no destination for it"

    @property
    def allowed(self) -> bool:
        return self is Verdict.ALLOWED


@dataclass(frozen=True)
class Rule:
    """One allowlist entry: a host name (`*.example.com` for subdomains) or a CIDR, and maybe a port."""

    host: str | None = None
    network: Network | None = None
    port: int | None = None

    def matches_port(self, port: int) -> bool:
        return self.port is None or self.port == port

    def matches_address(self, address: Address, port: int) -> bool:
        return self.network is not None and address in self.network and self.matches_port(port)

    def matches_host(self, host: str, port: int) -> bool:
        if self.host is None or not self.matches_port(port):
            return False
        host = host.lower().rstrip(".")
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host


def parse_rule(text: str) -> Rule:
    """`host`, `host:port`, `*.suffix[:port]`, `CIDR`, `CIDR:port`, `[v6-CIDR]:port`; a bare address
    is its /32 (/128). ValueError saying what is wrong otherwise."""
    if not isinstance(text, str) or not text or any(not c.isprintable() or c.isspace() for c in text):
        raise ValueError("must be a host name or CIDR, optionally with :port, without spaces")
    port: int | None = None
    body = text
    if body.startswith("["):
        inner, sep, rest = body[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError("is not [IPv6-CIDR]:port")
        body, port_text = inner, rest[1:] if rest else None
        port = _port(port_text) if port_text is not None else None
    elif body.count(":") == 1:
        body, port_text = body.split(":")
        port = _port(port_text)
    try:
        network = ipaddress.ip_network(body, strict=False)
    except ValueError:
        network = None
    if network is not None:
        return Rule(network=network, port=port)
    if ":" in body:
        raise ValueError("is not an IP network (write an IPv6 one with a port as [addr/len]:port)")
    name = body[:-1] if body.endswith(".") else body  # a fully qualified name's root dot
    if not _HOST_NAME.fullmatch(name) or len(name) > 253:
        raise ValueError("is not a host name, *.domain, IP address or CIDR")
    return Rule(host=name.lower(), port=port)


def _port(text: str | None) -> int:
    if text is None or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"port {text!r} is not a number in 1..65535")
    return int(text)


@dataclass(frozen=True)
class Allowlist:
    rules: tuple[Rule, ...] = ()

    @classmethod
    def parse(cls, entries: Sequence[str]) -> Allowlist:
        return cls(tuple(parse_rule(e) for e in entries))

    def by_address(self, address: Address, port: int) -> bool:
        return any(r.matches_address(address, port) for r in self.rules)

    def by_host(self, host: str, port: int) -> bool:
        return any(r.matches_host(host, port) for r in self.rules)


@dataclass(frozen=True)
class Policy:
    """What one purpose may reach. `allowlist` None: no allowlist (only for purposes that need none)."""

    purpose: Purpose
    allowlist: Allowlist | None
    cluster: tuple[Network, ...] = tuple(ipaddress.ip_network(c) for c in DEFAULT_CLUSTER_CIDRS)
    exempt: Allowlist = Allowlist()  # egress.allowedCIDRs: exceptions to the denied ranges, any purpose


def address_class(address: Address, cluster: Sequence[Network]) -> Verdict:
    """The denied range an address is in, or ALLOWED."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1 on the wire
    elif isinstance(address, ipaddress.IPv6Address) and address in _NAT64:
        address = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)  # a NAT64 gateway forwards to it
    elif isinstance(address, ipaddress.IPv6Address) and address.sixtofour is not None:
        address = address.sixtofour  # 2002:7f00:1:: is relayed to 127.0.0.1
    if address in _METADATA:
        return Verdict.METADATA
    if address.is_loopback:
        return Verdict.LOOPBACK
    if address.is_link_local:
        return Verdict.LINK_LOCAL
    if (address.is_unspecified or address.is_multicast or address.is_reserved or address in _THIS_NETWORK
            or any(address in net for net in _SPECIAL if net.version == address.version)):
        return Verdict.UNSPECIFIED
    if any(address in net for net in cluster if net.version == address.version):
        return Verdict.CLUSTER
    return Verdict.ALLOWED


def decide(policy: Policy, *, host: str, port: int, address: Address) -> Verdict:
    """The verdict for connecting to `address`:`port`, reached as `host` (a name or the literal)."""
    listed = policy.allowlist is not None and policy.allowlist.by_address(address, port)
    if not listed and not policy.exempt.by_address(address, port):
        denied = address_class(address, policy.cluster)
        if not denied.allowed:
            return denied
    if policy.purpose in (Purpose.URL_IMAGE, Purpose.EXTERNAL_AUTH) or policy.allowlist is not None:
        if policy.allowlist is None or not policy.allowlist.rules:
            return Verdict.OFF
        if not (listed or policy.allowlist.by_host(host, port)):
            return Verdict.NOT_ALLOWED
    return Verdict.ALLOWED


def precheck(policy: Policy, *, host: str, port: int) -> Verdict:
    """What can be decided before DNS: a literal address fully, a name only against the allowlist.

    ALLOWED for a name means "resolve it and decide each address" (the allowlist may hold CIDRs)."""
    literal = ip_literal(host)
    if literal is not None:
        return decide(policy, host=host, port=port, address=literal)
    if policy.allowlist is None:
        needs_list = policy.purpose in (Purpose.URL_IMAGE, Purpose.EXTERNAL_AUTH)
        return Verdict.OFF if needs_list else Verdict.ALLOWED
    if not policy.allowlist.rules:
        return Verdict.OFF
    if policy.allowlist.by_host(host, port) or any(r.network is not None and r.matches_port(port)
                                                   for r in policy.allowlist.rules):
        return Verdict.ALLOWED
    return Verdict.NOT_ALLOWED


def ip_literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


@dataclass(frozen=True)
class Target:
    host: str
    port: int


def url_target(url: str) -> Target:
    """Host and port an http(s) URL connects to; ValueError (fixed text) when it has none."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError("is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("is not an http(s) URL with a host")
    return Target(parts.hostname, port or (443 if parts.scheme == "https" else 80))


_OFF = {
    Purpose.URL_IMAGE: "URL images are off (no kvm.urlImages entry in the providers file)",
    Purpose.EXTERNAL_AUTH: "no endpoint may receive credentials (egress.authEndpoints is empty)",
    Purpose.EXTERNAL_PROBE: "External probes are off",
    Purpose.CONFIGURED_IMAGE: "configured images are off",
    Purpose.VM_PROBE: "VM probes are off",
}


def explain(verdict: Verdict, *, purpose: Purpose, shown: str) -> str:
    """The status phrase: the destination as the tenant wrote it (redacted by the caller), the verdict."""
    if verdict is Verdict.OFF:
        return f"{shown} refused: {_OFF[purpose]}"
    return f"{shown} refused by the egress policy: the destination {verdict.value}"
