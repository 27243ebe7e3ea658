"""The CRD's CEL rules (x-kubernetes-validations), enforced the way a real server reports them, and the
emulator's CEL subset refusing at CRD creation what it could not check."""

from __future__ import annotations

import pytest

from testbed.emulator import Api, ApiError, cel
from testbed.emulator.resources import ResourceType

from .conftest import crd_type, proxy, widget_crd


def _invalid(api: Api, rt: ResourceType, body: dict) -> ApiError:
    with pytest.raises(ApiError) as e:
        api.create(rt, "default", body)
    return e.value


@pytest.mark.parametrize(("body", "line"), [
    ({"apiVersion": "egressproxies.io/v1alpha1", "kind": "Proxy", "metadata": {"name": "x"},
      "spec": {"mode": "Managed"}},
     'spec: Invalid value: "object": spec.provider is required when spec.mode is Managed'),
    ({"apiVersion": "egressproxies.io/v1alpha1", "kind": "Proxy", "metadata": {"name": "x"},
      "spec": {}},  # mode defaults to Managed before the rules run
     'spec: Invalid value: "object": spec.provider is required when spec.mode is Managed'),
    (proxy("x", mode="External"),
     'spec: Invalid value: "object": spec.external.address is required when spec.mode is External'),
    (proxy("x", cloudInit={"userData": "#cloud-config\n", "secretRef": {"name": "s", "key": "k"}}),
     'spec.cloudInit: Invalid value: "object": set spec.cloudInit.userData or spec.cloudInit.secretRef, '
     "not both"),
])
def test_cross_field_rules_are_refused_at_admission(api: Api, proxies: ResourceType, body: dict,
                                                    line: str) -> None:
    err = _invalid(api, proxies, body)
    assert err.code == 422 and err.reason == "Invalid"
    assert err.message == f'Proxy.egressproxies.io "x" is invalid: {line}'
    assert err.details["causes"][0]["reason"] == "FieldValueInvalid"


@pytest.mark.parametrize("spec", [
    {"mode": "External", "external": {"address": "10.0.0.1:3128"}},
    {"provider": "lab", "cloudInit": {"userData": "#cloud-config\n"}},
    {"provider": "lab", "cloudInit": {"secretRef": {"name": "s", "key": "k"}}},
])
def test_valid_combinations_pass(api: Api, proxies: ResourceType, spec: dict) -> None:
    body = proxy("ok")
    body["spec"] = spec
    api.create(proxies, "default", body)


def test_a_rule_outside_the_subset_is_refused_with_the_crd() -> None:
    api = Api()
    crd = widget_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"] = [{"rule": "self.size.startsWith('a')"}]
    err = _invalid(api, crd_type(api), crd)
    assert err.code == 422
    assert "x-kubernetes-validations[0].rule: Invalid value" in err.message
    assert "compilation failed" in err.message


def test_a_rule_without_a_message_reports_the_rule() -> None:
    api = Api()
    crd = widget_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"] = [{"rule": "self.size != 13"}]
    api.create(crd_type(api), "", crd)
    rt = api.resource("example.com", "v1", "widgets")
    err = _invalid(api, rt, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "x"},
                             "spec": {"size": 13}})
    assert err.message.endswith('spec: Invalid value: "object": failed rule: self.size != 13')


@pytest.mark.parametrize(("rule", "value", "want"), [
    ("self.a == 'x' && self.b == 2", {"a": "x", "b": 2}, True),
    ("self.a == 'x' && self.b == 2", {"a": "x", "b": 3}, False),
    ("!has(self.a.b) || self.a.b == true", {"a": {}}, True),
    ("has(self.a) || self.nope == 1", {"a": 1}, True),  # || absorbs an error when one side is true
    ("(self.a != \"y\")", {"a": "y"}, False),
])
def test_cel_subset(rule: str, value: dict, want: bool) -> None:
    assert cel.check(rule, value) is want


@pytest.mark.parametrize(("rule", "value"), [("self.nope == 1", {}), ("self.a == 1", {"a": "1"})])
def test_cel_runtime_errors(rule: str, value: dict) -> None:
    with pytest.raises(cel.CelError):
        cel.check(rule, value)
