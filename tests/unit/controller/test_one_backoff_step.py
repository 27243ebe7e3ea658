"""One backoff step per failure (issue 13 item 9): the echo of the reconciler's own finalizer write ran a
fresh Proxy's reconcile again at once, so its first quota failure counted twice (60 s, then 120 s)."""

from __future__ import annotations

import asyncio

from egress_kvm.controller.queue import Backoff

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, spec_for


async def test_a_first_quota_failure_is_one_backoff_step(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    provider.capacity = 0  # every create: QuotaError
    c = make_controller({"kvm-home": provider}, quota_backoff=Backoff(60.0, 900.0))
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: c.queue.failures(KEY) >= 1, what="the first quota failure")
    await asyncio.sleep(0.3)  # an echo-driven second reconcile would have run by now
    assert c.queue.failures(KEY) == 1
    assert [op for op, _ in provider.calls].count("create") == 1
    assert kube.status(KEY)["message"].startswith("out of capacity")
