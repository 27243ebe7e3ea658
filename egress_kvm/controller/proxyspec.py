"""A Proxy's spec as typed values, with the CRD's defaults and errors that name the offending field.

The CRD's schema rejects most bad input at admission, but defaults may be missing (an object written
before the CRD had them, a server that does not default) and some rules span fields (Managed needs a
provider, External an address, user-data inline or from a Secret but not both). Everything the
reconciler reads from a spec goes through `parse_spec`, so a bad value becomes a `SpecError` whose
message starts with the field path, e.g. `spec.external.address: "x" is not host:port`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from egress_kvm.config.models import parse_host_port
from egress_kvm.providers.base import Placement
from egress_kvm.redact import redact_url

from .shapes import Shape, shape_problem

MANAGED = "Managed"
EXTERNAL = "External"
DEFAULT_PORT = 3128


class SpecError(ValueError):
    """The spec can never work as written; the message names the field and value."""


@dataclass(frozen=True)
class HealthCheck:
    url: str | None = field(default=None, repr=False)  # may carry credentials: shown only redacted
    interval_seconds: int = 10
    timeout_seconds: int = 5
    success_threshold: int = 2
    failure_threshold: int = 3


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class ProxySpec:
    mode: str
    provider: str
    placement: Placement
    port: int
    external_host: str | None = None
    external_port: int | None = None
    user_data: str | None = field(default=None, repr=False)  # inline cloud-init: secret, never shown
    user_data_ref: SecretKeyRef | None = None
    auth_secret: str | None = None
    health: HealthCheck = HealthCheck()


def _obj(parent: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{path}: must be an object, not {type(value).__name__}")
    return value


def _str(parent: dict[str, Any], key: str, path: str, *, required: bool = False,
         shape: Shape = Shape.TEXT) -> str | None:
    """A string field, checked against its shape (the CRD's pattern, repeated here for objects the API
    server did not check): control characters never pass, since they end up in libvirt XML, names and
    messages, and must be refused before any volume exists."""
    value = parent.get(key)
    if value is None or value == "":
        if required:
            raise SpecError(f"{path}: is required")
        return None
    if not isinstance(value, str):
        raise SpecError(f"{path}: must be a string, not {_shown(value)}")
    problem = shape_problem(value, shape)
    if problem is not None:
        raise SpecError(f"{path}: {_shown(value)} {problem}")
    return value


def _shown(value: Any) -> str:
    """A bad value as a message may show it: escaped (repr), URL secrets removed, and cut short."""
    secret_bearing = isinstance(value, str) and any(mark in value for mark in ("://", "@", "?"))
    text = repr(redact_url(value) if secret_bearing else value)
    return text if len(text) <= 100 else text[:97] + "..."


def _int(parent: dict[str, Any], key: str, path: str, *, default: int, lo: int, hi: int) -> int:
    value = parent.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{path}: must be an integer, not {_shown(value)}")
    if not lo <= value <= hi:
        raise SpecError(f"{path}: {value} is not in {lo}..{hi}")
    return value


def _cloud_init(spec: dict[str, Any]) -> tuple[str | None, SecretKeyRef | None]:
    ci = _obj(spec, "cloudInit", "spec.cloudInit")
    user_data = ci.get("userData")
    if user_data is not None and not isinstance(user_data, str):
        raise SpecError("spec.cloudInit.userData: must be a string")
    ref = None
    if ci.get("secretRef") is not None:
        r = _obj(ci, "secretRef", "spec.cloudInit.secretRef")
        name = _str(r, "name", "spec.cloudInit.secretRef.name", required=True, shape=Shape.SECRET_NAME)
        key = _str(r, "key", "spec.cloudInit.secretRef.key", required=True, shape=Shape.SECRET_KEY)
        ref = SecretKeyRef(name=name or "", key=key or "")
        if user_data:
            raise SpecError("spec.cloudInit: set userData or secretRef, not both")
    return user_data, ref


def _health_check(spec: dict[str, Any]) -> HealthCheck:
    hc = _obj(spec, "healthCheck", "spec.healthCheck")
    url = _str(hc, "url", "spec.healthCheck.url", shape=Shape.URL)
    if url is not None and not url.startswith(("http://", "https://")):
        raise SpecError(f"spec.healthCheck.url: {redact_url(url)!r} is not an http(s) URL")
    health = HealthCheck(
        url=url,
        interval_seconds=_int(hc, "intervalSeconds", "spec.healthCheck.intervalSeconds", default=10, lo=1,
                              hi=3600),
        timeout_seconds=_int(hc, "timeoutSeconds", "spec.healthCheck.timeoutSeconds", default=5, lo=1,
                             hi=600),
        success_threshold=_int(hc, "successThreshold", "spec.healthCheck.successThreshold", default=2, lo=1,
                               hi=100),
        failure_threshold=_int(hc, "failureThreshold", "spec.healthCheck.failureThreshold", default=3, lo=1,
                               hi=100),
    )
    return health


def parse_spec(spec: Any) -> ProxySpec:
    if not isinstance(spec, dict):
        raise SpecError("spec: is required")
    mode = spec.get("mode") or MANAGED
    if mode not in (MANAGED, EXTERNAL):
        raise SpecError(f"spec.mode: {_shown(mode)} is not Managed or External")

    p = _obj(spec, "placement", "spec.placement")
    placement = Placement(
        zone=_str(p, "zone", "spec.placement.zone", shape=Shape.NAME),
        machine_type=_str(p, "machineType", "spec.placement.machineType"),
        image=_str(p, "image", "spec.placement.image", shape=Shape.IMAGE),
        region=_str(p, "region", "spec.placement.region"),
    )
    port = _int(spec, "port", "spec.port", default=DEFAULT_PORT, lo=1, hi=65535)

    user_data, ref = _cloud_init(spec)

    auth_secret = None
    auth = _obj(spec, "auth", "spec.auth")
    if auth:
        auth_secret = _str(_obj(auth, "secretRef", "spec.auth.secretRef"), "name",
                           "spec.auth.secretRef.name", required=True, shape=Shape.SECRET_NAME)

    health = _health_check(spec)

    provider = _str(spec, "provider", "spec.provider", shape=Shape.NAME) or ""
    ext_host = ext_port = None
    if mode == MANAGED:
        if not provider:
            raise SpecError("spec.provider: is required in Managed mode")
    else:
        address = _str(_obj(spec, "external", "spec.external"), "address", "spec.external.address",
                       shape=Shape.ADDRESS)
        if address is None:
            raise SpecError("spec.external.address: is required in External mode")
        try:
            ext_host, ext_port = parse_host_port(address)
        except ValueError as e:
            raise SpecError(f"spec.external.address: {_shown(address)} {e}") from None

    return ProxySpec(mode=mode, provider=provider, placement=placement, port=port, external_host=ext_host,
                     external_port=ext_port, user_data=user_data, user_data_ref=ref, auth_secret=auth_secret,
                     health=health)
