"""At steady state a settled Proxy costs no status write (issue 8's goal: "no status write unless
something changed"): its resyncs and probes change nothing, and a newer lastProbeTime alone is not a
change unless --probe-time-refresh asks for it (the second case shows the counter does count)."""

from __future__ import annotations

import asyncio
import math

import pytest

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, phase, spec_for


@pytest.mark.parametrize(("probe_refresh", "writes"), [(math.inf, False), (25.0, True)],
                         ids=["default: never alone", "refresh every 0.5 s (scaled)"])
async def test_a_settled_proxy_writes_status_only_when_asked_to_refresh_the_probe_time(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller,
        probe_refresh: float, writes: bool) -> None:
    make_controller({"kvm-home": provider}, resync_period=0.3, probe_refresh=probe_refresh)
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready" and kube.status(KEY).get("healthy") is True,
                     what="Ready and healthy")
    await asyncio.sleep(1.0)  # the last transitions' writes land
    before, probe_time = kube.status_writes, kube.status(KEY)["lastProbeTime"]
    await asyncio.sleep(2.5)  # ~8 resyncs and ~100 probes (20 ms apart), over two clock seconds
    assert phase(kube) == "Ready"
    assert (kube.status_writes > before) is writes, (before, kube.status_writes)
    assert (kube.status(KEY)["lastProbeTime"] != probe_time) is writes
