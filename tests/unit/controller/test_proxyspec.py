"""Spec parsing: the CRD's defaults, and errors that name the field."""

from __future__ import annotations

import pytest

from egress_kvm.controller.proxyspec import HealthCheck, SpecError, parse_spec


def test_defaults() -> None:
    s = parse_spec({"provider": "kvm-home"})
    assert s.mode == "Managed" and s.port == 3128
    assert s.health == HealthCheck(url=None, interval_seconds=10, timeout_seconds=5, success_threshold=2,
                                   failure_threshold=3)
    assert s.user_data is None and s.user_data_ref is None and s.auth_secret is None


def test_external() -> None:
    s = parse_spec({"mode": "External", "external": {"address": "[::1]:8888"}})
    assert (s.external_host, s.external_port) == ("::1", 8888)


@pytest.mark.parametrize(("spec", "message"), [
    (None, "spec: is required"),
    ({"mode": "Hybrid"}, "spec.mode: 'Hybrid' is not Managed or External"),
    ({"mode": "Managed"}, "spec.provider: is required in Managed mode"),
    ({"mode": "External", "external": {"address": "host"}}, "spec.external.address: 'host' is not host:port"),
    ({"mode": "External", "external": {"address": "h:99999"}}, "spec.external.address: 'h:99999' port"),
    ({"provider": "p", "port": 0}, "spec.port: 0 is not in 1..65535"),
    ({"provider": "p", "port": "80"}, "spec.port: must be an integer, not '80'"),
    ({"provider": "p", "healthCheck": {"successThreshold": 0}},
     "spec.healthCheck.successThreshold: 0 is not"),
    ({"provider": "p", "healthCheck": {"url": "ftp://x"}},
     "spec.healthCheck.url: 'ftp://x' is not an http(s)"),
    ({"provider": "p", "cloudInit": {"secretRef": {"name": "s"}}},
     "spec.cloudInit.secretRef.key: is required"),
    ({"provider": "p", "auth": {"secretRef": {}}}, "spec.auth.secretRef.name: is required"),
    ({"provider": "p", "placement": "nas1"}, "spec.placement: must be an object"),
])
def test_errors_name_the_field(spec: object, message: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(spec)
    assert str(e.value).startswith(message), str(e.value)


def test_inline_user_data_is_not_in_repr() -> None:
    s = parse_spec({"provider": "p", "cloudInit": {"userData": "TOPSECRET"}})
    assert "TOPSECRET" not in repr(s)


@pytest.mark.parametrize("spec", [
    {"mode": "X" * 100_000},
    {"provider": "p", "port": "9" * 100_000},
    {"provider": "p", "healthCheck": {"intervalSeconds": ["x" * 1000] * 100}},
])
def test_a_huge_bad_value_is_cut_short_in_the_message(spec: object) -> None:
    """Messages go to status and Events: a tenant's megabyte of junk must not ride along (a status write
    that size fails, and the Proxy would retry it forever)."""
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert len(str(err.value)) < 300


@pytest.mark.parametrize("image", [
    "img.example/x.qcow2?X-Amz-Signature=SECRETSIG \x01",  # no scheme: still a signed query
    "img.example/x.qcow2?token=SECRETSIG%20x\x7f",
])
def test_a_refused_image_value_never_shows_its_query(image: str) -> None:
    with pytest.raises(SpecError, match=r"spec\.placement\.image") as err:
        parse_spec({"provider": "p", "placement": {"image": image}})
    assert "SECRETSIG" not in str(err.value)
