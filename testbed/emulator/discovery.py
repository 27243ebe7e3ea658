"""What clients read before they touch a resource: /version, legacy discovery and OpenAPI.

kubectl asks for aggregated discovery (`application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`)
first; it falls back to the legacy documents when the answer's Content-Type is plain application/json,
so only the legacy form is served. OpenAPI v3 is served so kubectl can see that every PATCH accepts the
`fieldValidation` parameter: it then skips client-side schema validation and sends
`fieldValidation=Strict`, leaving validation to this server (the CRD schema) as on a real cluster.
OpenAPI v2 is an empty document (kubectl only falls back to it).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from testbed.emulator.resources import VERBS, Registry, ResourceType

SERVER_VERSION = {
    "major": "1",
    "minor": "36",
    "emulationMajor": "1",
    "emulationMinor": "36",
    "gitVersion": "v1.36.0-egress-kvm-emulator",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
# swagger: "2.0" as a protobuf openapi_v2.Document (field 1, string).
OPENAPI_V2_PROTOBUF = b"\x0a\x032.0"
OPENAPI_V2_JSON = {
    "swagger": "2.0",
    "info": {"title": "Kubernetes", "version": SERVER_VERSION["gitVersion"]},
    "paths": {},
    "definitions": {},
}


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _resource_entry(rt: ResourceType) -> list[dict[str, Any]]:
    main: dict[str, Any] = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(VERBS),
        "storageVersionHash": hashlib.sha256(f"{rt.group}/{rt.plural}".encode()).hexdigest()[:12],
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.categories:
        main["categories"] = list(rt.categories)
    out = [main]
    if rt.status_subresource:
        out.append(
            {
                "name": f"{rt.plural}/status",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["get", "patch", "update"],
            }
        )
    return out


def resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = [t for t in registry if t.group == group and t.version == version]
    if not types:
        return None
    resources = [e for t in types for e in _resource_entry(t)]
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": vs, "preferredVersion": vs[0]}


def api_group_list(registry: Registry) -> dict[str, Any]:
    groups = [_group(g, vs) for g, vs in registry.group_versions().items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    versions = registry.group_versions().get(group)
    if not group or not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, versions)}


# --- OpenAPI v3 --------------------------------------------------------------------------------
def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _schema_name(rt: ResourceType) -> str:
    domain = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{domain}.{rt.version}.{rt.kind}"


def openapi_v3_document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = [t for t in registry if t.group == group and t.version == version]
    if not types:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    query = [
        {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        for n in ("dryRun", "fieldManager", "fieldValidation", "pretty")
    ]
    for rt in types:
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        ref = {"$ref": f"#/components/schemas/{_schema_name(rt)}"}
        body = {"content": {"application/json": {"schema": ref}}}
        patch_body = {
            "content": {
                ct: {"schema": {"type": "object"}}
                for ct in (
                    "application/json-patch+json",
                    "application/merge-patch+json",
                    "application/apply-patch+yaml",
                )
            }
        }
        ok = {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}
        base = f"/{_gv_path(rt.group, rt.version)}/" + ("namespaces/{namespace}/" if rt.namespaced else "")
        for suffix in ("", "/status") if rt.status_subresource else ("",):
            item = {
                "get": {
                    "operationId": f"read{rt.kind}{suffix.strip('/').title()}",
                    "responses": ok,
                    "x-kubernetes-action": "get",
                    "x-kubernetes-group-version-kind": gvk,
                },
                "put": {
                    "operationId": f"replace{rt.kind}{suffix.strip('/').title()}",
                    "parameters": query,
                    "requestBody": body,
                    "responses": ok,
                    "x-kubernetes-action": "put",
                    "x-kubernetes-group-version-kind": gvk,
                },
                "patch": {
                    "operationId": f"patch{rt.kind}{suffix.strip('/').title()}",
                    "parameters": query,
                    "requestBody": patch_body,
                    "responses": ok,
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                },
            }
            if not suffix:
                item["delete"] = {
                    "operationId": f"delete{rt.kind}",
                    "responses": ok,
                    "x-kubernetes-action": "delete",
                    "x-kubernetes-group-version-kind": gvk,
                }
            paths[f"{base}{rt.plural}/{{name}}{suffix}"] = item
        paths[f"{base}{rt.plural}"] = {
            "get": {
                "operationId": f"list{rt.kind}",
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "list",
                "x-kubernetes-group-version-kind": gvk,
            },
            "post": {
                "operationId": f"create{rt.kind}",
                "parameters": query,
                "requestBody": body,
                "responses": ok,
                "x-kubernetes-action": "post",
                "x-kubernetes-group-version-kind": gvk,
            },
        }
        s = dict(rt.schema) if rt.schema else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        s["x-kubernetes-group-version-kind"] = [gvk]
        schemas[_schema_name(rt)] = s
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def doc_hash(doc: dict[str, Any]) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest().upper()[:128]


def openapi_v3_root(registry: Registry) -> dict[str, Any]:
    paths = {}
    for group, versions in registry.group_versions().items():
        for version in versions:
            doc = openapi_v3_document(registry, group, version)
            if doc is None:
                continue
            p = _gv_path(group, version)
            paths[p] = {"serverRelativeURL": f"/openapi/v3/{p}?hash={doc_hash(doc)}"}
    return {"paths": paths}
