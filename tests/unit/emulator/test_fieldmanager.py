"""Field ownership and server-side apply in the emulator's Api (no HTTP): who owns what after each kind
of write, apply's merge and removal, conflicts worded as the apiserver's, force, and the status
subresource. kubectl's side is in tests/integration/test_kubectl_emulator.py."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest

from testbed.emulator import Api
from testbed.emulator.errors import ApiError
from testbed.emulator.fieldmanager import (
    field_set,
    from_fields_v1,
    path_text,
    sent_ownership,
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


# --- managedFields a write sets itself ---------------------------------------------------------------
# The apiserver's field manager (k8s.io/apimachinery/pkg/util/managedfields/internal/fieldmanager.go,
# decodeLiveOrNew and isResetManagedFields, with its TestResetManagedFieldsEmptyList): a non-apply write
# whose object carries a managedFields list that decodes is recorded on top of that list instead of the
# stored one; a non-nil empty list or a list of one empty entry resets it; absent, null, a list that does
# not decode, or any list on a subresource write leaves the stored one. An apply may not carry it.

HAND = {"manager": "by-hand", "operation": "Update", "apiVersion": "egressproxies.io/v1alpha1",
        "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {".": {}, "f:provider": {}}}}
BOGUS = {**HAND, "operation": "Replace"}  # not Apply or Update: the list does not decode


@pytest.mark.parametrize(("sent", "subresource", "base"), [
    (None, "", None),  # absent or null: the stored list
    ([], "", []),  # a non-nil empty list: reset
    ([{}], "", []),  # one empty entry: reset (the documented way)
    ([{"manager": "", "time": None}], "", []),  # an entry of zero values is an empty entry
    ([HAND], "", [HAND]),  # a list that decodes: taken as sent
    ([HAND, BOGUS], "", None),  # one entry that does not decode: the stored list
    ([{**HAND, "fieldsType": ""}], "", None),
    ([{**HAND, "apiVersion": ""}], "", None),
    ([{**HAND, "fieldsV1": "f:spec"}], "", None),
    # a fieldsV1 that is no field set, a time metav1.Time cannot read: the entry does not decode
    ([{**HAND, "fieldsV1": {"f:spec": "x"}}], "", None),
    ([{**HAND, "fieldsV1": {"f:spec": {"f:port": 3}}}], "", None),
    ([{**HAND, "fieldsV1": {"f:spec": ["f:port"]}}], "", None),
    ([{**HAND, "fieldsV1": {"f:spec": {"k:{not json": {}}}}], "", None),
    ([{**HAND, "fieldsV1": {"f:spec": {"k:[1]": {}}}}], "", None),  # a key is a JSON object
    ([{**HAND, "fieldsV1": {"f:spec": {"v:nope": {}}}}], "", None),
    ([{**HAND, "fieldsV1": {"f:spec": {"i:x": {}}}}], "", None),
    ([{**HAND, "time": "yesterday"}], "", None),
    ([{**HAND, "time": "2026-01-01"}], "", None),
    ([{"time": ""}], "", None),  # no zero time: unreadable, not an empty entry
    ([{"fieldsV1": ""}], "", None),
    # well-formed: null leaves, keys of every type, a key of no known type (skipped, value unread)
    ([{**HAND, "fieldsV1": {"f:spec": {"f:port": None, "x-future": 7, ".": "any",
                                       "f:list": {"k:{\"name\":\"a\"}": {}, "v:\"b\"": {}, "i:0": {}}}},
       "time": "2026-01-01T01:00:00.5+02:00"}], "", "as sent"),
    ("not a list", "", None),
    ([], "status", None),  # a subresource write never sets ownership
    ([HAND], "status", None),
])
def test_what_a_write_sends_in_managed_fields(sent, subresource, base) -> None:
    assert sent_ownership(sent, subresource=subresource) == (sent if base == "as sent" else base)


def stored(api: Api, proxies: ResourceType) -> dict:
    """Proxy `a` written by two managers: kubectl-create made it, kubectl-patch changed its port."""
    api.create(proxies, "default", proxy("a", port=3128), manager="kubectl-create")
    obj, _ = api.patch(proxies, "default", "a", MERGE, {"spec": {"port": 8080}}, manager="kubectl-patch")
    assert set(owners(obj)) == {("kubectl-create", "Update", ""), ("kubectl-patch", "Update", "")}
    return obj


ABSENT = object()


@pytest.mark.parametrize(("sent", "managers"), [
    (ABSENT, {("kubectl-create", "Update", ""), ("kubectl-patch", "Update", "")}),  # kept
    (None, {("kubectl-create", "Update", ""), ("kubectl-patch", "Update", "")}),  # null: kept
    ([], set()),  # cleared
    ([{}], set()),  # cleared
    ([HAND], {("by-hand", "Update", "")}),  # replaced
    ([BOGUS], {("kubectl-create", "Update", ""), ("kubectl-patch", "Update", "")}),  # ignored: kept
])
def test_an_update_sets_managed_fields_as_sent(api: Api, proxies: ResourceType, sent, managers) -> None:
    body = copy.deepcopy(stored(api, proxies))
    if sent is ABSENT:
        del body["metadata"]["managedFields"]
    else:
        body["metadata"]["managedFields"] = sent
    obj, _ = api.update(proxies, "default", "a", body, manager="writer")
    assert set(owners(obj)) == managers
    assert api.get(proxies, "default", "a")["metadata"].get("managedFields") == \
        obj["metadata"].get("managedFields")
    if sent == [HAND]:
        assert obj["metadata"]["managedFields"] == [HAND]  # as sent, time included
    if not managers:
        assert "managedFields" not in obj["metadata"]


@pytest.mark.parametrize("fields_v1", [{"f:spec": "x"}, {"f:spec": {"f:port": 3}}, {"f:spec": ["a"]},
                                       {"f:spec": {"k:{": {}}}])
def test_an_update_sending_fields_v1_that_is_no_field_set_keeps_the_stored_list(
        api: Api, proxies: ResourceType, fields_v1) -> None:
    """The apiserver cannot decode such a list and keeps the stored one (the emulator used to fail with
    a 500 reading it)."""
    body = copy.deepcopy(stored(api, proxies))
    body["metadata"]["managedFields"] = [{**HAND, "fieldsV1": fields_v1}]
    body["metadata"]["labels"] = {"x": "y"}
    obj, _ = api.update(proxies, "default", "a", body, manager="writer")
    assert set(owners(obj)) == {("kubectl-create", "Update", ""), ("kubectl-patch", "Update", ""),
                                ("writer", "Update", "")}


def test_a_key_of_no_known_type_in_sent_fields_v1_is_dropped(api: Api, proxies: ResourceType) -> None:
    """structured-merge-diff skips a fieldsV1 key whose type it does not know (a future one)."""
    body = copy.deepcopy(stored(api, proxies))
    body["metadata"]["managedFields"] = [{**HAND, "fieldsV1": {"f:spec": {"f:provider": {}, "x:new": 7}}}]
    obj, _ = api.update(proxies, "default", "a", body, manager="writer")
    assert owners(obj) == {("by-hand", "Update", ""): {("f:spec", "f:provider")}}


def test_an_update_sending_back_what_it_read_changes_nothing(api: Api, proxies: ResourceType) -> None:
    before = stored(api, proxies)
    obj, _ = api.update(proxies, "default", "a", copy.deepcopy(before), manager="writer")
    assert obj["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert obj["metadata"]["managedFields"] == before["metadata"]["managedFields"]


def test_a_reset_with_other_changes_gives_the_writer_what_it_changed(api: Api, proxies: ResourceType) -> None:
    """The docs: "the managedFields being reset first and the other changes being processed afterwards. As
    a result the applier takes ownership of any fields updated in the same request"."""
    body = copy.deepcopy(stored(api, proxies))
    body["metadata"]["managedFields"] = [{}]
    body["spec"]["port"] = 9090
    obj, _ = api.update(proxies, "default", "a", body, manager="writer")
    assert owners(obj) == {("writer", "Update", ""): {("f:spec", "f:port")}}


