"""What writes do to stored objects (Api, no HTTP): versions, conflicts, status, generation, finalizers."""

from __future__ import annotations

import pytest

from testbed.emulator import Api, ApiError
from testbed.emulator.resources import ResourceType

from .conftest import crd_type, proxy, widget_crd


def _rv(obj: dict) -> int:
    return int(obj["metadata"]["resourceVersion"])


def test_every_write_takes_a_new_global_resource_version(api: Api, proxies: ResourceType) -> None:
    secrets = api.resource("", "v1", "secrets")
    a, _ = api.create(proxies, "default", proxy("a"))
    s, _ = api.create(secrets, "default", {"metadata": {"name": "s"}, "data": {"k": "dg=="}})
    b, _ = api.patch(proxies, "default", "a", "application/merge-patch+json", {"spec": {"port": 8080}})
    assert _rv(a) < _rv(s) < _rv(b) == api.store.resource_version
    assert isinstance(b["metadata"]["resourceVersion"], str)


def test_create_fills_server_fields_and_defaults(api: Api, proxies: ResourceType) -> None:
    obj, _ = api.create(proxies, "default", proxy("a"))
    meta = obj["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    assert meta["namespace"] == "default"
    assert obj["spec"]["port"] == 3128 and obj["spec"]["mode"] == "Managed"


def test_create_twice_is_already_exists(api: Api, proxies: ResourceType) -> None:
    api.create(proxies, "default", proxy("a"))
    with pytest.raises(ApiError) as e:
        api.create(proxies, "default", proxy("a"))
    assert (e.value.code, e.value.reason) == (409, "AlreadyExists")
    assert e.value.message == 'proxies.egressproxies.io "a" already exists'


def test_generate_name(api: Api, proxies: ResourceType) -> None:
    body = proxy("")
    body["metadata"] = {"generateName": "px-"}
    obj, _ = api.create(proxies, "default", body)
    assert obj["metadata"]["name"].startswith("px-") and len(obj["metadata"]["name"]) == 8


def test_create_in_missing_namespace_is_not_found(api: Api, proxies: ResourceType) -> None:
    with pytest.raises(ApiError) as e:
        api.create(proxies, "nope", proxy("a"))
    assert e.value.code == 404 and e.value.message == 'namespaces "nope" not found'


def test_invalid_name_is_422_naming_the_field(api: Api, proxies: ResourceType) -> None:
    with pytest.raises(ApiError) as e:
        api.create(proxies, "default", proxy("Bad_Name"))
    assert e.value.code == 422
    assert e.value.details["causes"][0]["field"] == "metadata.name"


def test_stale_update_is_conflict(api: Api, proxies: ResourceType) -> None:
    obj, _ = api.create(proxies, "default", proxy("a"))
    api.patch(proxies, "default", "a", "application/merge-patch+json", {"metadata": {"labels": {"x": "1"}}})
    obj["spec"]["port"] = 9000
    with pytest.raises(ApiError) as e:
        api.update(proxies, "default", "a", obj)
    assert (e.value.code, e.value.reason) == (409, "Conflict")
    assert "the object has been modified" in e.value.message


def test_custom_resource_put_needs_resource_version(api: Api, proxies: ResourceType) -> None:
    obj, _ = api.create(proxies, "default", proxy("a"))
    del obj["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as e:
        api.update(proxies, "default", "a", obj)
    assert e.value.code == 422 and e.value.details["causes"][0]["field"] == "metadata.resourceVersion"


def test_builtin_put_may_be_unconditional(api: Api) -> None:
    cms = api.resource("", "v1", "configmaps")
    api.create(cms, "default", {"metadata": {"name": "c"}, "data": {"a": "1"}})
    obj, _ = api.update(cms, "default", "c", {"metadata": {"name": "c"}, "data": {"a": "2"}})
    assert obj["data"] == {"a": "2"}


def test_patch_with_stale_resource_version_is_conflict(api: Api, proxies: ResourceType) -> None:
    obj, _ = api.create(proxies, "default", proxy("a"))
    api.patch(proxies, "default", "a", "application/merge-patch+json", {"spec": {"port": 1}})
    with pytest.raises(ApiError) as e:
        api.patch(
            proxies,
            "default",
            "a",
            "application/merge-patch+json",
            {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "spec": {"port": 2}},
        )
    assert e.value.code == 409


def test_update_missing_is_not_found(api: Api, proxies: ResourceType) -> None:
    with pytest.raises(ApiError) as e:
        api.update(proxies, "default", "zz", proxy("zz"))
    assert e.value.code == 404 and e.value.message == 'proxies.egressproxies.io "zz" not found'


def test_write_that_changes_nothing_is_a_no_op(api: Api, proxies: ResourceType) -> None:
    api.create(proxies, "default", proxy("a"))
    api.patch(
        proxies,
        "default",
        "a",
        "application/merge-patch+json",
        {"status": {"phase": "Ready"}},
        subresource="status",
    )
    before = api.store.resource_version
    again, _ = api.patch(
        proxies,
        "default",
        "a",
        "application/merge-patch+json",
        {"status": {"phase": "Ready"}},
        subresource="status",
    )
    assert api.store.resource_version == before and again["metadata"]["resourceVersion"] == str(before)


def test_status_subresource_splits_spec_and_status(api: Api, proxies: ResourceType) -> None:
    created = proxy("a")
    created["status"] = {"phase": "Ready"}
    obj, _ = api.create(proxies, "default", created)
    assert "status" not in obj  # dropped on create, as the real server does
    obj, _ = api.patch(
        proxies,
        "default",
        "a",
        "application/merge-patch+json",
        {"spec": {"port": 8080}, "status": {"phase": "Failed"}},
    )
    assert obj["spec"]["port"] == 8080 and "status" not in obj and obj["metadata"]["generation"] == 2
    obj, _ = api.patch(
        proxies,
        "default",
        "a",
        "application/merge-patch+json",
        {"spec": {"port": 1}, "status": {"phase": "Running", "ip": "10.231.0.9"}},
        subresource="status",
    )
    assert obj["spec"]["port"] == 8080 and obj["status"] == {"phase": "Running", "ip": "10.231.0.9"}
    assert obj["metadata"]["generation"] == 2  # status writes never move generation
    put = dict(obj, status={"phase": "Ready"})
    obj, _ = api.update(proxies, "default", "a", put, subresource="status")
    assert obj["status"] == {"phase": "Ready"}


def test_status_is_validated_against_schema(api: Api, proxies: ResourceType) -> None:
    api.create(proxies, "default", proxy("a"))
    with pytest.raises(ApiError) as e:
        api.patch(
            proxies,
            "default",
            "a",
            "application/merge-patch+json",
            {"status": {"phase": "Exploded"}},
            subresource="status",
        )
    assert e.value.code == 422 and e.value.details["causes"][0]["field"] == "status.phase"


def test_generation_without_status_subresource_counts_status_too(api: Api) -> None:
    api.create(crd_type(api), "", widget_crd(status=False))
    widgets = api.resource("example.com", "v1", "widgets")
    obj, _ = api.create(widgets, "default", {"metadata": {"name": "w"}, "spec": {}, "status": {"a": 1}})
    assert obj["status"] == {"a": 1}  # kept: no status subresource
    obj, _ = api.patch(widgets, "default", "w", "application/merge-patch+json", {"status": {"a": 2}})
    assert obj["metadata"]["generation"] == 2
    obj, _ = api.patch(
        widgets, "default", "w", "application/merge-patch+json", {"metadata": {"labels": {"l": "v"}}}
    )
    assert obj["metadata"]["generation"] == 2  # metadata-only change
    with pytest.raises(ApiError) as e:
        api.patch(
            widgets, "default", "w", "application/merge-patch+json", {"status": {}}, subresource="status"
        )
    assert e.value.code == 404


def test_finalizers_hold_deletion_until_removed(api: Api, proxies: ResourceType) -> None:
    body = proxy("a")
    body["metadata"]["finalizers"] = ["egressproxies.io/finalizer"]
    api.create(proxies, "default", body)
    obj, gone = api.delete(proxies, "default", "a")
    assert not gone and obj["metadata"]["deletionTimestamp"] and obj["metadata"]["generation"] == 2
    again, gone = api.delete(proxies, "default", "a")  # deleting again changes nothing
    assert not gone and again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as e:
        api.patch(
            proxies,
            "default",
            "a",
            "application/merge-patch+json",
            {"metadata": {"finalizers": ["egressproxies.io/finalizer", "other/x"]}},
        )
    assert e.value.code == 422 and "no new finalizers" in e.value.message
    # The status subresource still works while terminating (the operator reports Deleting).
    api.patch(
        proxies,
        "default",
        "a",
        "application/merge-patch+json",
        {"status": {"phase": "Deleting"}},
        subresource="status",
    )
    final, _ = api.patch(
        proxies,
        "default",
        "a",
        "application/json-patch+json",
        [{"op": "remove", "path": "/metadata/finalizers"}],
    )
    assert final["metadata"]["deletionTimestamp"]
    assert api.store.get(proxies.key, "default", "a") is None


def test_delete_without_finalizers_is_immediate_and_preconditions_hold(
    api: Api, proxies: ResourceType
) -> None:
    obj, _ = api.create(proxies, "default", proxy("a"))
    with pytest.raises(ApiError) as e:
        api.delete(proxies, "default", "a", {"preconditions": {"uid": "other"}})
    assert e.value.code == 409
    final, gone = api.delete(proxies, "default", "a", {"preconditions": {"uid": obj["metadata"]["uid"]}})
    assert gone and int(final["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])
    with pytest.raises(ApiError) as e:
        api.get(proxies, "default", "a")
    assert e.value.code == 404


def test_namespace_deletion_waits_for_its_objects(api: Api, proxies: ResourceType) -> None:
    ns_type = api.resource("", "v1", "namespaces")
    api.create(ns_type, "", {"metadata": {"name": "team"}})
    held = proxy("held")
    held["metadata"]["finalizers"] = ["egressproxies.io/finalizer"]
    api.create(proxies, "team", held)
    api.create(proxies, "team", proxy("free"))
    ns, gone = api.delete(ns_type, "", "team")
    assert not gone and ns["status"]["phase"] == "Terminating"
    assert api.store.get(proxies.key, "team", "free") is None
    with pytest.raises(ApiError) as e:
        api.create(proxies, "team", proxy("late"))
    assert e.value.code == 403
    api.patch(proxies, "team", "held", "application/merge-patch+json", {"metadata": {"finalizers": None}})
    assert api.store.get(ns_type.key, "", "team") is None
    with pytest.raises(ApiError) as e:
        api.delete(ns_type, "", "kube-system")
    assert e.value.code == 403


def test_initial_namespaces_and_stable_kube_system_uid(api: Api) -> None:
    ns_type = api.resource("", "v1", "namespaces")
    names = [n["metadata"]["name"] for n in api.list(ns_type, None)[0]]
    assert {"default", "kube-system", "kube-public"} <= set(names)
    assert (
        api.get(ns_type, "", "kube-system")["metadata"]["uid"]
        == api.get(ns_type, "", "kube-system")["metadata"]["uid"]
    )


def test_crd_serves_its_kind_and_deleting_it_removes_its_objects(api: Api) -> None:
    crds = crd_type(api)
    api.create(crds, "", widget_crd(scope="Cluster", status=True))
    widgets = api.resource("example.com", "v1", "widgets")
    assert not widgets.namespaced and widgets.short_names == ("wd",)
    obj, _ = api.create(widgets, "ignored", {"metadata": {"name": "w", "namespace": "x"}, "spec": {}})
    assert "namespace" not in obj["metadata"] and obj["spec"] == {"size": 1}
    crd = api.get(crds, "", "widgets.example.com")
    assert {c["type"] for c in crd["status"]["conditions"]} >= {"Established", "NamesAccepted"}
    _, gone = api.delete(crds, "", "widgets.example.com")
    assert gone and api.store.get(widgets.key, "", "w") is None
    with pytest.raises(ApiError) as e:
        api.resource("example.com", "v1", "widgets")
    assert e.value.code == 404


def test_crd_with_additional_properties_next_to_properties_is_rejected(api: Api) -> None:
    crd = widget_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["additionalProperties"] = (
        False
    )
    with pytest.raises(ApiError) as e:
        api.create(crd_type(api), "", crd)
    assert e.value.code == 422
    assert e.value.details["causes"][0]["field"] == (
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].additionalProperties"
    )


def test_crd_name_must_match_plural_and_group(api: Api) -> None:
    crd = widget_crd()
    crd["metadata"]["name"] = "wrong.example.com"
    with pytest.raises(ApiError) as e:
        api.create(crd_type(api), "", crd)
    assert 'must be spec.names.plural+"."+spec.group' in e.value.message


def test_label_and_field_selectors(api: Api, proxies: ResourceType) -> None:
    for name, tier in (("a", "web"), ("b", "db"), ("c", None)):
        body = proxy(name)
        if tier:
            body["metadata"]["labels"] = {"tier": tier}
        api.create(proxies, "default", body)

    def names(**kw: str) -> list[str]:
        return [o["metadata"]["name"] for o in api.list(proxies, "default", **kw)[0]]

    assert names(label_selector="tier=web") == ["a"]
    assert names(label_selector="tier in (web,db)") == ["a", "b"]
    assert names(label_selector="!tier") == ["c"]
    assert names(label_selector="tier,tier!=db") == ["a"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="metadata.namespace=default,metadata.name!=b") == ["a", "c"]
    with pytest.raises(ApiError) as e:
        names(field_selector="spec.port=1")
    assert e.value.code == 400 and "field label not supported: spec.port" in e.value.message


def test_event_field_selectors_as_kubectl_describe_sends_them(api: Api) -> None:
    events = api.resource("", "v1", "events")
    for i, name in enumerate(("a", "b")):
        api.create(
            events,
            "default",
            {
                "metadata": {"name": f"e{i}"},
                "reason": "R",
                "type": "Normal",
                "involvedObject": {"kind": "Proxy", "name": name, "namespace": "default", "uid": f"u{i}"},
            },
        )
    sel = "involvedObject.kind=Proxy,involvedObject.name=a,involvedObject.namespace=default,"
    sel += "involvedObject.uid=u0"
    assert [e["metadata"]["name"] for e in api.list(events, "default", field_selector=sel)[0]] == ["e0"]
