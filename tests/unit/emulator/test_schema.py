"""CRD schemas: defaults, pruning, validation messages with field paths, worded as the real server's."""

from __future__ import annotations

import json

import pytest

from testbed.emulator import Api, ApiError, schema
from testbed.emulator.resources import ResourceType

from .conftest import crd_type, proxy, proxy_crd, widget_crd


def _invalid(api: Api, rt: ResourceType, body: dict) -> ApiError:
    with pytest.raises(ApiError) as e:
        api.create(rt, "default", body)
    return e.value


def test_message_for_out_of_range_port_matches_the_real_server(api: Api, proxies: ResourceType) -> None:
    err = _invalid(api, proxies, proxy("x", port=70000))
    assert err.code == 422 and err.reason == "Invalid"
    assert err.message == (
        'Proxy.egressproxies.io "x" is invalid: spec.port: Invalid value: 70000: '
        "spec.port in body should be less than or equal to 65535"
    )
    assert err.details["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "field": "spec.port",
            "message": "Invalid value: 70000: spec.port in body should be less than or equal to 65535",
        }
    ]
    assert err.details["kind"] == "Proxy" and err.details["group"] == "egressproxies.io"


def test_several_errors_are_listed_in_brackets(api: Api, proxies: ResourceType) -> None:
    err = _invalid(api, proxies, proxy("x", mode="Foo", port="80"))
    assert err.message.startswith('Proxy.egressproxies.io "x" is invalid: [')
    fields = {c["field"]: c for c in err.details["causes"]}
    assert fields["spec.mode"]["reason"] == "FieldValueNotSupported"
    assert (
        fields["spec.mode"]["message"] == 'Unsupported value: "Foo": supported values: "Managed", "External"'
    )
    assert (
        fields["spec.port"]["message"]
        == 'Invalid value: "string": spec.port in body must be of type integer: "string"'
    )


@pytest.mark.parametrize(
    ("spec", "field", "fragment"),
    [
        ({"provider": ""}, "spec.provider", "spec.provider in body should be at least 1 chars long"),
        ({"provider": "x" * 64}, "spec.provider", "Too long: may not be more than 63 bytes"),
        (
            {"external": {"address": "no-port"}},
            "spec.external.address",
            r"spec.external.address in body should match '^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$'",
        ),
        ({"external": {}}, "spec.external.address", "Required value"),
        ({"cloudInit": {"secretRef": {"name": "s"}}}, "spec.cloudInit.secretRef.key", "Required value"),
        (
            {"healthCheck": {"intervalSeconds": 0}},
            "spec.healthCheck.intervalSeconds",
            "should be greater than or equal to 1",
        ),
        ({"healthCheck": {"url": "ftp://x"}}, "spec.healthCheck.url",
         r"should match '^https?://[^\x00-\x20\x7F]+$'"),
    ],
)
def test_nested_violations_name_their_field(
    api: Api, proxies: ResourceType, spec: dict, field: str, fragment: str
) -> None:
    body = proxy("x")
    body["spec"].update(spec)
    err = _invalid(api, proxies, body)
    # one field; a value can break more than one of its rules (an empty provider: length and pattern)
    assert {c["field"] for c in err.details["causes"]} == {field}
    assert fragment in err.message


def test_missing_spec_is_required(api: Api, proxies: ResourceType) -> None:
    err = _invalid(api, proxies, {"metadata": {"name": "x"}})
    assert err.message == 'Proxy.egressproxies.io "x" is invalid: spec: Required value'


def test_array_item_paths_and_status_conditions(api: Api, proxies: ResourceType) -> None:
    api.create(proxies, "default", proxy("x"))
    with pytest.raises(ApiError) as e:
        api.patch(
            proxies,
            "default",
            "x",
            "application/merge-patch+json",
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "True"},
                        {"type": "Healthy", "status": "Maybe"},
                    ]
                }
            },
            subresource="status",
        )
    assert e.value.details["causes"][0]["field"] == "status.conditions[1].status"


