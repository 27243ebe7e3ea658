"""The CRD's string patterns are the operator's field shapes (controller/shapes.py), and the API emulator
enforces them: a control character is refused at admission, naming the field."""

from __future__ import annotations

import re
from typing import Any

import pytest

from egress_kvm.controller.proxyspec import SpecError, parse_spec
from egress_kvm.controller.shapes import MAX_LENGTH, PATTERNS, Shape
from testbed.emulator import Api, ApiError
from testbed.emulator.resources import ResourceType

from .conftest import proxy, proxy_crd

FIELDS: dict[tuple[str, ...], Shape] = {
    ("provider",): Shape.NAME,
    ("placement", "zone"): Shape.NAME,
    ("placement", "machineType"): Shape.TEXT,
    ("placement", "image"): Shape.IMAGE,
    ("placement", "region"): Shape.TEXT,
    ("external", "address"): Shape.ADDRESS,
    ("cloudInit", "secretRef", "name"): Shape.SECRET_NAME,
    ("cloudInit", "secretRef", "key"): Shape.SECRET_KEY,
    ("auth", "secretRef", "name"): Shape.SECRET_NAME,
    ("healthCheck", "url"): Shape.URL,
}


def _schema_of(path: tuple[str, ...]) -> dict[str, Any]:
    node = proxy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in path:
        node = node["properties"][part]
    return node


@pytest.mark.parametrize("path", list(FIELDS))
def test_every_string_field_carries_its_shape_as_pattern(path: tuple[str, ...]) -> None:
    assert _schema_of(path).get("pattern") == PATTERNS[FIELDS[path]]


@pytest.mark.parametrize("path", list(FIELDS))
def test_every_string_field_is_bounded_at_admission_and_in_the_operator(path: tuple[str, ...]) -> None:
    """Values are echoed in status, Events and logs: a field without a bound let a tenant put a megabyte
    into each probe message (healthCheck.url) or refusal (external.address)."""
    bound = _schema_of(path).get("maxLength")
    assert bound is not None and bound <= MAX_LENGTH[FIELDS[path]]
    with pytest.raises(SpecError, match=re.escape(f"spec.{'.'.join(path)}: ")):
        parse_spec(_spec(path, _long(path)))


def _long(path: tuple[str, ...]) -> str:
    """A value of the field's shape, one character past the operator's bound."""
    n = MAX_LENGTH[FIELDS[path]] + 1
    if path == ("external", "address"):
        return "a" * (n - 5) + ":3128"
    if path == ("healthCheck", "url"):
        return "http://h/" + "a" * (n - 9)
    return "a" * n


def _spec(path: tuple[str, ...], value: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"mode": "External", "external": {"address": "proxy.example:3128"}} \
        if path == ("external", "address") else {}
    node = spec
    for part in path[:-1]:
        node = node.setdefault(part, {})
    if path[:2] == ("cloudInit", "secretRef"):
        node.setdefault("name", "ci")
        node.setdefault("key", "user-data")
    node[path[-1]] = value
    return spec


@pytest.mark.parametrize("path", list(FIELDS))
@pytest.mark.parametrize("bad", ["\x01", "\x00", "\x1b[31m", "\x7f", "\n"])
def test_a_control_character_is_refused_at_admission_and_by_the_operator(
        api: Api, proxies: ResourceType, path: tuple[str, ...], bad: str) -> None:
    value = {"provider": "kvm", "zone": "nas1", "address": "h:1", "name": "ci", "key": "k",
             "url": "http://x/"}.get(path[-1], "debian-12")
    value = value[:1] + bad + value[1:] if path[-1] != "address" else "h" + bad + ":1"
    body = proxy("x", **_spec(path, value))
    with pytest.raises(ApiError) as info:
        api.create(proxies, "default", body)
    field = "spec." + ".".join(path)
    assert info.value.code == 422 and f"{field}: Invalid value" in info.value.message
    with pytest.raises(SpecError, match=re.escape(f"{field}: ")):
        parse_spec(body["spec"])


@pytest.mark.parametrize(("path", "good"), [
    (("placement", "image"), "https://images.example/debian-12.qcow2?sig=a%2Fb"),
    (("placement", "machineType"), "small (2 vCPU)"),
    (("external", "address"), "[2001:db8::1]:3128"),
    (("cloudInit", "secretRef", "name"), "team-a.cloud-init"),
    (("cloudInit", "secretRef", "key"), "user_data.yaml"),
])
def test_ordinary_values_pass_both(api: Api, proxies: ResourceType, path: tuple[str, ...], good: str) -> None:
    body = proxy("x", **_spec(path, good))
    api.create(proxies, "default", body)
    parse_spec(body["spec"])
