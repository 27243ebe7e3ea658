"""Patch formats: RFC 7386 merge, RFC 6902 JSON patch, and strategic merge for built-in kinds."""

from __future__ import annotations

import pytest

from testbed.emulator import Api, ApiError
from testbed.emulator.patch import json_patch, merge_patch, strategic_merge_patch
from testbed.emulator.resources import ResourceType

from .conftest import proxy


def test_merge_patch_rfc7386() -> None:
    doc = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    assert merge_patch(doc, {"a": "z", "c": {"f": None}, "l": [3]}) == {"a": "z", "c": {"d": "e"}, "l": [3]}
    assert doc["c"] == {"d": "e", "f": "g"}  # input untouched


def test_json_patch_ops() -> None:
    doc = {"metadata": {"finalizers": ["a", "b"], "labels": {"x/y": "1"}}}
    out = json_patch(
        doc,
        [
            {"op": "add", "path": "/metadata/finalizers/-", "value": "c"},
            {"op": "remove", "path": "/metadata/finalizers/0"},
            {"op": "replace", "path": "/metadata/labels/x~1y", "value": "2"},
            {"op": "test", "path": "/metadata/labels/x~1y", "value": "2"},
            {"op": "copy", "from": "/metadata/labels", "path": "/spec"},
            {"op": "move", "from": "/spec", "path": "/status"},
        ],
    )
    assert out == {"metadata": {"finalizers": ["b", "c"], "labels": {"x/y": "2"}}, "status": {"x/y": "2"}}
    with pytest.raises(ApiError) as e:
        json_patch(doc, [{"op": "remove", "path": "/nope"}])
    assert e.value.code == 422
    with pytest.raises(ApiError) as e:
        json_patch(doc, [{"op": "test", "path": "/metadata/finalizers/0", "value": "zzz"}])
    assert e.value.code == 422


def test_json_patch_content_type_with_an_object_body_is_refused() -> None:
    # kubernetes-asyncio sends a dict with application/json-patch+json unless told otherwise.
    with pytest.raises(ApiError) as e:
        json_patch({}, {"status": {}})
    assert e.value.code == 400 and "jsonPatchOp" in e.value.message


def test_strategic_merge_merges_named_lists_and_honours_directives() -> None:
    doc = {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}], "args": ["x"]}}
    patch = {
        "spec": {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}, {"name": "c"}],
            "containers": [{"name": "a", "image": "2"}, {"name": "c", "image": "9"}],
            "args": ["y"],
        }
    }
    out = strategic_merge_patch(doc, patch)
    assert out["spec"]["containers"] == [
        {"name": "b", "image": "1"},
        {"name": "a", "image": "2"},
        {"name": "c", "image": "9"},
    ]
    assert out["spec"]["args"] == ["y"]
    out = strategic_merge_patch(doc, {"spec": {"containers": [{"name": "a", "$patch": "delete"}]}})
    assert out["spec"]["containers"] == [{"name": "b", "image": "1"}]


def test_custom_resources_refuse_strategic_merge(api: Api, proxies: ResourceType) -> None:
    api.create(proxies, "default", proxy("a"))
    with pytest.raises(ApiError) as e:
        api.patch(proxies, "default", "a", "application/strategic-merge-patch+json", {"spec": {"port": 1}})
    assert e.value.code == 415
    assert e.value.message == (
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json"
    )


def test_store_clone_is_a_deep_copy_of_json_data() -> None:
    from testbed.emulator.store import clone

    obj = {"a": [1, {"b": "c"}, None, 2.5, True], "d": {"e": {"f": ["g"]}}}
    copied = clone(obj)
    assert copied == obj
    copied["a"][1]["b"] = "changed"
    copied["d"]["e"]["f"].append("h")
    assert obj == {"a": [1, {"b": "c"}, None, 2.5, True], "d": {"e": {"f": ["g"]}}}
