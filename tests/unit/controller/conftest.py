"""Fixtures for the controller tests: fake Kubernetes, fake provider, a real local proxy and target."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator, Callable

import pytest

from egress_kvm import log as egress_log
from egress_kvm.controller.manager import Controller
from egress_kvm.controller.queue import Backoff
from egress_kvm.controller.reconciler import Timings
from egress_kvm.policy.policies import EgressPolicies
from tests.fakes import LOOPBACK_EGRESS

from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy, TargetServer


async def eventually(predicate: Callable[[], object], *, limit: float = 10.0, what: str = "") -> None:
    """Wait until predicate() is truthy; the timeout is a safety net, not an assertion about speed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.01)


LOOPBACK_POLICIES = EgressPolicies.from_config(LOOPBACK_EGRESS)


@pytest.fixture
def logs() -> io.StringIO:
    """Every controller log line (JSON) at the most verbose level, to check nothing secret is logged."""
    buf = io.StringIO()
    egress_log.configure(egress_log.level_for_v(5), stream=buf)
    yield buf
    root = logging.getLogger("egress")
    for h in list(root.handlers):
        root.removeHandler(h)


@pytest.fixture
async def target() -> AsyncIterator[TargetServer]:
    t = TargetServer()
    await t.start()
    yield t
    await t.stop()


@pytest.fixture
async def proxy_server() -> AsyncIterator[MiniProxy]:
    p = MiniProxy()
    await p.start()
    yield p
    await p.stop()


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


FAST = dict(timings=Timings(poll=0.02, pending_retry=0.05, progress_interval=0.0),
            transient_backoff=Backoff(0.01, 0.05), quota_backoff=Backoff(0.1, 0.2), probe_time_scale=0.02)


@pytest.fixture
async def make_controller(kube: FakeKube) -> AsyncIterator[Callable[..., Controller]]:
    """Build and start Controllers wired like the process does (watch events -> on_event)."""
    started: list[tuple[Controller, asyncio.Task[None]]] = []

    def make(providers: dict, **kw) -> Controller:
        opts = {**FAST, "resync_period": 3600.0, "gc_interval": 3600.0, **kw}
        opts.setdefault("store", kube)  # or a LaggingStore: an informer cache behind the API server
        # External endpoints in these tests listen on loopback: allowed explicitly, as a providers file would.
        opts.setdefault("egress", LOOPBACK_POLICIES)
        c = Controller(kube=kube, providers=providers, **opts)
        kube.watch(c.on_event)
        started.append((c, asyncio.get_running_loop().create_task(c.run())))
        return c

    yield make
    for c, task in started:
        await c.stop(timeout=1.0)
        await asyncio.wait_for(task, 5)