def test_defaults_fill_nested_objects_only_when_present(api: Api, proxies: ResourceType) -> None:
    obj, _ = api.create(proxies, "default", proxy("x"))
    assert "healthCheck" not in obj["spec"]
    obj, _ = api.create(proxies, "default", proxy("y", healthCheck={"url": "http://example.test/"}))
    assert obj["spec"]["healthCheck"] == {
        "url": "http://example.test/",
        "intervalSeconds": 10,
        "timeoutSeconds": 5,
        "successThreshold": 2,
        "failureThreshold": 3,
    }


_DEFAULTS = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "default": 1},
        "o": {"type": "object", "properties": {"b": {"type": "string", "default": "x"}}},
        "l": {"type": "array",
              "items": {"type": "object", "properties": {"c": {"type": "integer", "default": 2}}}},
        "m": {"type": "object",
              "additionalProperties": {"type": "object",
                                       "properties": {"d": {"type": "boolean", "default": True}}}},
    },
}


@pytest.mark.parametrize(
    ("value", "lacks"),
    [
        ({"a": 5}, False),
        ({}, True),
        ({"a": 5, "o": {}}, True),
        ({"a": 5, "o": {"b": "y"}}, False),
        ({"a": 5, "l": [{"c": 1}, {}]}, True),
        ({"a": 5, "l": [{"c": 1}]}, False),
        ({"a": 5, "m": {"k": {}}}, True),
        ({"a": 5, "m": {"k": {"d": False}}}, False),
        ({"a": None}, False),  # present, even as null: not defaulted
        ("not an object", False),
    ],
)
def test_lacks_defaults_says_whether_apply_defaults_would_change_a_value(value: object, lacks: bool) -> None:
    """The watch stream copies an event's object only when defaulting it on read would change it."""
    copy = json.loads(json.dumps(value))
    schema.apply_defaults(copy, _DEFAULTS)
    assert schema.lacks_defaults(value, _DEFAULTS) is lacks is (copy != value)


def test_defaults_apply_on_update_and_patch(api: Api, proxies: ResourceType) -> None:
    api.create(proxies, "default", proxy("x"))
    obj, _ = api.patch(proxies, "default", "x", "application/merge-patch+json", {"spec": {"port": None}})
    assert obj["spec"]["port"] == 3128  # removing a defaulted field brings the default back


def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(
    api: Api, proxies: ResourceType
) -> None:
    body = proxy("x", bogus=1, placement={"zone": "a", "rack": 4})
    body["extra"] = True
    obj, warnings = api.create(proxies, "default", body)
    assert "bogus" not in obj["spec"] and "rack" not in obj["spec"]["placement"] and "extra" not in obj
    assert sorted(warnings) == [
        'unknown field "extra"',
        'unknown field "spec.bogus"',
        'unknown field "spec.placement.rack"',
    ]
    with pytest.raises(ApiError) as e:
        api.create(proxies, "default", proxy("y", bogus=1), field_validation="Strict")
    assert e.value.code == 400
    assert e.value.message == (
        'Proxy in version "v1alpha1" cannot be handled as a Proxy: strict decoding error: '
        'unknown field "spec.bogus"'
    )


def test_maps_and_preserved_subtrees_are_not_pruned(api: Api) -> None:
    api.create(crd_type(api), "", widget_crd())
    widgets = api.resource("example.com", "v1", "widgets")
    body = {"metadata": {"name": "w"}, "spec": {"labels": {"a": "b"}, "free": {"any": {"thing": 1}}}}
    obj, warnings = api.create(widgets, "default", body)
    assert (
        obj["spec"]["labels"] == {"a": "b"} and obj["spec"]["free"] == {"any": {"thing": 1}} and not warnings
    )
    with pytest.raises(ApiError) as e:
        api.create(
            widgets,
            "default",
            {"metadata": {"name": "v"}, "spec": {"labels": {"a": 1}, "tags": ["1", "2", "3"]}},
        )
    causes = {c["field"]: c for c in e.value.details["causes"]}
    assert (
        causes["spec.labels.a"]["message"]
        == 'Invalid value: "integer": spec.labels.a in body must be of type string: "integer"'
    )
    assert causes["spec.tags"]["reason"] == "FieldValueTooMany"


def test_validate_function_reports_every_violation() -> None:
    s = proxy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    errs = schema.validate({"spec": {"port": 0, "mode": "X", "placement": {"zone": 5}}}, s)
    assert sorted(e.field for e in errs) == ["spec.mode", "spec.placement.zone", "spec.port"]


