"""RBAC evaluation for `kubectl auth can-i` (SelfSubjectAccessReview, SelfSubjectRulesReview).

The emulator authenticates nobody and authorizes every request; only these reviews evaluate the RBAC
objects it holds (Roles, ClusterRoles, RoleBindings, ClusterRoleBindings), so `kubectl auth can-i ...
--as=system:serviceaccount:NS:NAME` answers what a real cluster would for the operator's ServiceAccount.
The requester is the impersonated user (`--as`, `--as-group`), else the kubeconfig's user, an admin in
`system:masters` (as kind's and kubeadm's admin kubeconfig), whom everything is allowed.

The rules are the real authorizer's: a RoleBinding grants its Role or ClusterRole in its namespace only,
a ClusterRoleBinding its ClusterRole everywhere; `*` matches any verb, group, resource; a rule's
`resources` name `resource/subresource` (or `*/subresource`, `resource/*`); `resourceNames` restrict to
those names (a request without a name does not match them); `nonResourceURLs` match exactly or by a
trailing `*`; aggregated ClusterRoles collect the rules of the ClusterRoles their selectors match.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
ADMIN = "kubernetes-admin"
MASTERS = "system:masters"
RBAC = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()

    @classmethod
    def from_request(cls, impersonate_user: str | None, impersonate_groups: Iterable[str]) -> User:
        if not impersonate_user:
            return cls(ADMIN, (MASTERS, "system:authenticated"))
        groups = list(impersonate_groups)
        parts = impersonate_user.split(":")
        if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
            groups += ["system:serviceaccounts", f"system:serviceaccounts:{parts[2]}"]
        if "system:authenticated" not in groups and impersonate_user != "system:anonymous":
            groups.append("system:authenticated")
        return cls(impersonate_user, tuple(groups))


@dataclass(frozen=True)
class Attributes:
    verb: str
    namespace: str = ""
    group: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    path: str = ""  # a non-resource request (`kubectl auth can-i get /healthz`)

    @property
    def is_resource(self) -> bool:
        return not self.path


@dataclass
class Store:
    """The RBAC objects, read through a lister (kind plural -> objects)."""

    list_objects: Callable[[str], list[Obj]]
    _cache: dict[str, list[Obj]] = field(default_factory=dict)

    def objects(self, plural: str) -> list[Obj]:
        if plural not in self._cache:
            self._cache[plural] = self.list_objects(plural)
        return self._cache[plural]


def _subject_matches(subject: Obj, user: User, binding_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user.name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return user.name == f"system:serviceaccount:{ns}:{name}"
    return False


def _cluster_role_rules(store: Store, name: str) -> list[Obj]:
    role = next((r for r in store.objects("clusterroles") if r["metadata"]["name"] == name), None)
    if role is None:
        return []
    rules = list(role.get("rules") or [])
    for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []:
        wanted = selector.get("matchLabels") or {}
        for other in store.objects("clusterroles"):
            labels = other["metadata"].get("labels") or {}
            if other is not role and wanted and all(labels.get(k) == v for k, v in wanted.items()):
                rules += other.get("rules") or []
    return rules


def _role_rules(store: Store, ref: Obj, binding_ns: str) -> list[Obj]:
    if ref.get("kind") == "ClusterRole":
        return _cluster_role_rules(store, ref.get("name", ""))
    role = next((r for r in store.objects("roles")
                 if (r["metadata"]["name"], r["metadata"].get("namespace")) == (ref.get("name"), binding_ns)),
                None)
    return list((role or {}).get("rules") or [])


def _has(values: Iterable[str], wanted: str) -> bool:
    values = list(values or [])
    return "*" in values or wanted in values


def _resource_matches(rule: Obj, attrs: Attributes) -> bool:
    resources = list(rule.get("resources") or [])
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    if "*" in resources or combined in resources:
        return True
    return bool(attrs.subresource) and (f"*/{attrs.subresource}" in resources
                                        or f"{attrs.resource}/*" in resources)


def rule_allows(rule: Obj, attrs: Attributes) -> bool:
    if not _has(rule.get("verbs"), attrs.verb):
        return False
    if not attrs.is_resource:
        return any(u == attrs.path or (u.endswith("*") and attrs.path.startswith(u[:-1]))
                   for u in rule.get("nonResourceURLs") or [])
    if not _has(rule.get("apiGroups"), attrs.group) or not _resource_matches(rule, attrs):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _bindings(store: Store, user: User, namespace: str) -> Iterable[tuple[str, Obj, str]]:
    """(binding kind, binding, namespace its role applies in) for the bindings naming the user."""
    for b in store.objects("clusterrolebindings"):
        if any(_subject_matches(s, user, "") for s in b.get("subjects") or []):
            yield "ClusterRoleBinding", b, ""
    if namespace:
        for b in store.objects("rolebindings"):
            ns = b["metadata"].get("namespace", "")
            if ns == namespace and any(_subject_matches(s, user, ns) for s in b.get("subjects") or []):
                yield "RoleBinding", b, ns


def _subject_text(user: User) -> str:
    parts = user.name.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return f'ServiceAccount "{parts[3]}/{parts[2]}"'
    return f'User "{user.name}"'


def authorize(store: Store, user: User, attrs: Attributes) -> tuple[bool, str]:
    """(allowed, reason) worded as the RBAC authorizer's."""
    if MASTERS in user.groups:
        return True, ""
    for kind, binding, ns in _bindings(store, user, attrs.namespace):
        ref = binding.get("roleRef") or {}
        for rule in _role_rules(store, ref, ns):
            if rule_allows(rule, attrs):
                shown = f"{binding['metadata']['name']}/{ns}" if ns else binding["metadata"]["name"]
                return True, (f'RBAC: allowed by {kind} "{shown}" of {ref.get("kind")} "{ref.get("name")}" '
                              f"to {_subject_text(user)}")
    return False, ""


def rules_for(store: Store, user: User, namespace: str) -> tuple[list[Obj], list[Obj]]:
    """SelfSubjectRulesReview: (resourceRules, nonResourceRules) the user has in `namespace`."""
    if MASTERS in user.groups:
        return ([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                [{"verbs": ["*"], "nonResourceURLs": ["*"]}])
    resource: list[Obj] = []
    non_resource: list[Obj] = []
    for _kind, binding, ns in _bindings(store, user, namespace):
        for rule in _role_rules(store, binding.get("roleRef") or {}, ns):
            if rule.get("nonResourceURLs"):
                non_resource.append({"verbs": rule.get("verbs") or [],
                                     "nonResourceURLs": rule["nonResourceURLs"]})
            else:
                r = {k: rule[k] for k in ("verbs", "apiGroups", "resources", "resourceNames") if rule.get(k)}
                resource.append(r)
    return resource, non_resource
