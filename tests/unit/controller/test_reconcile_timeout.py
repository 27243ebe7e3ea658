"""No reconcile can hold a worker forever, and wedged workers turn /healthz red (issue 13 item 3)."""

from __future__ import annotations

import asyncio

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import phase, spec_for


async def test_a_hung_create_is_cut_off_and_the_other_proxies_go_on(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    provider.hold_create = asyncio.Event()  # never set: every create hangs
    c = make_controller({"kvm-home": provider}, workers=1, reconcile_timeout=0.3, wedge_grace=60.0)
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(provider.create_started.is_set, what="create started")
    await eventually(lambda: c.queue.failures(("default", "px1")) >= 1, what="the hung create cut off")
    assert c.healthy()  # cut off in time: nothing is wedged
    # The only worker is free again between the retries: an External Proxy still gets its status.
    kube.create_proxy("ext", {"mode": "External", "external": {"address": f"127.0.0.1:{proxy_server.port}"},
                              "healthCheck": {"intervalSeconds": 1}})
    await eventually(lambda: phase(kube, ("default", "ext")) in ("Running", "Ready"), what="ext reconciled")
    provider.hold_create.set()
    await eventually(lambda: phase(kube) in ("Running", "Ready"), what="px1 created once the host answers")


async def test_a_reconcile_that_ignores_its_cancellation_turns_health_red(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    release = asyncio.Event()
    real_create = provider.create

    async def stubborn(request, *, progress=None):  # type: ignore[no-untyped-def]
        provider.create_started.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # a call that swallows its cancellation: the worker is lost
        return await real_create(request, progress=progress)

    provider.create = stubborn  # type: ignore[method-assign]
    c = make_controller({"kvm-home": provider}, workers=1, reconcile_timeout=0.1, wedge_grace=0.2)
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(provider.create_started.is_set, what="create started")
    assert c.healthy()
    await eventually(lambda: not c.healthy(), what="health red once the worker is wedged")
    assert c.wedged() == [("default", "px1")]
    release.set()
    await eventually(c.healthy, what="healthy again once the reconcile returns")
