"""Prometheus metrics, one registry for the process.

Defined in one place so every layer (controller, queue, provider, rpc observer) records into the same
names and /metrics shows them together. Names, labels and buckets follow controller-runtime's where one
exists (pkg/internal/controller/metrics and pkg/metrics/workqueue.go), so dashboards and alerts written
for kubebuilder operators work unchanged. The process collector adds `process_*` (memory, CPU, fds).
No `*_created` series: they double every counter and histogram for nothing a dashboard uses.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Hashable
from importlib import metadata

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

disable_created_metrics()  # type: ignore[no-untyped-call]  # the library leaves it unannotated

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)


def version() -> str:
    """The installed package's version (what `egress-kvm version` prints)."""
    try:
        return metadata.version("egress-kvm")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0.0.0+unknown"


BUILD_INFO = Gauge("egress_kvm_build_info", "Always 1; the labels say which build is running.",
                   ["version", "python_version"], registry=REGISTRY)
BUILD_INFO.labels(version(), ".".join(map(str, sys.version_info[:3]))).set(1)

# --- controller-runtime's reconcile metrics ----------------------------------------------------------

RECONCILE_RESULTS = ("success", "error", "requeue", "requeue_after")
RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile_total", "Total number of reconciliations per controller",
    ["controller", "result"], registry=REGISTRY)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors_total", "Total number of reconciliation errors per controller",
    ["controller"], registry=REGISTRY)
TERMINAL_RECONCILE_ERRORS = Counter(
    "controller_runtime_terminal_reconcile_errors_total",
    "Total number of terminal reconciliation errors per controller", ["controller"], registry=REGISTRY)
RECONCILE_PANICS = Counter(
    "controller_runtime_reconcile_panics_total", "Total number of reconciliation panics per controller",
    ["controller"], registry=REGISTRY)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds", "Length of time per reconciliation per controller",
    ["controller"], registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
             1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50,
             60))
MAX_CONCURRENT_RECONCILES = Gauge(
    "controller_runtime_max_concurrent_reconciles", "Maximum number of concurrent reconciles per controller",
    ["controller"], registry=REGISTRY)
ACTIVE_WORKERS = Gauge(
    "controller_runtime_active_workers", "Number of currently used workers per controller",
    ["controller"], registry=REGISTRY)


def init_controller(controller: str, *, workers: int) -> None:
    """Every series of a controller exists from its start (at 0), as controller-runtime does, so a
    rate() over a fresh process is 0, not absent."""
    for result in RECONCILE_RESULTS:
        RECONCILE_TOTAL.labels(controller, result)
    for m in (RECONCILE_ERRORS, TERMINAL_RECONCILE_ERRORS, RECONCILE_PANICS):
        m.labels(controller)
    RECONCILE_TIME.labels(controller)
    MAX_CONCURRENT_RECONCILES.labels(controller).set(workers)
    ACTIVE_WORKERS.labels(controller).set(0)


# --- controller-runtime's workqueue metrics (labels name and controller carry the same value) ---------

_QUEUE_BUCKETS = tuple(1e-8 * 10**i for i in range(12))  # ExponentialBuckets(10e-9, 10, 12): 10ns..1000s
QUEUE_DEPTH = Gauge("workqueue_depth", "Current depth of workqueue by workqueue and priority",
                    ["name", "controller", "priority"], registry=REGISTRY)
QUEUE_ADDS = Counter("workqueue_adds_total", "Total number of adds handled by workqueue",
                     ["name", "controller"], registry=REGISTRY)
QUEUE_LATENCY = Histogram(
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested",
    ["name", "controller"], registry=REGISTRY, buckets=_QUEUE_BUCKETS)
QUEUE_WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds", "How long in seconds processing an item from workqueue takes.",
    ["name", "controller"], registry=REGISTRY, buckets=_QUEUE_BUCKETS)
QUEUE_UNFINISHED = Gauge(
    "workqueue_unfinished_work_seconds",
    "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. "
    "Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate "
    "at which this increases.", ["name", "controller"], registry=REGISTRY)
QUEUE_LONGEST = Gauge(
    "workqueue_longest_running_processor_seconds",
    "How many seconds has the longest running processor for workqueue been running.",
    ["name", "controller"], registry=REGISTRY)
QUEUE_RETRIES = Counter("workqueue_retries_total", "Total number of retries handled by workqueue",
                        ["name", "controller"], registry=REGISTRY)