def test_a_status_update_never_sets_managed_fields(api: Api, proxies: ResourceType) -> None:
    before = stored(api, proxies)
    body = {**copy.deepcopy(before), "status": {"phase": "Ready"}}
    body["metadata"]["managedFields"] = []
    obj, _ = api.update(proxies, "default", "a", body, subresource="status", manager="egress-kvm")
    assert set(owners(obj)) == {("kubectl-create", "Update", ""), ("kubectl-patch", "Update", ""),
                                ("egress-kvm", "Update", "status")}


JSON_PATCH = "application/json-patch+json"


@pytest.mark.parametrize(("content_type", "patch", "managers"), [
    (MERGE, {"metadata": {"managedFields": [{}]}}, set()),  # the docs' example
    (MERGE, {"metadata": {"managedFields": []}}, set()),
    (MERGE, {"metadata": {"managedFields": [None]}}, set()),  # a null entry decodes as an empty one
    (JSON_PATCH, [{"op": "replace", "path": "/metadata/managedFields", "value": [{}]}], set()),
    (JSON_PATCH, [{"op": "replace", "path": "/metadata/managedFields", "value": [HAND]}],
     {("by-hand", "Update", "")}),
    (MERGE, {"metadata": {"managedFields": None}}, {("kubectl-create", "Update", ""),  # removed from the
                                                    ("kubectl-patch", "Update", "")}),  # body: kept
    (JSON_PATCH, [{"op": "replace", "path": "/metadata/managedFields", "value": [BOGUS]}],
     {("kubectl-create", "Update", ""), ("kubectl-patch", "Update", "")}),  # does not decode: kept
    (MERGE, {"metadata": {"labels": {"x": "y"}}},
     {("kubectl-create", "Update", ""), ("kubectl-patch", "Update", ""), ("writer", "Update", "")}),
])
def test_a_patch_sets_managed_fields_as_the_patched_object_has_them(
        api: Api, proxies: ResourceType, content_type, patch, managers) -> None:
    stored(api, proxies)
    obj, _ = api.patch(proxies, "default", "a", content_type, patch, manager="writer")
    assert set(owners(obj)) == managers


