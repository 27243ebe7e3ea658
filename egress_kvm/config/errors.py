"""One error type for a bad providers file, with messages that name the field path and the value.

pydantic reports locations as tuples (`('providers', 0, 'kvm', 'hosts', 1, 'address')`); users read
YAML, so we print `providers[0].kvm.hosts[1].address` and the offending value next to the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from egress_kvm.redact import redact_url

# Fields whose values are never echoed: vendorData is cloud-init, which is never logged at any level.
_SECRET_KEYS = frozenset({"vendorData", "vendor_data"})


class ConfigError(ValueError):
    """The providers file (or a file it points at) is unusable; the message says where and why."""


def yaml_error(exc: Exception) -> str:
    """Where a YAML document stops parsing, without PyYAML's text: its message quotes the offending
    lines of the file, and the providers file holds vendorData and paths that must not reach a log."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return "not valid YAML"
    return f"not valid YAML (line {mark.line + 1}, column {mark.column + 1})"


def field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _shown(loc: tuple[int | str, ...], value: Any) -> str | None:
    """The value as it may be printed, or None when it must not be.

    Only scalars are echoed: a mapping or list input is a whole section (for a model-level error, the
    entire `kvm` entry with its vendorData), and anything under a secret key stays out. Strings that look
    like URLs lose userinfo and query (credentials, signatures).
    """
    if any(part in _SECRET_KEYS for part in loc):
        return None
    shown: object
    if isinstance(value, str):
        shown = redact_url(value) if "://" in value or "@" in value else value
    elif isinstance(value, bool | int | float) or (isinstance(value, dict | list) and not value):
        shown = value  # scalars, and empty sections (which hold nothing to leak)
    else:
        return None
    text = repr(shown)
    return text if len(text) <= 120 else text[:117] + "..."


def _reason(err: Mapping[str, Any]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "is required"
    msg = str(err.get("msg", ""))
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def format_validation_error(exc: ValidationError, *, source: str) -> ConfigError:
    lines = []
    for err in exc.errors(include_url=False):
        path = field_path(tuple(err.get("loc", ())))
        reason = _reason(err)
        shown = None if err.get("type") == "missing" else _shown(tuple(err.get("loc", ())), err.get("input"))
        if shown is None:
            lines.append(f"{path}: {reason}")
        else:
            lines.append(f"{path}: {reason} (value: {shown})")
    return ConfigError(f"{source}: invalid providers config:\n  " + "\n  ".join(lines))
