"""One backoff step per failure (issue 13 item 9): the echo of the reconciler's own finalizer write ran a
fresh Proxy's reconcile again at once, so its first quota failure counted twice (60 s, then 120 s); and
the fault campaign found the same count from a background import's progress poll outliving the failure."""

from __future__ import annotations

import asyncio

from egress_kvm.controller.queue import Backoff, WorkQueue

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


async def test_a_poll_scheduled_before_a_failure_does_not_fire_inside_its_backoff() -> None:
    """A reconcile returned "poll again in 10 s" (an image import running); the import ended, the next
    reconcile hit QuotaError: its retry waits the quota backoff, the stale poll no longer counts."""
    q = WorkQueue(quota=Backoff(0.6, 10.0))
    q.add_after("k", 0.05)  # the import's progress poll
    assert q.add_rate_limited("k", quota=True) == 0.6
    await asyncio.sleep(0.3)
    assert len(q) == 0  # the poll would have queued it by now
    await eventually(lambda: len(q) == 1, what="the retry after its backoff")
    assert q.failures("k") == 1
