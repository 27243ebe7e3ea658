"""Field ownership and server-side apply in the emulator's Api (no HTTP): who owns what after each kind
of write, apply's merge and removal, conflicts worded as the apiserver's, force, and the status
subresource. kubectl's side is in tests/integration/test_kubectl_emulator.py."""

from __future__ import annotations

import pytest

from testbed.emulator import Api
from testbed.emulator.errors import ApiError
from testbed.emulator.fieldmanager import (
    field_set,
    from_fields_v1,
    path_text,
    to_fields_v1,
)
from testbed.emulator.resources import ResourceType

from .conftest import proxy

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


def owners(obj: dict) -> dict[tuple[str, str, str], set]:
    return {(m["manager"], m["operation"], m.get("subresource", "")): from_fields_v1(m["fieldsV1"])
            for m in obj["metadata"].get("managedFields") or []}


def test_conditions_are_keyed_by_type_in_field_sets(proxies: ResourceType) -> None:
    obj = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    paths = field_set(obj, proxies.schema, subresource="status", status_subresource=True)
    ready = ("f:status", "f:conditions", 'k:{"type":"Ready"}')
    assert {ready, (*ready, "f:status"), (*ready, "f:type")} <= paths
    assert path_text((*ready, "f:status")) == '.status.conditions[type="Ready"].status'
    assert from_fields_v1(to_fields_v1(paths)) == paths
    assert to_fields_v1(paths)["f:status"]["f:conditions"]['k:{"type":"Ready"}']["."] == {}


def test_create_and_update_record_the_writer(api: Api, proxies: ResourceType) -> None:
    api.create(proxies, "default", proxy("a", port=3128), manager="kubectl-create")
    obj, _ = api.patch(proxies, "default", "a", MERGE, {"spec": {"port": 8080}}, manager="kubectl-patch")
    got = owners(obj)
    assert ("f:spec", "f:port") in got[("kubectl-patch", "Update", "")]
    assert ("f:spec", "f:port") not in got[("kubectl-create", "Update", "")]  # taken by the patch
    assert ("f:spec", "f:provider") in got[("kubectl-create", "Update", "")]
    entry = next(m for m in obj["metadata"]["managedFields"] if m["manager"] == "kubectl-patch")
    assert entry["apiVersion"] == "egressproxies.io/v1alpha1" and entry["fieldsType"] == "FieldsV1"


def test_a_write_that_changes_nothing_stays_a_no_op(api: Api, proxies: ResourceType) -> None:
    api.create(proxies, "default", proxy("a"), manager="kubectl-create")
    before = api.get(proxies, "default", "a")["metadata"]["resourceVersion"]
    obj, _ = api.patch(proxies, "default", "a", MERGE, {"spec": {"provider": "lab"}}, manager="other")
    assert obj["metadata"]["resourceVersion"] == before and "other" not in str(obj["metadata"])


def test_apply_creates_merges_and_removes_what_it_no_longer_applies(api: Api,
                                                                   proxies: ResourceType) -> None:
    applied = proxy("a", port=8080, healthCheck={"url": "http://example.test/"})
    obj, _ = api.patch(proxies, "default", "a", APPLY, applied, manager="kubectl")
    assert owners(obj)[("kubectl", "Apply", "")] >= {("f:spec", "f:port"),
                                                     ("f:spec", "f:healthCheck", "f:url")}
    # Someone else sets a field kubectl does not apply: apply leaves it alone.
    api.patch(proxies, "default", "a", MERGE, {"spec": {"placement": {"zone": "nas1"}}},
              manager="kubectl-edit")
    again = proxy("a", port=8080)  # healthCheck.url no longer applied
    obj, _ = api.patch(proxies, "default", "a", APPLY, again, manager="kubectl")
    assert "url" not in obj["spec"]["healthCheck"]
    assert obj["spec"]["placement"] == {"zone": "nas1"} and obj["spec"]["port"] == 8080


