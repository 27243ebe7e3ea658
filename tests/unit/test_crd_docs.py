"""The Proxy CRD reads as documentation (`kubectl explain`) and follows the API conventions kubectl and
server-side apply rely on. Checked on the file itself; the kubectl tests check what kubectl shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "deploy/crd/egressproxies.io_proxies.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]


def _properties(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name, sub in (node.get("properties") or {}).items():
        out.append((f"{path}.{name}".lstrip("."), sub))
        out += _properties(sub, f"{path}.{name}")
    if "items" in node:
        out += _properties(node["items"], f"{path}[]")
    return out


def test_every_property_has_a_description() -> None:
    props = _properties(SCHEMA)
    assert len(props) >= 52  # the count: none may say <no description>
    # metadata is the exception the API server imposes (ObjectMeta documents itself in kubectl explain).
    assert [p for p, node in props if not str(node.get("description") or "").strip()] == ["metadata"]
    assert set(SCHEMA["properties"]["metadata"]) == {"type"}


def test_conditions_are_a_map_list_keyed_by_type() -> None:
    conditions = SCHEMA["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]  # a map key must be required


def test_wide_columns_have_priority_one_and_reason_is_in_plain_get() -> None:
    cols = {c["name"]: c for c in VERSION["additionalPrinterColumns"]}
    assert {n for n, c in cols.items() if c.get("priority", 0) == 1} == {"Message", "Zone", "Instance"}
    assert cols["Reason"].get("priority", 0) == 0
    assert cols["Reason"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].reason'
    assert cols["Zone"]["jsonPath"] == ".status.instance.zone"
    assert cols["Instance"]["jsonPath"] == ".status.instance.name"
