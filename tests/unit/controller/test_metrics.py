"""The operator's /metrics as users of controller-runtime operators expect them: controller-runtime's
reconcile and workqueue names, labels and buckets, the process collector, no `*_created` series, and a
per-Proxy condition gauge that follows status and is removed when the Proxy is deleted."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from egress_kvm import metrics
from egress_kvm.controller.queue import WorkQueue
from egress_kvm.metrics import REGISTRY

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy, TargetServer
from .test_lifecycle import KEY, phase, spec_for


def _families() -> dict[str, object]:
    return {m.name: m for m in REGISTRY.collect()}


def _value(metric: str, /, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(metric, labels)


def test_controller_runtime_names_labels_and_buckets() -> None:
    metrics.init_controller("proxy", workers=3)
    WorkQueue(name="shape")
    text = generate_latest(REGISTRY).decode()
    for series in (
        'controller_runtime_reconcile_total{controller="proxy",result="requeue"} 0.0',
        'controller_runtime_reconcile_errors_total{controller="proxy"}',
        'controller_runtime_terminal_reconcile_errors_total{controller="proxy"}',
        'controller_runtime_reconcile_panics_total{controller="proxy"}',
        'controller_runtime_max_concurrent_reconciles{controller="proxy"} 3.0',
        'controller_runtime_active_workers{controller="proxy"} 0.0',
        'workqueue_depth{controller="shape",name="shape",priority=""} 0.0',
        'workqueue_adds_total{controller="shape",name="shape"}',
        'workqueue_retries_total{controller="shape",name="shape"}',
        'workqueue_unfinished_work_seconds{controller="shape",name="shape"} 0.0',
        'workqueue_longest_running_processor_seconds{controller="shape",name="shape"} 0.0',
        'controller_runtime_reconcile_time_seconds_bucket{controller="proxy",le="0.005"}',
        'controller_runtime_reconcile_time_seconds_bucket{controller="proxy",le="60.0"}',
        'workqueue_queue_duration_seconds_bucket{controller="shape",le="1e-08",name="shape"}',
        'workqueue_work_duration_seconds_bucket{controller="shape",le="1000.0",name="shape"}',
    ):
        assert series in text, series
    buckets = [s.labels["le"] for s in _families()["workqueue_queue_duration_seconds"].samples
               if s.name.endswith("_bucket") and s.labels["name"] == "shape"]
    assert [float(b) for b in buckets[:-1]] == [1e-8 * 10**i for i in range(12)] and buckets[-1] == "+Inf"
    reconcile = [s for s in _families()["controller_runtime_reconcile_time_seconds"].samples
                 if s.name.endswith("_bucket") and s.labels["controller"] == "proxy"]
    assert len(reconcile) == 40 + 1  # controller-runtime's 40 bounds, plus +Inf


def test_process_collector_build_info_and_no_created_series() -> None:
    metrics.PROBES_TOTAL.labels("success").inc()
    text = generate_latest(REGISTRY).decode()
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds",
                 "process_start_time_seconds"):
        assert f"\n{name} " in text, name
    assert "egress_kvm_build_info{python_version=\"" in text and f'version="{metrics.version()}"' in text
    assert "_created" not in text


async def test_workqueue_counts_adds_latency_and_work_as_client_go() -> None:
    q = WorkQueue(name="wq-test")
    before = _value("workqueue_adds_total", name="wq-test", controller="wq-test") or 0.0
    q.add("a")
    q.add("a")  # deduplicated: not an add
    q.add("b")
    assert _value("workqueue_adds_total", name="wq-test", controller="wq-test") == before + 2
    assert _value("workqueue_depth", name="wq-test", controller="wq-test", priority="") == 2
    key = await q.get()
    await asyncio.sleep(0.02)
    longest = _value("workqueue_longest_running_processor_seconds", name="wq-test", controller="wq-test")
    assert longest is not None and longest >= 0.02
    q.done(key)
    assert _value("workqueue_queue_duration_seconds_count", name="wq-test", controller="wq-test") == 1
    assert _value("workqueue_work_duration_seconds_count", name="wq-test", controller="wq-test") == 1
    work = _value("workqueue_work_duration_seconds_sum", name="wq-test", controller="wq-test")
    assert work is not None and work >= 0.02
    assert _value("workqueue_longest_running_processor_seconds", name="wq-test", controller="wq-test") == 0
    q.add_rate_limited("a")
    assert _value("workqueue_retries_total", name="wq-test", controller="wq-test") == 1
    q.shutdown()


async def test_per_proxy_condition_gauge_follows_status_and_goes_with_the_proxy(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, target: TargetServer,
        make_controller) -> None:
    ns, name = KEY
    make_controller({"kvm-home": provider})
    kube.create_proxy(name, spec_for(proxy_server, target))
    await eventually(lambda: phase(kube) == "Ready", what="Ready")
    await eventually(lambda: _value("egress_kvm_proxy_condition", namespace=ns, name=name, type="Ready") == 1,
                     what="the Ready series at 1")
    assert _value("egress_kvm_proxy_condition", namespace=ns, name=name, type="Healthy") == 1
    assert _value("egress_kvm_proxy_condition", namespace=ns, name=name, type="HostReachable") == 1
    assert _value("controller_runtime_active_workers", controller="proxy") is not None
    kube.delete(KEY)
    await eventually(lambda: KEY not in kube.objects, what="the Proxy gone")
    await eventually(lambda: all(
        _value("egress_kvm_proxy_condition", namespace=ns, name=name, type=t) is None
        for t in metrics.PROXY_CONDITION_TYPES), what="its series removed")
    text = generate_latest(REGISTRY).decode()
    assert f'name="{name}",namespace="{ns}"' not in text


def test_condition_gauge_drops_absent_conditions() -> None:
    metrics.set_proxy_conditions("team-a", "p", [{"type": "Ready", "status": "False"},
                                                 {"type": "Healthy", "status": "True"}])
    assert _value("egress_kvm_proxy_condition", namespace="team-a", name="p", type="Ready") == 0
    metrics.set_proxy_conditions("team-a", "p", [{"type": "Ready", "status": "False"}])
    assert _value("egress_kvm_proxy_condition", namespace="team-a", name="p", type="Healthy") is None
    metrics.set_proxy_conditions("team-a", "p", [{"type": "Ready", "status": "True"}])  # one value moves
    assert _value("egress_kvm_proxy_condition", namespace="team-a", name="p", type="Ready") == 1
    metrics.set_proxy_conditions("team-a", "p", [{"type": "Ready", "status": "Unknown"}])
    assert _value("egress_kvm_proxy_condition", namespace="team-a", name="p", type="Ready") is None
    metrics.set_proxy_conditions("team-a", "p", [{"type": "Healthy", "status": "False"}])
    metrics.forget_proxy("team-a", "p")
    assert _value("egress_kvm_proxy_condition", namespace="team-a", name="p", type="Healthy") is None
    metrics.set_proxy_conditions("team-a", "p", [{"type": "Healthy", "status": "False"}])  # recreated
    assert _value("egress_kvm_proxy_condition", namespace="team-a", name="p", type="Healthy") == 0
    metrics.forget_proxy("team-a", "p")


async def test_condition_gauge_follows_the_watch_even_without_a_reconcile(
        kube: FakeKube, provider: FakeProvider, make_controller) -> None:
    """After a restart, a Failed Proxy is not reconciled again, yet it must still count as not Ready: the
    gauge mirrors status as the watch delivers it (the first list's ADDED events)."""
    c = make_controller({"kvm-home": provider})
    failed = {"metadata": {"namespace": "team-b", "name": "old", "uid": "u1", "generation": 1},
              "status": {"phase": "Failed", "conditions": [
                  {"type": "Ready", "status": "False", "reason": "InvalidPlacement"}]}}
    c.on_event("ADDED", failed)
    assert _value("egress_kvm_proxy_condition", namespace="team-b", name="old", type="Ready") == 0
    c.on_event("DELETED", failed)
    assert _value("egress_kvm_proxy_condition", namespace="team-b", name="old", type="Ready") is None