def test_a_status_patch_never_sets_managed_fields(api: Api, proxies: ResourceType) -> None:
    stored(api, proxies)
    patch = {"metadata": {"managedFields": []}, "status": {"phase": "Ready"}}
    obj, _ = api.patch(proxies, "default", "a", MERGE, patch, subresource="status", manager="egress-kvm")
    assert set(owners(obj)) == {("kubectl-create", "Update", ""), ("kubectl-patch", "Update", ""),
                                ("egress-kvm", "Update", "status")}


def test_a_create_with_managed_fields_gives_the_creator_what_it_sets(api: Api, proxies: ResourceType) -> None:
    """A create is recorded on top of the list it sends, against an empty object: the creator takes
    every field it sets, so an entry sent for those fields is left with nothing and goes."""
    body = {**proxy("a"), "metadata": {"name": "a", "managedFields": [HAND]}}
    obj, _ = api.create(proxies, "default", body, manager="creator")
    assert set(owners(obj)) == {("creator", "Update", "")}
    assert ("f:spec", "f:provider") in owners(obj)[("creator", "Update", "")]


@pytest.mark.parametrize("sent", [[], [HAND]])
def test_an_apply_carrying_managed_fields_is_refused(api: Api, proxies: ResourceType, sent) -> None:
    body = {**proxy("a"), "metadata": {"name": "a", "managedFields": sent}}
    with pytest.raises(ApiError) as exc:
        api.patch(proxies, "default", "a", APPLY, body, manager="applier")
    assert (exc.value.code, exc.value.message) == (400, "metadata.managedFields must be nil")



# What ObjectMeta cannot hold at all: the real server refuses the body before any field manager sees it.
SHAPES = [[1], ["x"], [[]], {"a": 1}, "x", 7, [{**HAND, "manager": 5}], [{**HAND, "operation": True}],
          [{**HAND, "time": "yesterday"}], [{**HAND, "time": ""}], [{**HAND, "time": 5}]]
SHAPE_IDS = ["number", "string", "array", "object", "string-list", "int", "manager", "operation", "time",
             "empty-time", "number-time"]


@pytest.mark.parametrize("sent", SHAPES, ids=SHAPE_IDS)
def test_a_patch_writing_managed_fields_of_another_shape_is_invalid(
        api: Api, proxies: ResourceType, sent) -> None:
    """422 on the field `patch` (the apiserver's answer when the patched object does not decode), naming
    the offending field; the emulator used to take such a list as one that does not decode (kept the
    stored list, 200). The stored object is left as it was."""
    before = stored(api, proxies)
    with pytest.raises(ApiError) as exc:
        api.patch(proxies, "default", "a", MERGE, {"metadata": {"managedFields": sent}}, manager="writer")
    assert (exc.value.code, exc.value.reason) == (422, "Invalid")
    assert exc.value.message.startswith(' "" is invalid: patch: Invalid value: ')
    assert "metadata.managedFields" in exc.value.message
    assert [c["field"] for c in exc.value.details["causes"]] == ["patch"]
    assert api.get(proxies, "default", "a") == before


