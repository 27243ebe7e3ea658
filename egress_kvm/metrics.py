"""Prometheus metrics, one registry for the process.

Defined in one place so every layer (controller, provider, rpc observer) records into the same names and
/metrics shows them together. Names follow controller-runtime's where one exists.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile_total", "Reconciliations by result (success, error, requeue_after).",
    ["controller", "result"], registry=REGISTRY)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors_total", "Reconciliations that ended in an error.",
    ["controller"], registry=REGISTRY)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds", "Time per reconciliation.",
    ["controller"], registry=REGISTRY,
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
QUEUE_DEPTH = Gauge("workqueue_depth", "Keys waiting in the reconcile queue.", ["name"], registry=REGISTRY)
QUEUE_RETRIES = Counter(
    "workqueue_retries_total", "Keys re-queued with backoff.", ["name"], registry=REGISTRY)
LIBVIRT_RPC_DURATION = Histogram(
    "egress_kvm_libvirt_rpc_duration_seconds", "libvirt RPC round-trip time per procedure.",
    ["host", "method", "result"], registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30))
IMAGE_BYTES_FETCHED = Counter(
    "egress_kvm_image_bytes_fetched_total", "Base image bytes streamed into host pools.",
    ["host", "image"], registry=REGISTRY)
PROBES_TOTAL = Counter(
    "egress_kvm_health_probes_total", "Health probes by result.", ["result"], registry=REGISTRY)
PROXIES = Gauge("egress_kvm_proxies", "Proxies by phase.", ["phase"], registry=REGISTRY)
