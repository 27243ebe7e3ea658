"""Which resources the emulator serves: built-in kinds plus whatever the stored CRDs declare.

A `ResourceType` carries everything a handler, discovery and the Table printer need about one
group/version/plural. The `Registry` is rebuilt from CRDs on every CRD write, so a CRD applied with
kubectl is served (and listed in discovery with its short names) by the next request.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    # How metadata.generation moves: "none" (kind has no generation), "spec" (changes outside
    # metadata and status), "all" (changes outside metadata).
    generation: str = "none"
    schema: dict[str, Any] | None = None  # openAPIV3Schema of a custom resource
    printer_columns: tuple[dict[str, Any], ...] = ()
    custom: bool = False
    # Kinds whose PUT may omit metadata.resourceVersion (AllowUnconditionalUpdate); CRs may not.
    unconditional_update: bool = True
    preserve_unknown: bool = True  # built-ins: no schema here, so nothing is pruned

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def group_kind(self) -> tuple[str, str]:
        return (self.group, self.kind)

    @property
    def key(self) -> tuple[str, str]:
        """Storage identity: one bucket per group+plural whatever the version."""
        return (self.group, self.plural)

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


def _core(plural: str, kind: str, namespaced: bool = True, **kw: Any) -> ResourceType:
    return ResourceType("", "v1", plural, kind, namespaced, singular=kind.lower(), **kw)


BUILTINS: tuple[ResourceType, ...] = (
    _core("namespaces", "Namespace", namespaced=False, short_names=("ns",), status_subresource=True),
    _core("secrets", "Secret"),
    _core("configmaps", "ConfigMap", short_names=("cm",)),
    _core("serviceaccounts", "ServiceAccount", short_names=("sa",)),
    _core("events", "Event", short_names=("ev",)),
    _core("services", "Service", short_names=("svc",), status_subresource=True, categories=("all",)),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, singular="lease"),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        singular="customresourcedefinition",
        short_names=("crd", "crds"),
        status_subresource=True,
        generation="spec",
    ),
    ResourceType(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        True,
        singular="deployment",
        short_names=("deploy",),
        status_subresource=True,
        generation="spec",
        categories=("all",),
    ),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True, singular="role"),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, singular="rolebinding"
    ),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, singular="clusterrole"
    ),
    ResourceType(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        False,
        singular="clusterrolebinding",
    ),
)

CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACE_KEY = ("", "namespaces")
SECRET_KEY = ("", "secrets")


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The served versions of one CRD as resource types (names from spec, as the real server
    accepts them once NamesAccepted)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for v in spec.get("versions") or []:
        if not v.get("served", True):
            continue
        status = "status" in (v.get("subresources") or {})
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        out.append(
            ResourceType(
                group=spec.get("group", ""),
                version=v["name"],
                plural=names.get("plural", ""),
                kind=names.get("kind", ""),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular") or names.get("kind", "").lower(),
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                status_subresource=status,
                generation="spec" if status else "all",
                schema=schema,
                printer_columns=tuple(v.get("additionalPrinterColumns") or ()),
                custom=True,
                unconditional_update=False,
                preserve_unknown=bool(spec.get("preserveUnknownFields")),
            )
        )
    return out


@dataclass
class Registry:
    """Lookup of served resource types by (group, version, plural)."""

    _types: dict[tuple[str, str, str], ResourceType] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rebuild([])

    def rebuild(self, crds: list[dict[str, Any]]) -> None:
        types = {(t.group, t.version, t.plural): t for t in BUILTINS}
        for crd in crds:
            for t in types_from_crd(crd):
                types.setdefault((t.group, t.version, t.plural), t)
        self._types = types

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def by_key(self, key: tuple[str, str]) -> ResourceType | None:
        return next((t for t in self._types.values() if t.key == key), None)

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(sorted(self._types.values(), key=lambda t: (t.group, t.version, t.plural)))

    def group_versions(self) -> dict[str, list[str]]:
        """group -> served versions (core group "" included)."""
        out: dict[str, list[str]] = {}
        for t in self:
            versions = out.setdefault(t.group, [])
            if t.version not in versions:
                versions.append(t.version)
        return out
