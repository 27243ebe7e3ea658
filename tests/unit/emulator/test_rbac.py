"""RBAC evaluation behind `kubectl auth can-i` (rbac.py), as a table over the project's own RBAC
(deploy/rbac) plus a namespaced Role: what the operator's ServiceAccount may and may not do."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.emulator import rbac

ROOT = Path(__file__).resolve().parents[3]
SA = "system:serviceaccount:egress-proxies-operator-system:egress-kvm-controller-manager"
NS = "egress-proxies-operator-system"


def _store() -> rbac.Store:
    objects: dict[str, list[dict]] = {}
    plural = {"Role": "roles", "ClusterRole": "clusterroles", "RoleBinding": "rolebindings",
              "ClusterRoleBinding": "clusterrolebindings"}
    for path in sorted((ROOT / "deploy" / "rbac").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] in plural:
                if doc["kind"] in ("Role", "RoleBinding"):  # kustomize sets it in deploy/
                    doc["metadata"].setdefault("namespace", NS)
                objects.setdefault(plural[doc["kind"]], []).append(doc)
    objects.setdefault("roles", []).append({"metadata": {"name": "reader", "namespace": "team-a"},
                                            "rules": [{"apiGroups": ["*"], "resources": ["*"],
                                                       "verbs": ["get", "list"]}]})
    objects.setdefault("rolebindings", []).append({
        "metadata": {"name": "alice-reads", "namespace": "team-a"},
        "roleRef": {"kind": "Role", "name": "reader"},
        "subjects": [{"kind": "User", "name": "alice"}, {"kind": "Group", "name": "auditors"}]})
    return rbac.Store(lambda p: objects.get(p, []))


def _can(user: rbac.User, verb: str, resource: str = "", *, group: str = "", ns: str = "",
         sub: str = "", name: str = "", path: str = "") -> bool:
    attrs = rbac.Attributes(verb=verb, namespace=ns, group=group, resource=resource, subresource=sub,
                            name=name, path=path)
    return rbac.authorize(_store(), user, attrs)[0]


SA_USER = rbac.User.from_request(SA, [])


@pytest.mark.parametrize("args,kw,allowed", [
    (("list", "proxies"), {"group": "egressproxies.io"}, True),
    (("watch", "proxies"), {"group": "egressproxies.io", "ns": "team-a"}, True),
    (("delete", "proxies"), {"group": "egressproxies.io", "ns": "team-a"}, False),
    (("update", "proxies"), {"group": "egressproxies.io", "ns": "team-a", "sub": "status"}, True),
    (("patch", "proxies"), {"group": "egressproxies.io", "ns": "team-a", "sub": "status"}, False),
    (("get", "secrets"), {"ns": "team-a", "name": "ud"}, True),
    (("list", "secrets"), {"ns": "team-a"}, False),
    (("get", "namespaces"), {"name": "kube-system"}, True),
    (("get", "namespaces"), {"name": "default"}, False),
    (("update", "leases"), {"group": "coordination.k8s.io", "ns": NS,
                            "name": "egress-kvm.egressproxies.io"}, True),
    (("update", "leases"), {"group": "coordination.k8s.io", "ns": NS, "name": "someone-else"}, False),
    (("update", "leases"), {"group": "coordination.k8s.io", "ns": "default",
                            "name": "egress-kvm.egressproxies.io"}, False),  # a Role binds in its namespace
    (("get",), {"path": "/metrics"}, False),
])
def test_the_operators_service_account(args: tuple, kw: dict, allowed: bool) -> None:
    assert _can(SA_USER, *args, **kw) is allowed


def test_users_groups_admin_and_reason() -> None:
    alice = rbac.User.from_request("alice", [])
    assert _can(alice, "get", "pods", ns="team-a") and not _can(alice, "get", "pods", ns="team-b")
    assert not _can(alice, "delete", "pods", ns="team-a")
    assert _can(rbac.User.from_request("bob", ["auditors"]), "list", "secrets", ns="team-a")
    admin = rbac.User.from_request(None, [])
    assert admin.name == rbac.ADMIN and _can(admin, "delete", "anything", ns="x")
    ok, reason = rbac.authorize(_store(), SA_USER, rbac.Attributes(verb="list", group="egressproxies.io",
                                                                    resource="proxies"))
    assert ok and reason == ('RBAC: allowed by ClusterRoleBinding "egress-kvm-manager-rolebinding" of '
                             'ClusterRole "egress-kvm-manager-role" to ServiceAccount '
                             '"egress-kvm-controller-manager/egress-proxies-operator-system"')


def test_aggregated_cluster_roles_collect_matching_rules() -> None:
    objects = {
        "clusterroles": [
            {"metadata": {"name": "agg"}, "aggregationRule": {"clusterRoleSelectors": [
                {"matchLabels": {"rbac.example/aggregate-to-agg": "true"}}]}},
            {"metadata": {"name": "part", "labels": {"rbac.example/aggregate-to-agg": "true"}},
             "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]},
        ],
        "clusterrolebindings": [{"metadata": {"name": "b"}, "roleRef": {"kind": "ClusterRole", "name": "agg"},
                                 "subjects": [{"kind": "User", "name": "carol"}]}],
    }
    store = rbac.Store(lambda p: objects.get(p, []))
    carol = rbac.User.from_request("carol", [])
    assert rbac.authorize(store, carol, rbac.Attributes(verb="get", resource="configmaps"))[0]
    assert not rbac.authorize(store, carol, rbac.Attributes(verb="list", resource="configmaps"))[0]
