"""The thin connector: what it hands aiohttp and the probe is only what the policy admitted, so a DNS
answer mixing good and bad addresses (or changing between check and use) cannot reach the bad one."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from egress_kvm.config.models import EgressConfig
from egress_kvm.policy import connect
from egress_kvm.policy.connect import EgressDenied, NameNotResolved, PolicyResolver, resolve_checked
from egress_kvm.policy.egress import Verdict
from egress_kvm.policy.policies import EgressPolicies, url_image_policy

POLICIES = EgressPolicies.from_config()


def _answers(*addresses: str) -> list[dict[str, Any]]:
    return [{"hostname": "h", "host": a, "port": 80, "proto": 0, "flags": 0,
             "family": socket.AF_INET6 if ":" in a else socket.AF_INET} for a in addresses]


async def test_the_resolver_drops_denied_addresses_from_a_mixed_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake(self: Any, host: str, port: int = 0, family: int = 0) -> list[dict[str, Any]]:
        return _answers("169.254.169.254", "203.0.113.7", "10.0.0.1", "::1")

    monkeypatch.setattr(connect.DefaultResolver, "resolve", fake)
    resolver = PolicyResolver(url_image_policy(None, ["cdn.example"]))
    got = await resolver.resolve("cdn.example", 443)
    assert [r["host"] for r in got] == ["203.0.113.7"]
    await resolver.close()


async def test_the_resolver_refuses_when_every_address_is_denied(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake(self: Any, host: str, port: int = 0, family: int = 0) -> list[dict[str, Any]]:
        return _answers("169.254.169.254", "127.0.0.1")

    monkeypatch.setattr(connect.DefaultResolver, "resolve", fake)
    resolver = PolicyResolver(url_image_policy(None, ["cdn.example"]))
    with pytest.raises(EgressDenied) as info:
        await resolver.resolve("cdn.example", 443)
    assert info.value.verdict is Verdict.METADATA and not isinstance(info.value, OSError)
    await resolver.close()


async def test_resolve_checked_returns_the_admitted_address_it_decided_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    async def fake_getaddrinfo(host: str, port: int, **kw: Any) -> list[tuple[Any, ...]]:
        calls.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("198.51.100.9", port))]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fake_getaddrinfo)
    address = await resolve_checked(POLICIES.external_probe, host="proxy.example", port=3128)
    assert str(address) == "198.51.100.9" and calls == ["proxy.example"]  # resolved once, used as is
    allowed = EgressPolicies.from_config(EgressConfig.model_validate({"allowedCIDRs": ["10.1.2.0/24"]}))
    assert str(await resolve_checked(allowed.external_probe, host="proxy.example", port=3128)) == "10.1.2.3"


async def test_a_name_without_addresses_is_a_fixed_phrase(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_getaddrinfo(host: str, port: int, **kw: Any) -> list[tuple[Any, ...]]:
        raise socket.gaierror(-2, "Name or service not known: secret-internal-detail")

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fake_getaddrinfo)
    with pytest.raises(NameNotResolved) as info:
        await resolve_checked(POLICIES.external_probe, host="nowhere.example", port=3128)
    assert "secret-internal-detail" not in str(info.value)
