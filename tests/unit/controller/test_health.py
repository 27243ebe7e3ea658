"""Health probes against a real local proxy and target: HTTP through the proxy, auth, TCP, thresholds."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from egress_kvm.controller.health import Health, Prober, ProbeTarget, next_health
from egress_kvm.controller.proxyspec import HealthCheck
from egress_kvm.policy.secrets import USABLE

from .conftest import LOOPBACK_POLICIES, eventually
from .fakekube import FakeKube
from .proxyserver import MiniProxy, TargetServer

NOW = datetime.now(UTC)
CHECK = HealthCheck(success_threshold=2, failure_threshold=3)


def fold(results: list[bool], h: Health | None = None) -> list[bool | None]:
    h = h or Health()
    out = []
    for ok in results:
        h = next_health(h, ok=ok, message="m", at=NOW, check=CHECK)
        out.append(h.healthy)
    return out


def test_thresholds_need_consecutive_results() -> None:
    assert fold([True, True]) == [None, True]
    assert fold([True, False, True, True]) == [None, None, None, True]  # a flap restarts the count
    assert fold([True, True, False, False, True, False]) == [None, True, True, True, True, True]
    assert fold([True, True, False, False, False]) == [None, True, True, True, False]
    assert fold([False, False, False, True, True]) == [None, None, False, False, True]


async def test_http_probe_goes_through_the_proxy(proxy_server: MiniProxy, target: TargetServer) -> None:
    p = Prober(kube=FakeKube(), on_change=lambda k: None, policies=LOOPBACK_POLICIES)
    try:
        ok, msg = await p.probe(ProbeTarget("127.0.0.1", proxy_server.port, HealthCheck(url=target.url)))
        assert ok and "HTTP 200" in msg
        assert proxy_server.requests == 1 and target.hits == 1
        # target down behind a live proxy: the proxy answers 502, the probe fails
        await target.stop()
        ok, msg = await p.probe(ProbeTarget("127.0.0.1", proxy_server.port, HealthCheck(url=target.url)))
        assert not ok and "HTTP 502" in msg
    finally:
        await p.close()


async def test_tcp_probe(proxy_server: MiniProxy) -> None:
    p = Prober(kube=FakeKube(), on_change=lambda k: None, policies=LOOPBACK_POLICIES)
    try:
        assert (await p.probe(ProbeTarget("127.0.0.1", proxy_server.port, HealthCheck())))[0]
        await proxy_server.stop()
        ok, msg = await p.probe(ProbeTarget("127.0.0.1", proxy_server.port, HealthCheck()))
        assert not ok and msg.startswith(f"TCP connect to 127.0.0.1:{proxy_server.port}: ")
    finally:
        await p.close()


async def test_auth_from_the_secret(target: TargetServer) -> None:
    proxy = MiniProxy(username="u", password="pw")
    await proxy.start()
    kube = FakeKube()
    p = Prober(kube=kube, on_change=lambda k: None, time_scale=0.0,  # no auth caching
               policies=LOOPBACK_POLICIES)
    t = ProbeTarget("127.0.0.1", proxy.port, HealthCheck(url=target.url), "default", "auth")
    try:
        ok, msg = await p.probe(t)
        assert not ok and "auth Secret default/auth is missing" in msg and "spec.auth.secretRef" in msg
        kube.put_secret("default", "auth", {"username": b"u", "password": b"bad"}, labels=USABLE)
        ok, msg = await p.probe(t)
        assert not ok and "HTTP 407" in msg
        kube.put_secret("default", "auth", {"username": b"u", "password": b"pw"}, labels=USABLE)
        ok, msg = await p.probe(t)
        assert ok, msg
        assert target.hits == 1
    finally:
        await p.close()
        await proxy.stop()


async def test_prober_notifies_on_verdict_changes_and_stops_cleanly(proxy_server: MiniProxy) -> None:
    changes: list[object] = []
    p = Prober(kube=FakeKube(), on_change=changes.append, time_scale=0.01, refresh=1e9,
               policies=LOOPBACK_POLICIES)
    check = HealthCheck(interval_seconds=1, success_threshold=2, failure_threshold=2)
    p.watch("k", ProbeTarget("127.0.0.1", proxy_server.port, check))
    await eventually(lambda: (p.health("k") or Health()).healthy is True)
    assert changes == ["k"]
    await proxy_server.stop()
    await eventually(lambda: (p.health("k") or Health()).healthy is False)
    assert changes == ["k", "k"]
    # a new target starts over from unknown
    await proxy_server.start()
    p.watch("k", ProbeTarget("127.0.0.1", proxy_server.port, HealthCheck(interval_seconds=2)))
    assert p.health("k") == Health()
    p.unwatch("k")
    assert p.health("k") is None and p.keys() == []
    await p.close()
    assert p.healthy()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("probe ")]


async def test_prober_refreshes_so_last_probe_time_stays_current(proxy_server: MiniProxy) -> None:
    changes: list[object] = []
    p = Prober(kube=FakeKube(), on_change=changes.append, time_scale=0.01, refresh=3,  # 30 ms scaled
               policies=LOOPBACK_POLICIES)
    p.watch("k", ProbeTarget("127.0.0.1", proxy_server.port, HealthCheck(interval_seconds=1)))
    try:
        await eventually(lambda: len(changes) >= 4)  # one verdict change, then refreshes
        assert (p.health("k") or Health()).healthy is True
    finally:
        await p.close()
