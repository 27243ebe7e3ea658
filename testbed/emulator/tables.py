"""Server-side printing: the `meta.k8s.io/v1 Table` that kubectl asks for with
`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`.

Custom resources get Name plus their CRD's additionalPrinterColumns (first JSONPath match per cell,
`date` columns rendered as a human age like the real server's "5m"); without printer columns they get
Name and Age. Built-in kinds get the columns `kubectl get` shows for them on a real cluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from testbed.emulator import jsonpath
from testbed.emulator.resources import ResourceType

Obj = dict[str, Any]
NAME_DESC = (
    "Name must be unique within a namespace. Is required when creating resources, although some "
    "resources may allow a client to request the generation of an appropriate name automatically. "
    "Name is primarily intended for creation idempotence and configuration definition. Cannot be "
    "updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
AGE_DESC = (
    "CreationTimestamp is a timestamp representing the server time when this object was created. "
    "It is not guaranteed to be set in happens-before order across separate operations. Clients "
    "may not set this value. It is represented in RFC3339 form and is in UTC."
)


def parse_time(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration, which kubectl's AGE column shows."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, (hours // 24) % 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{hours // 24 // 365}y"


def age(timestamp: str | None, now: datetime | None = None) -> str:
    t = parse_time(timestamp or "")
    if t is None:
        return "<unknown>"
    return human_duration(((now or datetime.now(UTC)) - t).total_seconds())


Column = tuple[str, str, Callable[[Obj], Any]]  # (name, type, cell)


def _meta(obj: Obj, key: str) -> Any:
    return (obj.get("metadata") or {}).get(key)


def _obj_age(obj: Obj) -> str:
    return age(_meta(obj, "creationTimestamp"))


def _event_object(obj: Obj) -> str:
    ref = obj.get("involvedObject") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def _event_last_seen(obj: Obj) -> str:
    when = (
        obj.get("lastTimestamp")
        or obj.get("eventTime")
        or obj.get("firstTimestamp")
        or _meta(obj, "creationTimestamp")
    )
    return age(when)


def _ports(obj: Obj) -> str:
    ports = (obj.get("spec") or {}).get("ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _ready(obj: Obj) -> str:
    st, spec = obj.get("status") or {}, obj.get("spec") or {}
    return f"{st.get('readyReplicas', 0)}/{spec.get('replicas', 1)}"


AGE: Column = ("Age", "string", _obj_age)
CREATED_AT: Column = ("Created At", "date", lambda o: _meta(o, "creationTimestamp"))

BUILTIN_COLUMNS: dict[str, list[Column]] = {
    "Namespace": [("Status", "string", lambda o: (o.get("status") or {}).get("phase", "Active")), AGE],
    "Secret": [
        ("Type", "string", lambda o: o.get("type", "Opaque")),
        ("Data", "string", lambda o: len(o.get("data") or {})),
        AGE,
    ],
    "ConfigMap": [
        ("Data", "string", lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {})),
        AGE,
    ],
    "ServiceAccount": [("Secrets", "string", lambda o: len(o.get("secrets") or [])), AGE],
    "Event": [
        ("Last Seen", "string", _event_last_seen),
        ("Type", "string", lambda o: o.get("type", "")),
        ("Reason", "string", lambda o: o.get("reason", "")),
        ("Object", "string", _event_object),
        ("Message", "string", lambda o: o.get("message", "")),
    ],
    "Lease": [("Holder", "string", lambda o: (o.get("spec") or {}).get("holderIdentity", "")), AGE],
    "CustomResourceDefinition": [CREATED_AT],
    "Deployment": [
        ("Ready", "string", _ready),
        ("Up-to-date", "string", lambda o: (o.get("status") or {}).get("updatedReplicas", 0)),
        ("Available", "string", lambda o: (o.get("status") or {}).get("availableReplicas", 0)),
        AGE,
    ],
    "Role": [CREATED_AT],
    "ClusterRole": [CREATED_AT],
    "RoleBinding": [
        (
            "Role",
            "string",
            lambda o: f"{(o.get('roleRef') or {}).get('kind')}/{(o.get('roleRef') or {}).get('name')}",
        ),
        AGE,
    ],
    "ClusterRoleBinding": [
        (
            "Role",
            "string",
            lambda o: f"{(o.get('roleRef') or {}).get('kind')}/{(o.get('roleRef') or {}).get('name')}",
        ),
        AGE,
    ],
    "Service": [
        ("Type", "string", lambda o: (o.get("spec") or {}).get("type", "ClusterIP")),
        ("Cluster-IP", "string", lambda o: (o.get("spec") or {}).get("clusterIP", "<none>")),
        ("External-IP", "string", lambda o: "<none>"),
        ("Port(s)", "string", _ports),
        AGE,
    ],
}


def _crd_cell(col: dict[str, Any], obj: Obj) -> Any:
    try:
        found = jsonpath.evaluate(col.get("jsonPath", ""), obj)
    except jsonpath.JsonPathError:
        return None
    if not found or found[0] is None:
        return None
    value, typ = found[0], col.get("type", "string")
    if typ == "string":
        return (
            value
            if isinstance(value, str)
            else json.dumps(value)
            if isinstance(value, dict | list)
            else str(value).lower()
            if isinstance(value, bool)
            else str(value)
        )
    if typ == "integer":
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if typ == "number":
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if typ == "boolean":
        return value if isinstance(value, bool) else None
    if typ == "date":
        return age(value) if isinstance(value, str) and parse_time(value) else "<invalid>"
    return None


def _name_last(rt: ResourceType) -> bool:
    """Events list Name last and only with -o wide, as `kubectl get events` shows them."""
    return rt.kind == "Event" and not rt.custom


def column_definitions(rt: ResourceType) -> list[dict[str, Any]]:
    name = {"name": "Name", "type": "string", "format": "name", "description": NAME_DESC, "priority": 0}
    defs = [] if _name_last(rt) else [name]
    if rt.custom:
        cols = rt.printer_columns or (
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        )
        for c in cols:
            defs.append(
                {
                    "name": c["name"],
                    "type": c.get("type", "string"),
                    "format": c.get("format", ""),
                    "description": c.get("description") or (AGE_DESC if c["name"] == "Age" else ""),
                    "priority": c.get("priority", 0),
                }
            )
    else:
        for col, typ, _ in BUILTIN_COLUMNS.get(rt.kind, [AGE]):
            defs.append({"name": col, "type": typ, "format": "", "description": "", "priority": 0})
    if _name_last(rt):
        defs.append({**name, "priority": 1})
    return defs


def cells(rt: ResourceType, obj: Obj) -> list[Any]:
    out: list[Any] = [] if _name_last(rt) else [_meta(obj, "name")]
    if rt.custom:
        cols = rt.printer_columns or (
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        )
        out += [_crd_cell(c, obj) for c in cols]
    else:
        out += [fn(obj) for _, _, fn in BUILTIN_COLUMNS.get(rt.kind, [AGE])]
    if _name_last(rt):
        out.append(_meta(obj, "name"))
    return out


def row_object(obj: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def table(
    rt: ResourceType,
    objs: list[Obj],
    *,
    resource_version: str,
    include: str = "Metadata",
    with_columns: bool = True,
) -> Obj:
    rows = []
    for o in objs:
        row: Obj = {"cells": cells(rt, o)}
        ro = row_object(o, include)
        if ro is not None:
            row["object"] = ro
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": column_definitions(rt) if with_columns else None,
        "rows": rows,
    }
