"""Which proxy the environment names for the API server, read the way client-go (kubectl, every Go
controller) reads it: Go's net/http ProxyFromEnvironment, i.e. golang.org/x/net/http/httpproxy.

urllib's reading (what aiohttp's `trust_env` used) differs where clusters live: NO_PROXY entries in
CIDR form (`10.0.0.0/8`, the usual way to exempt a cluster's service network) and with a port
(`10.96.0.1:443`) never matched, so an in-cluster operator sent its API traffic to the corporate proxy
that kubectl in the same pod would bypass; and loopback was proxied where Go never proxies it.

The rules (httpproxy's): `HTTPS_PROXY` for https URLs, `HTTP_PROXY` for http ones, upper case first,
then lower case; a value without a scheme means http. `localhost` and loopback addresses are never
proxied. `NO_PROXY` is a comma-separated list of `*` (nothing is proxied), IP addresses and CIDR
prefixes, domain names (the name and its subdomains; `.example.com` or `*.example.com`: subdomains
only), each address or name optionally with `:port`. Pure, so the rules are tested as a table.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_PORTS = {"http": "80", "https": "443"}


def env_proxy(url: str, env: Mapping[str, str]) -> str | None:
    """The proxy URL for requests to `url`, or None for a direct connection."""
    parts = urlsplit(url)
    scheme = parts.scheme or "https"
    if scheme not in DEFAULT_PORTS:
        return None
    proxy = _any(env, f"{scheme.upper()}_PROXY", f"{scheme}_proxy")
    if not proxy:
        return None
    host = (parts.hostname or "").lower()
    try:
        port = str(parts.port or DEFAULT_PORTS[scheme])
    except ValueError:  # a port urllib cannot read: nothing to compare NO_PROXY's ports with
        port = ""
    if not uses_proxy(host, port, _any(env, "NO_PROXY", "no_proxy")):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def uses_proxy(host: str, port: str, no_proxy: str) -> bool:
    """Whether a request to `host`:`port` goes through the proxy under `no_proxy` (httpproxy's useProxy)."""
    if not host:
        return True
    if host == "localhost":
        return False
    ip = _ip(host)
    if ip is not None and ip.is_loopback:
        return False
    for entry in no_proxy.split(","):
        entry = entry.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return False
        if "/" in entry:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                continue
            if ip is not None and ip.version == network.version and ip in network:
                return False
            continue
        name, want_port = _split_port(entry)
        if not name:
            continue
        if want_port and want_port != port:
            continue
        entry_ip = _ip(name)
        if entry_ip is not None:
            if ip is not None and ip == entry_ip:
                return False
            continue
        if name.startswith("*."):
            name = name[1:]
        if host.endswith(name if name.startswith(".") else f".{name}") or host == name:
            return False
    return True


def _any(env: Mapping[str, str], *names: str) -> str:
    for name in names:
        if env.get(name):
            return env[name]
    return ""


def _ip(text: str) -> IP | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 zone does not change the address
    except ValueError:
        return None


def _split_port(entry: str) -> tuple[str, str]:
    """`host:port`, `[v6]:port` or a bare host (a bare IPv6 address has colons but no port)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else ""
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, port
    return entry, ""