@pytest.mark.parametrize("how", ["create", "update", "status-update"])
@pytest.mark.parametrize("sent", SHAPES, ids=SHAPE_IDS)
def test_a_body_carrying_managed_fields_of_another_shape_is_a_bad_request(
        api: Api, proxies: ResourceType, sent, how) -> None:
    """400 BadRequest naming the field, as the real server's decode of the body (any subresource too)."""
    before = stored(api, proxies)
    body = copy.deepcopy(before)
    body["metadata"]["managedFields"] = sent
    with pytest.raises(ApiError) as exc:
        if how == "create":
            body["metadata"] = {"name": "b", "managedFields": sent}
            api.create(proxies, "default", body, manager="writer")
        else:
            api.update(proxies, "default", "a", body, manager="writer",
                       subresource="status" if how == "status-update" else "")
    assert (exc.value.code, exc.value.reason) == (400, "BadRequest")
    assert "metadata.managedFields" in exc.value.message
    assert api.get(proxies, "default", "a") == before


def _ownership_history(api: Api, proxies: ResourceType) -> list[list[dict]]:
    """managedFields after each write of a mix: creates, an apply, updates and a status write by other
    managers (each taking fields from the others), an apply again, two objects with equal field sets."""
    out = []
    for name in ("a", "b"):
        out.append(api.create(proxies, "default", proxy(name, port=3128), manager="op")[0])
        applied = {"apiVersion": "egressproxies.io/v1alpha1", "kind": "Proxy", "metadata": {"name": name},
                   "spec": {"port": 3000}}
        out.append(api.patch(proxies, "default", name, APPLY, applied, manager="kubectl", force=True)[0])
        out.append(api.patch(proxies, "default", name, MERGE, {"spec": {"port": 3001}}, manager="edit")[0])
        status = {"status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}
        out.append(api.patch(proxies, "default", name, MERGE, status, subresource="status", manager="op")[0])
        out.append(api.patch(proxies, "default", name, APPLY, applied, manager="kubectl", force=True)[0])
    return [o["metadata"]["managedFields"] for o in out]


def test_ownership_is_the_same_whether_its_fieldsv1_trees_are_shared_or_built_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stored entries share one fieldsV1 tree per field set, and a write reads a tree it built by identity
    (fieldmanager.shared_fields_v1): with room for one tree only, every other is built and parsed again,
    and what each write records must not differ."""
    from kube.kube_emulator_fixtures import proxy_crd

    from testbed.emulator import fieldmanager

    from .conftest import crd_type

    def history() -> list[list[dict]]:
        api = Api(clock=lambda: datetime(2026, 12, 2, tzinfo=UTC))
        api.create(crd_type(api), "", proxy_crd())
        return _ownership_history(api, api.resource("egressproxies.io", "v1alpha1", "proxies"))

    shared = history()
    monkeypatch.setattr(fieldmanager, "_TREES_MAX", 1)
    monkeypatch.setattr(fieldmanager, "_trees", {})
    monkeypatch.setattr(fieldmanager, "_tree_paths", {})
    rebuilt = history()
    assert rebuilt == shared
    assert len(fieldmanager._trees) == 1
    # the managers the mix should leave: the status entry with the op's main entry, edit's port taken back
    assert [(m["manager"], m["operation"], m.get("subresource", "")) for m in shared[-1]] == [
        ("op", "Update", ""), ("op", "Update", "status"), ("kubectl", "Apply", "")]


def test_a_set_item_equal_only_to_python_is_a_new_item_of_the_writer(api: Api) -> None:
    """A set list's items are owned by value as JSON (`v:1` is not `v:1.0`), though Python's == takes them
    for equal: the field set of a write must not be reused from the object it starts from then."""
    from .conftest import crd_type, widget_crd

    crd = widget_crd()
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    props["nums"] = {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "number"}}
    api.create(crd_type(api), "", crd)
    widgets = api.resource("example.com", "v1", "widgets")
    obj, _ = api.create(widgets, "default", {"metadata": {"name": "w"}, "spec": {"size": 1, "nums": [1]}},
                        manager="a")
    obj, _ = api.update(widgets, "default", "w", {**obj, "spec": {"size": 1, "nums": [1.0]}}, manager="b")
    assert obj["spec"]["nums"] == [1.0] and isinstance(obj["spec"]["nums"][0], float)
    nums = ("f:spec", "f:nums")
    got = owners(obj)
    assert (*nums, "v:1.0") in got[("b", "Update", "")]
    assert {p for p in got[("a", "Update", "")] if p[:2] == nums and len(p) == 3} == set()
