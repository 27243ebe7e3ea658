"""The Controller as the process drives it: stop (SIGTERM) mid-reconcile, health, resync, errors, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from egress_kvm import metrics
from egress_kvm.controller.manager import Controller
from egress_kvm.controller.outcome import Result
from egress_kvm.controller.verdict import Health, ProbeKey
from egress_kvm.providers.base import InstanceChange, InstanceEvent

from .conftest import FAST, LOOPBACK_POLICIES, eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, phase, spec_for


async def test_stop_mid_reconcile_abandons_safely_and_the_next_controller_converges(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy) -> None:
    provider.hold_create = asyncio.Event()
    c = Controller(kube=kube, store=kube, providers={"kvm-home": provider}, egress=LOOPBACK_POLICIES, **FAST)
    kube.watch(c.on_event)
    run = asyncio.create_task(c.run())
    kube.create_proxy("px1", spec_for(proxy_server))
    await provider.create_started.wait()  # a create is in flight, holding a worker
    await c.stop(timeout=0.05)  # SIGTERM; the create does not finish in time
    await asyncio.wait_for(run, 5)
    assert c.queue.processing() == frozenset()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith(("reconcile", "probe"))]
    name = kube.status(KEY)["instance"]["name"]  # recorded before the create began
    assert provider.names() == set()  # the abandoned create never completed

    provider.hold_create = None
    c2 = Controller(kube=kube, store=kube, providers={"kvm-home": provider}, egress=LOOPBACK_POLICIES, **FAST)
    kube.watch(c2.on_event)
    run2 = asyncio.create_task(c2.run())
    try:
        await eventually(lambda: phase(kube) == "Ready")
        assert provider.names() == {name}
    finally:
        await c2.stop(timeout=1)
        await run2


async def test_stop_lets_an_in_flight_reconcile_finish_within_the_timeout(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy) -> None:
    provider.hold_create = asyncio.Event()
    c = Controller(kube=kube, store=kube, providers={"kvm-home": provider}, egress=LOOPBACK_POLICIES, **FAST)
    kube.watch(c.on_event)
    run = asyncio.create_task(c.run())
    kube.create_proxy("px1", spec_for(proxy_server))
    await provider.create_started.wait()
    stopping = asyncio.create_task(c.stop(timeout=10))
    await asyncio.sleep(0.05)
    assert not stopping.done()
    c.enqueue(("default", "other"))  # no new work is taken once stopping
    provider.hold_create.set()
    await asyncio.wait_for(stopping, 5)
    await asyncio.wait_for(run, 5)
    assert len(provider.names()) == 1
    assert kube.status(KEY)["phase"] in ("Running", "Provisioning")  # its last write happened


async def test_a_dead_worker_makes_the_controller_unhealthy(kube: FakeKube, provider: FakeProvider,
                                                           make_controller) -> None:
    c = make_controller({"kvm-home": provider})
    await asyncio.sleep(0)
    assert c.healthy()

    async def broken_get() -> object:
        raise RuntimeError("queue corrupted")

    c.queue.get = broken_get  # type: ignore[method-assign]
    c.enqueue(("default", "x"))  # wake a worker so it calls get again
    await eventually(lambda: not c.healthy())


async def test_reconcile_errors_are_retried_with_backoff_and_counted(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    before = metrics.REGISTRY.get_sample_value("controller_runtime_reconcile_errors_total",
                                               {"controller": "proxy"}) or 0
    real_get = kube.get_proxy
    failures = 3

    async def flaky_get(namespace: str, name: str):  # the API server is having a bad moment
        nonlocal failures
        if failures > 0:
            failures -= 1
            raise ConnectionResetError("API server connection reset")
        return await real_get(namespace, name)

    kube.get_proxy = flaky_get  # type: ignore[method-assign]
    metrics.PROXIES.labels("Ready").set(0)  # process-wide: not what an earlier test left (asserted below)
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    after = metrics.REGISTRY.get_sample_value("controller_runtime_reconcile_errors_total",
                                              {"controller": "proxy"})
    assert after - before >= 3
    assert c.healthy()
    # The phase gauge is refreshed when the pass ends, after the status write the wait above saw (and the
    # Events recorded after it): wait for that pass, not assert at once (it failed whenever the check ran
    # in between and the gauge held 0: fresh, or zeroed by an earlier test's deletion).
    await eventually(lambda: metrics.REGISTRY.get_sample_value("egress_kvm_proxies", {"phase": "Ready"}) == 1,
                     what="the phase gauge counting the Ready Proxy")
    assert metrics.REGISTRY.get_sample_value("controller_runtime_reconcile_time_seconds_count",
                                             {"controller": "proxy"}) > 0


async def test_periodic_resync_reconciles_without_events(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({"kvm-home": provider}, resync_period=0.05)
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    passes: list[bool] = []
    real_reconcile = c.reconciler.reconcile

    async def counted(key, *, routine=False):  # type: ignore[no-untyped-def]
        passes.append(routine)
        return await real_reconcile(key, routine=routine)

    c.reconciler.reconcile = counted  # type: ignore[method-assign]
    await eventually(lambda: passes.count(True) >= 3, what="three resync passes")
    assert c.queue.failures(KEY) == 0


async def test_a_resync_trusts_healthy_probes_and_an_explicit_enqueue_looks(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """A settled Ready Proxy's resync passes (routine: queued by the clock only) do not read the VM
    (planner.vouched): its probes do. Anything that asks (here an enqueue) reads it again."""
    c = make_controller({"kvm-home": provider}, resync_period=0.05)
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready" and kube.status(KEY).get("healthy") is True)
    await asyncio.sleep(0.2)  # a pass or two already vouched for
    reads: list[str] = []
    real_get_proxy = kube.get_proxy

    async def counted(namespace: str, name: str):  # type: ignore[no-untyped-def]
        reads.append(name)
        return await real_get_proxy(namespace, name)

    kube.get_proxy = counted  # type: ignore[method-assign]
    gets = sum(1 for op, _ in provider.calls if op == "get")
    await eventually(lambda: len(reads) >= 3, what="three resync passes")
    assert sum(1 for op, _ in provider.calls if op == "get") == gets
    c.enqueue(KEY)
    await eventually(lambda: sum(1 for op, _ in provider.calls if op == "get") > gets, what="a real look")


async def test_a_requeue_that_comes_due_while_a_routine_pass_waits_makes_that_pass_look(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy) -> None:
    """A resync queues a key (routine: planner.vouched may trust its probes); before a worker takes it, a
    delayed add comes due (an earlier pass's requeue_after, a backoff retry). That add asks for a real
    look, as every add but the clock's does: the queued pass must not stay routine."""
    c, passes, one_pass = routine_recorder(kube, provider, proxy_server)

    await c._resync()
    await one_pass()  # the clock alone: routine
    await c._resync()
    c.queue.add_after(KEY, 0.01)
    await eventually(lambda: not c.queue.pending_delayed(), what="the delayed add fired")
    await one_pass()
    assert passes == [True, False]


async def test_deleted_event_forgets_the_key(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    assert c.prober.keys() == [ProbeKey(KEY)]
    kube.delete(KEY)
    await eventually(lambda: KEY not in kube.objects)
    await eventually(lambda: c.prober.keys() == [] and KEY not in c.reconciler.memory)


async def test_stop_before_run(kube: FakeKube) -> None:
    c = Controller(kube=kube, store=kube, providers={})
    await c.stop(timeout=1)
    await asyncio.wait_for(c.run(), 1)


async def test_a_keyerror_bug_is_retried_not_mistaken_for_a_vanished_proxy(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller, logs) -> None:
    c = make_controller({"kvm-home": provider})
    real = c.reconciler._managed
    calls = 0

    async def buggy(ctx: object, spec: object) -> object:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise KeyError("status")
        return await real(ctx, spec)

    c.reconciler._managed = buggy  # type: ignore[method-assign]
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    assert calls >= 3
    assert '"msg":"reconcile failed"' in logs.getvalue() and "KeyError" in logs.getvalue()


async def test_status_only_changes_do_not_trigger_a_reconcile(kube: FakeKube) -> None:
    c = Controller(kube=kube, store=kube, providers={})
    obj = kube.create_proxy("px1", {"mode": "Managed", "provider": "p"})
    c.on_event("ADDED", obj)
    assert len(c.queue) == 1
    await c.queue.get()
    c.queue.done(KEY)
    c.on_event("MODIFIED", obj | {"status": {"phase": "Running"}})  # our own status write
    assert len(c.queue) == 0
    # Our finalizer appearing is the echo of the reconciler's own first write: no second reconcile
    # (a first failure would otherwise count two backoff steps; see test_one_backoff_step.py).
    obj = {**obj, "metadata": {**obj["metadata"], "finalizers": ["egressproxies.io/finalizer"]}}
    c.on_event("MODIFIED", obj)
    assert len(c.queue) == 0
    for change in ({"generation": 2}, {"deletionTimestamp": "2026-01-01T00:00:00Z"},
                   {"finalizers": ["egressproxies.io/finalizer", "example.com/other"]}, {"finalizers": []}):
        obj = {**obj, "metadata": {**obj["metadata"], **change}}
        c.on_event("MODIFIED", obj)
        assert len(c.queue) == 1, change
        await c.queue.get()
        c.queue.done(KEY)
    c.on_event("DELETED", obj)
    c.on_event("ADDED", obj)  # recreated under the same name: always reconciled
    assert len(c.queue) == 1
    await c.stop(timeout=0)


async def test_an_instance_event_while_a_routine_pass_waits_makes_that_pass_look(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy) -> None:
    """A resync queued the key (routine); then the host reports its VM stopped. The pass must read the VM
    (restart it now), not trust probes that have not failed yet (planner.vouched)."""
    c = Controller(kube=kube, store=kube, providers={"kvm-home": provider}, egress=LOOPBACK_POLICIES, **FAST)
    kube.create_proxy("px1", spec_for(proxy_server))
    kube.objects[KEY]["status"] = {"instance": {"name": "vm1", "zone": "z1", "provider": "kvm-home"}}
    c.on_event("ADDED", kube.objects[KEY])  # as the informer hands it over: the instance is indexed
    assert await asyncio.wait_for(c.queue.get(), 5) == KEY  # ... and its first pass has run
    c.queue.done(KEY)
    passes: list[bool] = []

    async def reconcile(key, *, routine=False):  # type: ignore[no-untyped-def]
        passes.append(routine)
        return Result()

    c.reconciler.reconcile = reconcile  # type: ignore[method-assign]
    await c._resync()
    c._instance_event(InstanceEvent("kvm-home", "z1", "vm1", InstanceChange.STOPPED))
    key = await asyncio.wait_for(c.queue.get(), 5)
    try:
        await c._process(key)
    finally:
        c.queue.done(key)
    assert passes == [False]


async def test_a_verdict_turning_healthy_queues_a_routine_pass_and_any_other_change_a_look(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy) -> None:
    """The pass a verdict change queues: the Proxy's own probes turning healthy vouch for its VM
    (routine: planner.vouched may skip the Get), a verdict turning unhealthy or the replacement's
    verdict asks for a real look, and another add before the pass runs makes it look as well."""
    c, passes, one_pass = routine_recorder(kube, provider, proxy_server)

    own, replacement = ProbeKey(KEY), ProbeKey(KEY, replacement=True)
    c.prober._health[own] = Health(healthy=True, message="ok", successes=1)
    c._enqueue_any(own)
    await one_pass()
    c.prober._health[own] = Health(healthy=False, message="refused", failures=3)
    c._enqueue_any(own)
    await one_pass()
    c.prober._health[replacement] = Health(healthy=True, message="ok", successes=1)
    c._enqueue_any(replacement)
    await one_pass()
    c.prober._health[own] = Health(healthy=True, message="ok", successes=1)
    c._enqueue_any(own)
    c.enqueue(KEY)  # somebody asks before the pass runs
    await one_pass()
    assert passes == [True, False, False, False]
    await c.stop(timeout=0)


def routine_recorder(kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy,
                     ) -> tuple[Controller, list[bool], Callable[[], Awaitable[None]]]:
    """A controller with Proxy px1 whose reconciles only record whether each pass was routine, and
    `one_pass`: what a worker does with the next queued key."""
    c = Controller(kube=kube, store=kube, providers={"kvm-home": provider}, egress=LOOPBACK_POLICIES, **FAST)
    kube.create_proxy("px1", spec_for(proxy_server))
    passes: list[bool] = []

    async def reconcile(key, *, routine=False):  # type: ignore[no-untyped-def]
        passes.append(routine)
        return Result()

    c.reconciler.reconcile = reconcile  # type: ignore[method-assign]

    async def one_pass() -> None:
        key = await asyncio.wait_for(c.queue.get(), 5)
        try:
            await c._process(key)
        finally:
            c.queue.done(key)
    return c, passes, one_pass
