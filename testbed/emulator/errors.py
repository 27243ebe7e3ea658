"""API errors as the real server shapes them: a `Status` object with reason, code and details.

Clients branch on `reason` and `code` (kubernetes-asyncio raises ApiException(status=409), kubectl prints
`Error from server (NotFound): ...`), so each constructor here copies the real server's wording.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FieldError:
    """One `field.Error` of apimachinery: renders as `spec.port: Invalid value: 70000: <detail>`."""

    kind: str  # Required | Invalid | NotSupported | TooLong | TooMany | Forbidden
    field: str
    value: Any = None
    detail: str = ""
    supported: tuple[Any, ...] = ()

    REASONS = {
        "Required": "FieldValueRequired",
        "Invalid": "FieldValueInvalid",
        "NotSupported": "FieldValueNotSupported",
        "TooLong": "FieldValueTooLong",
        "TooMany": "FieldValueTooMany",
        "Forbidden": "FieldValueForbidden",
        "Duplicate": "FieldValueDuplicate",
    }

    def body(self) -> str:
        if self.kind == "Required":
            return "Required value" + (f": {self.detail}" if self.detail else "")
        if self.kind == "NotSupported":
            return f"Unsupported value: {go_value(self.value)}: supported values: " + ", ".join(
                go_value(v) for v in self.supported
            )
        if self.kind == "TooLong":
            return f"Too long: {self.detail}"
        if self.kind == "TooMany":
            return f"Too many: {go_value(self.value)}: {self.detail}"
        if self.kind == "Duplicate":
            shown = self.value if isinstance(self.value, str) and self.value.startswith("map[") \
                else go_value(self.value)
            return f"Duplicate value: {shown}"
        if self.kind == "Forbidden":
            return "Forbidden" + (f": {self.detail}" if self.detail else "")
        return f"Invalid value: {go_value(self.value)}" + (f": {self.detail}" if self.detail else "")

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}" if self.field else self.body()

    def cause(self) -> dict[str, str]:
        return {
            "reason": self.REASONS.get(self.kind, "FieldValueInvalid"),
            "message": self.body(),
            "field": self.field,
        }


def go_value(value: Any) -> str:
    """How apimachinery prints a value in a field error: strings quoted, numbers and bools bare."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass
class ApiError(Exception):
    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def _details(group_resource: tuple[str, str], name: str) -> dict[str, Any]:
    group, resource = group_resource
    d: dict[str, Any] = {"name": name, "kind": resource}
    if group:
        d["group"] = group
    return d


def _qualified(group_resource: tuple[str, str]) -> str:
    group, resource = group_resource
    return f"{resource}.{group}" if group else resource


def not_found(group_resource: tuple[str, str], name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{_qualified(group_resource)} "{name}" not found', _details(group_resource, name)
    )


def already_exists(group_resource: tuple[str, str], name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(group_resource)} "{name}" already exists',
        _details(group_resource, name),
    )


def conflict(group_resource: tuple[str, str], name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(group_resource)} "{name}": {why}',
        _details(group_resource, name),
    )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(group_kind: tuple[str, str], name: str, errors: list[FieldError]) -> ApiError:
    group, kind = group_kind
    qualified = f"{kind}.{group}" if group else kind
    text = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    details: dict[str, Any] = {"name": name, "kind": kind, "causes": [e.cause() for e in errors]}
    if group:
        details["group"] = group
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {text}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(accepted: tuple[str, ...]) -> ApiError:
    """A PATCH body type the resource does not take (kubectl reports it as "not supported by <kind>")."""
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )


def forbidden(group_resource: tuple[str, str], name: str, why: str) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'{_qualified(group_resource)} "{name}" is forbidden: {why}',
        _details(group_resource, name),
    )
