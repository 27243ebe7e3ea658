"""JSONPath for printer columns and the Table a kubectl get receives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from testbed.emulator import Api, jsonpath, tables
from testbed.emulator.api import rfc3339
from testbed.emulator.resources import ResourceType

from .conftest import proxy

DOC = {
    "status": {
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "Healthy", "status": "True"}],
        "ip": "10.0.0.1",
        "n": [1, 2, 3],
    },
    "metadata": {"labels": {"a.b/c": "x"}},
}


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        (".status.ip", ["10.0.0.1"]),
        ('.status.conditions[?(@.type=="Healthy")].status', ["True"]),
        (".status.conditions[?(@.type!='Healthy')].type", ["Ready"]),
        ("{.status.conditions[*].type}", ["Ready", "Healthy"]),
        (".status.n[-1]", [3]),
        (".status.n[?(@ > 1)]", None),
        (".metadata.labels['a.b/c']", ["x"]),
        ("..type", ["Ready", "Healthy"]),
        (".status.missing", []),
    ],
)
def test_jsonpath(expr: str, want: list | None) -> None:
    if want is None:
        with pytest.raises(jsonpath.JsonPathError):
            jsonpath.evaluate(expr, DOC)
    else:
        assert jsonpath.evaluate(expr, DOC) == want


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (3 * 86400, "3d"),
    ],
)
def test_human_duration(seconds: int, text: str) -> None:
    assert tables.human_duration(seconds) == text


def test_proxy_table_uses_printer_columns(api: Api, proxies: ResourceType) -> None:
    created = datetime.now(UTC) - timedelta(minutes=5)
    api._clock = lambda: created  # pin creationTimestamp for the AGE cell
    api.create(proxies, "default", proxy("a"))
    api.patch(
        proxies,
        "default",
        "a",
        "application/merge-patch+json",
        {
            "status": {
                "phase": "Ready",
                "ip": "10.231.0.7",
                "conditions": [{"type": "Healthy", "status": "True", "reason": "ProbeOK"}],
            }
        },
        subresource="status",
    )
    items, rv = api.list(proxies, "default")
    t = tables.table(proxies, items, resource_version=rv)
    assert [c["name"] for c in t["columnDefinitions"]] == [
        "Name",
        "Mode",
        "Provider",
        "Phase",
        "IP",
        "Healthy",
        "Reason",
        "Message",
        "Zone",
        "Instance",
        "Age",
    ]
    # -o wide's columns are priority 1: kubectl shows them only there.
    assert [c["priority"] for c in t["columnDefinitions"]] == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0]
    assert t["rows"][0]["cells"] == ["a", "Managed", "lab", "Ready", "10.231.0.7", "True", None, None, None,
                                     None, "5m"]
    assert t["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert (
        t["kind"] == "Table"
        and t["apiVersion"] == "meta.k8s.io/v1"
        and t["metadata"]["resourceVersion"] == rv
    )


def test_builtin_tables(api: Api) -> None:
    secrets = api.resource("", "v1", "secrets")
    api.create(secrets, "default", {"metadata": {"name": "s"}, "type": "Opaque", "data": {"a": "", "b": ""}})
    t = tables.table(secrets, api.list(secrets, "default")[0], resource_version="1")
    assert [c["name"] for c in t["columnDefinitions"]] == ["Name", "Type", "Data", "Age"]
    assert t["rows"][0]["cells"][:3] == ["s", "Opaque", 2]
    assert rfc3339(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05Z"
