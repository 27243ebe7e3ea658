"""A restarted operator (or a new leader) takes over Proxies it did not probe itself.

It must not flap them: a Proxy recorded Ready and healthy at an unchanged endpoint stays Ready, with no
Running status and no Unhealthy Event, while the new process's own probes start at once and still
demote it after `failureThreshold` real failures (also when the host cannot be reached, so a stale Ready
never stands without probes behind it).
"""

from __future__ import annotations

import dataclasses

from egress_kvm.metrics import REGISTRY

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, cond, phase, spec_for


def probes(result: str) -> float:
    return REGISTRY.get_sample_value("egress_kvm_health_probes_total", {"result": result}) or 0.0


async def _ready_then_stopped(kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy,
                              make_controller) -> tuple[list[dict], int]:
    first = make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    spec["healthCheck"].update(failureThreshold=2)
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    await first.stop(timeout=1.0)
    seen: list[dict] = []
    kube.watch(lambda kind, obj: seen.append(dict(obj.get("status") or {})))
    return seen, len(kube.reasons("px1"))


async def test_a_restarted_operator_keeps_a_ready_proxy_ready_and_probes_it(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    seen, events_before = await _ready_then_stopped(kube, provider, proxy_server, make_controller)
    ok_before = probes("success")
    second = make_controller({"kvm-home": provider})
    second.enqueue(KEY)  # what the new process's first list does
    await eventually(lambda: probes("success") >= ok_before + 3, what="the new process probing")
    assert phase(kube) == "Ready"
    assert all(s.get("phase") == "Ready" for s in seen), [s.get("phase") for s in seen]
    assert kube.reasons("px1")[events_before:] == []  # no Running, no Unhealthy, no Ready again
    assert kube.status(KEY)["healthy"] is True and cond(kube, "Healthy")["status"] == "True"

    await proxy_server.stop()  # the seeded verdict is only a start: real failures still demote
    await eventually(lambda: phase(kube) == "Running", what="Running after failureThreshold failures")
    assert "Unhealthy" in kube.reasons("px1")[events_before:]


async def test_a_restart_while_the_host_is_unreachable_still_probes(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    seen, _ = await _ready_then_stopped(kube, provider, proxy_server, make_controller)
    provider.unreachable.add("nas1")
    ok_before = probes("success")
    second = make_controller({"kvm-home": provider})
    second.enqueue(KEY)
    await eventually(lambda: cond(kube, "HostReachable").get("status") == "False")
    await eventually(lambda: probes("success") >= ok_before + 3, what="probes despite the host")
    assert phase(kube) == "Ready"
    assert all(s.get("phase") == "Ready" for s in seen), [s.get("phase") for s in seen]
    await proxy_server.stop()
    await eventually(lambda: phase(kube) == "Running", what="Ready demoted by probes, host still away")
    assert provider.names() == {kube.status(KEY)["instance"]["name"]}  # and nothing recreated


async def test_a_restart_does_not_seed_a_different_endpoint(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    await _ready_then_stopped(kube, provider, proxy_server, make_controller)
    provider.ip_for = lambda name: "127.0.0.3"  # the VM came back elsewhere while nobody watched
    for inst in list(provider.vms.values()):
        provider.plant(dataclasses.replace(inst, ip="127.0.0.3"))
    second = make_controller({"kvm-home": provider})
    second.enqueue(KEY)
    await eventually(lambda: kube.status(KEY).get("ip") == "127.0.0.3")
    assert phase(kube) == "Running"  # nothing listens there: no verdict carried over to it
    assert "Healthy" not in {c["type"] for c in kube.status(KEY)["conditions"]}


async def fail_once(kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy,
                    make_controller) -> None:  # type: ignore[no-untyped-def]
    """px1's create fails for good (a bad image) under a first process, which then stops; each create is
    recorded in provider.calls."""
    from egress_kvm.providers.base import PermanentError

    async def bad_image(request, *, progress=None):  # type: ignore[no-untyped-def]
        provider.calls.append(("create", request.name))
        raise PermanentError("image 'debian-13': sha256 mismatch")

    provider.create = bad_image  # type: ignore[method-assign]
    first = make_controller({"kvm-home": provider}, providers_hash="v1")
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Failed")
    await first.stop(timeout=1.0)


async def test_a_restarted_operator_does_not_retry_a_failed_proxy_until_its_inputs_change(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The Failed verdict survives a restart (it is in status): a permanent create failure (a bad image
    is downloaded whole before its checksum fails) is not run again by each new process or leader."""
    await fail_once(kube, provider, proxy_server, make_controller)
    creates = sum(1 for op, _ in provider.calls if op == "create")
    assert creates == 1
    assert "v1" not in kube.status(KEY)["failedProviders"]  # a tag, not the file's digest

    second = make_controller({"kvm-home": provider}, providers_hash="v1")  # same file: no retry
    done: list[object] = []
    real_reconcile = second.reconciler.reconcile

    async def counted(key, **kw):  # type: ignore[no-untyped-def]
        result = await real_reconcile(key, **kw)
        done.append(key)
        return result

    second.reconciler.reconcile = counted  # type: ignore[method-assign]  # before its first reconcile
    await eventually(lambda: KEY in done, what="the new process reconciled px1")
    await second.stop(timeout=1.0)
    assert sum(1 for op, _ in provider.calls if op == "create") == creates
    assert phase(kube) == "Failed"

    make_controller({"kvm-home": provider}, providers_hash="v2")  # the file changed: tried again
    await eventually(lambda: sum(1 for op, _ in provider.calls if op == "create") == creates + 1)


async def test_a_restarted_operator_counts_a_proxy_that_stays_failed(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """A pass that leaves a Failed Proxy alone (its inputs unchanged) still counts it in
    `egress_kvm_proxies`: the new process never writes its status, yet it is a Failed Proxy."""
    await fail_once(kube, provider, proxy_server, make_controller)
    writes = kube.status_writes

    second = make_controller({"kvm-home": provider}, providers_hash="v1")
    await eventually(lambda: second.reconciler.phase_counts() == {"Failed": 1}, what="px1 counted Failed")
    assert REGISTRY.get_sample_value("egress_kvm_proxies", {"phase": "Failed"}) == 1
    assert kube.status_writes == writes and phase(kube) == "Failed"  # counted, not rewritten

    # At steady state a resync's pass over it (from the cache) reads and writes nothing: counting it cost
    # at most the one fresh read of the process's first pass.
    reads: list[object] = []
    real_get = kube.get_proxy

    async def counted_get(namespace: str, name: str):  # type: ignore[no-untyped-def]
        reads.append((namespace, name))
        return await real_get(namespace, name)

    kube.get_proxy = counted_get  # type: ignore[method-assign]
    done = {"controller": "proxy", "result": "success"}
    passes = REGISTRY.get_sample_value("controller_runtime_reconcile_total", done) or 0.0
    for _ in range(3):
        await second._resync()
        await eventually(lambda: len(second.queue) == 0 and not second.queue.processing())
    assert REGISTRY.get_sample_value("controller_runtime_reconcile_total", done) == passes + 3  # 3 passes ran
    assert reads == [] and kube.status_writes == writes
    assert REGISTRY.get_sample_value("egress_kvm_proxies", {"phase": "Failed"}) == 1
