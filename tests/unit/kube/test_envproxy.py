"""The API server's proxy is chosen from the environment by client-go's rules (golang.org/x/net/http/
httpproxy), so the operator goes direct exactly where kubectl in the same pod does. The rows marked
"urllib:" are where urllib's reading (aiohttp's trust_env, the earlier behaviour) chose otherwise."""

from __future__ import annotations

import pytest

from egress_kvm.kube.envproxy import env_proxy

CORP = "http://corp:3128"
HTTPS = {"HTTPS_PROXY": CORP}
API = "https://10.96.0.1:443"

CASES = [
    # (what, url, env, proxy)
    ("nothing set", API, {}, None),
    ("https uses HTTPS_PROXY", "https://api.example:6443", HTTPS, CORP),
    ("lower case works too", "https://api.example:6443", {"https_proxy": CORP}, CORP),
    ("urllib: upper case first, as in Go", "https://api.example:6443",
     {"https_proxy": "http://low:1", "HTTPS_PROXY": "http://up:2"}, "http://up:2"),
    ("an empty upper case falls back to lower case", "https://api.example:6443",
     {"HTTPS_PROXY": "", "https_proxy": CORP}, CORP),
    ("https ignores HTTP_PROXY", "https://api.example:6443", {"HTTP_PROXY": CORP}, None),
    ("http uses HTTP_PROXY", "http://api.example:8080", {"HTTP_PROXY": CORP}, CORP),
    ("urllib: a proxy without a scheme is http", "https://api.example:6443", {"HTTPS_PROXY": "corp:3128"},
     CORP),
    ("urllib: loopback is never proxied", "http://127.0.0.1:8001", {"HTTP_PROXY": CORP}, None),
    ("urllib: nor IPv6 loopback", "https://[::1]:6443", HTTPS, None),
    ("urllib: localhost is never proxied", "https://localhost:6443", HTTPS, None),
    ("urllib: a CIDR entry covers the service IP", API, {**HTTPS, "NO_PROXY": "10.0.0.0/8,.svc"}, None),
    ("a CIDR entry elsewhere does not", API, {**HTTPS, "NO_PROXY": "192.168.0.0/16"}, CORP),
    ("urllib: an IPv6 CIDR", "https://[fd00::1]:6443", {**HTTPS, "no_proxy": "fd00::/8"}, None),
    ("a bare IPv6 address", "https://[fd00::1]:6443", {**HTTPS, "NO_PROXY": "fd00::1"}, None),
    ("an IP", API, {**HTTPS, "NO_PROXY": "10.96.0.1"}, None),
    ("urllib: an IP with its port", API, {**HTTPS, "NO_PROXY": "10.96.0.1:443"}, None),
    ("an IP with another port", API, {**HTTPS, "NO_PROXY": "10.96.0.1:6443"}, CORP),
    ("urllib: a name with its port", "https://api.example:6443", {**HTTPS, "NO_PROXY": "api.example:6443"},
     None),
    ("a name with another port", "https://api.example:6443", {**HTTPS, "NO_PROXY": "api.example:443"}, CORP),
    ("a domain covers itself", "https://example:6443", {**HTTPS, "NO_PROXY": "example"}, None),
    ("and its subdomains", "https://api.example:6443", {**HTTPS, "NO_PROXY": "example"}, None),
    ("but not a longer name", "https://api.notexample:6443", {**HTTPS, "NO_PROXY": "example"}, CORP),
    ("urllib: a leading dot means subdomains only", "https://example:6443", {**HTTPS, "NO_PROXY": ".example"},
     CORP),
    ("urllib: a leading *. likewise", "https://api.example:6443", {**HTTPS, "NO_PROXY": "*.example"}, None),
    ("case and spaces do not matter", "https://API.Example:6443", {**HTTPS, "NO_PROXY": " x , .EXAMPLE "},
     None),
    ("* covers everything", "https://api.example:6443", {**HTTPS, "no_proxy": "*"}, None),
    ("urllib: NO_PROXY upper case first", "https://api.example:6443",
     {**HTTPS, "NO_PROXY": "other", "no_proxy": "example"}, CORP),
    ("junk entries are skipped", API, {**HTTPS, "NO_PROXY": ",:443,10.0.0.0/99,[,10.96.0.1"}, None),
]


@pytest.mark.parametrize(("url", "env", "proxy"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_environment_is_read_like_client_go(url: str, env: dict[str, str], proxy: str | None) -> None:
    assert env_proxy(url, env) == proxy
