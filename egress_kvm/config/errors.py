"""One error type for a bad providers file, with messages that name the field path and the value.

pydantic reports locations as tuples (`('providers', 0, 'kvm', 'hosts', 1, 'address')`); users read
YAML, so we print `providers[0].kvm.hosts[1].address` and the offending value next to the reason.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class ConfigError(ValueError):
    """The providers file (or a file it points at) is unusable; the message says where and why."""


def field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _reason(err: dict[str, Any]) -> str:
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
        if err.get("type") == "missing":
            lines.append(f"{path}: {reason}")
        else:
            lines.append(f"{path}: {reason} (value: {_short(err.get('input'))})")
    return ConfigError(f"{source}: invalid providers config:\n  " + "\n  ".join(lines))