@pytest.mark.parametrize("address", ["proxy.lan:3128", "10.0.0.7:3128", "[fd00::1]:3128"])
def test_external_address_takes_names_ipv4_and_bracketed_ipv6(
    api: Api, proxies: ResourceType, address: str
) -> None:
    created, _ = api.create(proxies, "default", proxy("x", mode="External", external={"address": address}))
    assert created["spec"]["external"]["address"] == address


def test_a_crd_may_not_describe_or_restrict_the_roots_metadata() -> None:
    """As the real server: metadata at the root may only restrict name and generateName, so even a
    description there makes the CRD invalid."""
    from testbed.emulator.schema import check_root_metadata

    ok = {"type": "object", "properties": {"metadata": {"type": "object"}}}
    assert check_root_metadata(ok, "s") == []
    named = {"type": "object", "properties": {"metadata": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20}}}}}
    assert check_root_metadata(named, "s") == []
    described = {"type": "object", "properties": {"metadata": {"type": "object", "description": "x"}}}
    (err,) = check_root_metadata(described, "s")
    assert str(err) == ("s.properties[metadata]: Forbidden: must not specify anything other than name and "
                        "generateName, but metadata is implicitly specified")


def test_unchanged_fields_are_validated_again_once_their_crd_changes(api: Api, proxies: ResourceType) -> None:
    """A write does not validate again the fields it leaves as they were in an object that validated
    against the same schema (Api._apply_schema); a CRD change makes a new schema, and the emulator, which
    does not ratchet validation, then refuses a write whose untouched spec the new schema refuses."""
    obj, _ = api.create(proxies, "default", proxy("a", port=8080), manager="op")
    status = {**obj, "status": {"phase": "Pending"}}
    obj, _ = api.update(proxies, "default", "a", status, subresource="status", manager="op")
    crds = crd_type(api)
    crd = api.get(crds, "", "proxies.egressproxies.io")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["port"]["maximum"] = 8000
    api.update(crds, "", "proxies.egressproxies.io", crd)
    proxies = api.resource("egressproxies.io", "v1alpha1", "proxies")
    with pytest.raises(ApiError) as e:
        api.update(proxies, "default", "a", {**obj, "status": {"phase": "Ready"}}, subresource="status",
                   manager="op")
    assert e.value.code == 422 and [c["field"] for c in e.value.details["causes"]] == ["spec.port"]
    # the same write with a spec the new schema takes
    obj = api.get(proxies, "default", "a")
    obj["spec"]["port"] = 3128
    obj, _ = api.update(proxies, "default", "a", obj, manager="op")
    obj, _ = api.update(proxies, "default", "a", {**obj, "status": {"phase": "Ready"}}, subresource="status",
                        manager="op")
    assert obj["status"] == {"phase": "Ready"}
    # an unchanged spec is not validated again, a changed one is
    with pytest.raises(ApiError) as e:
        api.update(proxies, "default", "a", {**obj, "spec": {**obj["spec"], "port": 9000}}, manager="op")
    assert [c["field"] for c in e.value.details["causes"]] == ["spec.port"]


@pytest.mark.parametrize("sent", [True, 1.0], ids=["boolean", "float"])
def test_a_field_equal_only_to_python_is_validated_again(api: Api, sent: object) -> None:
    """Python's == takes true and 1.0 for 1: a field so "equal" to the stored one that validated is still
    another JSON value, and must be validated (refused: 422 naming it), not skipped as unchanged."""
    api.create(crd_type(api), "", widget_crd(status=True))
    widgets = api.resource("example.com", "v1", "widgets")
    obj, _ = api.create(widgets, "default", {"metadata": {"name": "w"}, "spec": {"size": 1}})
    obj, _ = api.update(widgets, "default", "w", {**obj, "status": {"seen": 1}}, subresource="status")
    with pytest.raises(ApiError) as e:
        api.update(widgets, "default", "w", {**obj, "spec": {"size": sent}})
    assert e.value.code == 422 and [c["field"] for c in e.value.details["causes"]] == ["spec.size"]
    assert api.get(widgets, "default", "w")["spec"] == {"size": 1}