def test_conflict_names_the_manager_and_field_and_force_takes_it(api: Api, proxies: ResourceType) -> None:
    api.patch(proxies, "default", "a", APPLY, proxy("a", port=8080), manager="kubectl")
    api.patch(proxies, "default", "a", MERGE, {"spec": {"port": 9090, "provider": "other"}},
              manager="kubectl-patch")
    with pytest.raises(ApiError) as exc:
        api.patch(proxies, "default", "a", APPLY, proxy("a", port=8080), manager="kubectl")
    e = exc.value
    assert (e.code, e.reason) == (409, "Conflict")
    assert e.message == ('Apply failed with 2 conflicts: conflicts with "kubectl-patch" using '
                         "egressproxies.io/v1alpha1:\n- .spec.port\n- .spec.provider")
    assert e.details["causes"][0] == {
        "reason": "FieldManagerConflict", "field": ".spec.port",
        "message": 'conflict with "kubectl-patch" using egressproxies.io/v1alpha1'}
    assert api.get(proxies, "default", "a")["spec"]["port"] == 9090  # nothing written
    obj, _ = api.patch(proxies, "default", "a", APPLY, proxy("a", port=8080), manager="kubectl",
                       force=True)
    assert obj["spec"]["port"] == 8080
    assert ("f:spec", "f:port") not in owners(obj).get(("kubectl-patch", "Update", ""), set())


def test_same_value_is_shared_not_a_conflict(api: Api, proxies: ResourceType) -> None:
    api.patch(proxies, "default", "a", APPLY, proxy("a", port=8080), manager="one")
    obj, _ = api.patch(proxies, "default", "a", APPLY, proxy("a", port=8080), manager="two")
    got = owners(obj)
    assert ("f:spec", "f:port") in got[("one", "Apply", "")]
    assert ("f:spec", "f:port") in got[("two", "Apply", "")]


def test_status_writes_are_recorded_with_the_subresource(api: Api, proxies: ResourceType) -> None:
    api.create(proxies, "default", proxy("a"), manager="kubectl-create")
    status = {"status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}
    obj, _ = api.patch(proxies, "default", "a", MERGE, status, subresource="status", manager="egress-kvm")
    mine = owners(obj)[("egress-kvm", "Update", "status")]
    assert ("f:status", "f:conditions", 'k:{"type":"Ready"}', "f:status") in mine
    assert not any(p[0] == "f:spec" for p in mine)
    # Apply to status: conditions merge by type, the other manager's Ready stays.
    applied = {"apiVersion": "egressproxies.io/v1alpha1", "kind": "Proxy", "metadata": {"name": "a"},
               "status": {"conditions": [{"type": "Healthy", "status": "False"}]}}
    obj, _ = api.patch(proxies, "default", "a", APPLY, applied, subresource="status", manager="probe")
    assert [c["type"] for c in obj["status"]["conditions"]] == ["Ready", "Healthy"]


def test_apply_requires_a_field_manager(api: Api, proxies: ResourceType) -> None:
    with pytest.raises(ApiError) as exc:
        api.patch(proxies, "default", "a", APPLY, proxy("a"), manager="")
    assert exc.value.code == 400 and "fieldManager is required" in exc.value.message


def test_a_map_list_refuses_two_items_with_one_key(api: Api, proxies: ResourceType) -> None:
    """x-kubernetes-list-type: map is a contract the real server enforces: one condition per type."""
    api.create(proxies, "default", proxy("a"))
    twice = {"status": {"conditions": [{"type": "Ready", "status": "True"},
                                       {"type": "Ready", "status": "False"}]}}
    with pytest.raises(ApiError) as exc:
        api.patch(proxies, "default", "a", MERGE, twice, subresource="status")
    assert exc.value.code == 422
    assert ('status.conditions[1]: Duplicate value: map[string]interface {}{"type":"Ready"}'
            in exc.value.message)