class QueueMetrics:
    """What a WorkQueue reports, as client-go's queue metrics do: adds (not deduplicated ones), the time
    from add to get (queue duration) and from get to done (work duration), retries, depth, and the two
    in-progress gauges, computed at scrape time from the keys being processed."""

    def __init__(self, name: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._added: dict[Hashable, float] = {}
        self._started: dict[Hashable, float] = {}
        self._depth = QUEUE_DEPTH.labels(name, name, "")
        self._adds = QUEUE_ADDS.labels(name, name)
        self._latency = QUEUE_LATENCY.labels(name, name)
        self._work = QUEUE_WORK_DURATION.labels(name, name)
        self._retries = QUEUE_RETRIES.labels(name, name)
        QUEUE_UNFINISHED.labels(name, name).set_function(self._unfinished)
        QUEUE_LONGEST.labels(name, name).set_function(self._longest)

    def added(self, key: Hashable) -> None:
        self._adds.inc()
        self._added.setdefault(key, self._clock())

    def taken(self, key: Hashable) -> None:
        now = self._clock()
        since = self._added.pop(key, None)
        if since is not None:
            self._latency.observe(now - since)
        self._started[key] = now

    def done(self, key: Hashable) -> None:
        since = self._started.pop(key, None)
        if since is not None:
            self._work.observe(self._clock() - since)

    def retried(self) -> None:
        self._retries.inc()

    def depth(self, n: int) -> None:
        self._depth.set(n)

    def _unfinished(self) -> float:
        now = self._clock()
        return sum(now - t for t in self._started.values())

    def _longest(self) -> float:
        now = self._clock()
        return max((now - t for t in self._started.values()), default=0.0)


# --- egress-kvm's own ---------------------------------------------------------------------------------

LIBVIRT_RPC_DURATION = Histogram(
    "egress_kvm_libvirt_rpc_duration_seconds", "libvirt RPC round-trip time per procedure.",
    ["host", "method", "result"], registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30))
LIBVIRT_EVENTS = Counter(
    "egress_kvm_libvirt_events_total",
    "Domain lifecycle and guest agent events received, per host and event kind (malformed, rejected: "
    "dropped).",
    ["host", "event"], registry=REGISTRY)
LIBVIRT_EVENTS_SUBSCRIBED = Gauge(
    "egress_kvm_libvirt_events_subscribed",
    "1 while the host delivers lifecycle events, 0 while drift is found by polling only.",
    ["host"], registry=REGISTRY)
IMAGE_BYTES_FETCHED = Counter(
    "egress_kvm_image_bytes_fetched_total",
    "Base image bytes streamed into host pools, counted as they flow (failed and cancelled imports too).",
    ["host", "image"], registry=REGISTRY)
IMAGE_IMPORTS = Counter(
    "egress_kvm_image_imports_total",
    "Base image downloads into a host pool, by result (success, error, cancelled).",
    ["host", "image", "result"], registry=REGISTRY)
KUBE_EVENTS_DROPPED = Counter(
    "egress_kvm_kube_events_dropped_total",
    "Kubernetes Events not written: queue_full (the sender of the object's shard fell behind) or stopped "
    "(queued or in flight at shutdown).", ["reason"], registry=REGISTRY)
EVENT_DROP_REASONS = ("queue_full", "stopped")
for _why in EVENT_DROP_REASONS:  # at 0 from the start: an alert on rate() sees a series, not an absence
    KUBE_EVENTS_DROPPED.labels(_why)
KUBE_EVENTS_QUEUED = Gauge(
    "egress_kvm_kube_events_queued",
    "Kubernetes Events accepted and not yet written: waiting for their sender or being written.",
    registry=REGISTRY)
PROBES_TOTAL = Counter(
    "egress_kvm_health_probes_total", "Health probes by result.", ["result"], registry=REGISTRY)
PROXIES = Gauge("egress_kvm_proxies", "Proxies by phase.", ["phase"], registry=REGISTRY)

PROXY_CONDITION_TYPES = ("Ready", "Healthy", "HostReachable")
PROXY_CONDITION = Gauge(
    "egress_kvm_proxy_condition",
    "Per Proxy: 1 when the condition is True, 0 when False; no series while the condition is absent.",
    ["namespace", "name", "type"], registry=REGISTRY)


# What PROXY_CONDITION holds per Proxy (only these functions change it): an event whose conditions are
# the ones already mirrored (most of them: the status is written for other fields) costs no gauge call,
# and an absent condition is removed only if it had a series.
_mirrored: dict[tuple[str, str], dict[str, int]] = {}


def set_proxy_conditions(namespace: str, name: str, conditions: object) -> None:
    """Mirror a Proxy's status conditions (as just written) into the per-Proxy gauge. Only the fixed
    condition types become series, so the label set stays bounded by the number of Proxies."""
    values = {c.get("type"): c.get("status") for c in conditions if isinstance(c, dict)} \
        if isinstance(conditions, list) else {}
    want = {t: 1 if values.get(t) == "True" else 0 for t in PROXY_CONDITION_TYPES
            if values.get(t) in ("True", "False")}
    key = (namespace, name)
    have = _mirrored.get(key, {})
    if want == have:
        return
    for type_, value in want.items():
        if have.get(type_) != value:
            PROXY_CONDITION.labels(namespace, name, type_).set(value)
    for type_ in have.keys() - want.keys():
        _remove(namespace, name, type_)
    if want:
        _mirrored[key] = want
    else:
        _mirrored.pop(key, None)


def forget_proxy(namespace: str, name: str) -> None:
    """The Proxy is gone: drop its series (a deleted Proxy must not alert as not Ready forever)."""
    _mirrored.pop((namespace, name), None)
    for type_ in PROXY_CONDITION_TYPES:
        _remove(namespace, name, type_)


def _remove(*labels: str) -> None:
    with contextlib.suppress(KeyError):
        PROXY_CONDITION.remove(*labels)
