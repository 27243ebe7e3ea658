"""A CRD's openAPIV3Schema applied as the real server applies it: default, prune, validate.

Order as in the apiserver: defaults are filled where a property is absent (only inside objects that are
present), unknown fields are pruned (reported so `fieldValidation=Strict` can refuse them and `Warn` can
warn), then the object is validated. Error wording copies apiextensions-apiserver's so a test written
here reads the same against a real cluster (`spec.port: Invalid value: 70000: spec.port in body should
be less than or equal to 65535`). CEL rules (`x-kubernetes-validations`) are checked in the subset
`cel.py` implements (rules outside it are refused when the CRD is created, never skipped). Not
implemented: oneOf/anyOf/allOf/not, formats other than their type, `x-kubernetes-int-or-string` beyond
accepting both types.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Set as AbstractSet
from typing import Any

from testbed.emulator import cel
from testbed.emulator.errors import FieldError

Schema = dict[str, Any]
_META_KEYS = ("apiVersion", "kind", "metadata")


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def apply_defaults(value: Any, schema: Schema | None) -> None:
    """Fill `default:` values in place, recursing into present objects, array items and maps."""
    if not schema:
        return
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                apply_defaults(value[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, sub_value in value.items():
                if key not in props:
                    apply_defaults(sub_value, extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(item, schema["items"])


def lacks_defaults(value: Any, schema: Schema | None) -> bool:
    """Whether `apply_defaults` would change `value` (it is not changed here): a stored object was
    defaulted when written, so reading it back usually needs no copy to default."""
    if not schema:
        return False
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value:
                if "default" in sub:
                    return True
            elif lacks_defaults(value[key], sub):
                return True
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, sub_value in value.items():
                if key not in props and lacks_defaults(sub_value, extra):
                    return True
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return any(lacks_defaults(item, schema["items"]) for item in value)
    return False


def prune(value: Any, schema: Schema | None, path: str = "", *, root: bool = False) -> list[str]:
    """Drop fields the schema does not declare (unless x-kubernetes-preserve-unknown-fields). Returns
    the dropped paths, in the form the server reports them (`spec.foo`)."""
    if not schema or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    dropped: list[str] = []
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key in list(value):
            if root and key in _META_KEYS:
                continue
            if key in props:
                dropped += prune(value[key], props[key], _child(path, key))
            elif isinstance(extra, dict):
                dropped += prune(value[key], extra, _child(path, key))
            elif extra is True:
                continue
            else:
                del value[key]
                dropped.append(_child(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            dropped += prune(item, schema["items"], f"{path}[{i}]")
    return dropped


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(value: Any, want: str) -> bool:
    got = _type_name(value)
    return got == want or (want == "number" and got == "integer")


def validate(value: Any, schema: Schema | None, path: str = "", *,
             valid_keys: AbstractSet[str] = frozenset()) -> list[FieldError]:
    """All violations of `schema` in `value`, each with its field path. `valid_keys`: fields of the object
    `value` known to hold no violation (equal to those of an object that validated against this very
    schema: validation is a function of value, schema and path), not validated again; the object's own
    checks (type, rules, required fields...) still run."""
    if not schema:
        return []
    errs: list[FieldError] = []
    if value is None:
        if schema.get("nullable"):
            return []
        if schema.get("type"):
            return [
                FieldError(
                    "Invalid", path, "null", f'{path} in body must be of type {schema["type"]}: "null"'
                )
            ]
        return []
    want = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not (_type_ok(value, "integer") or _type_ok(value, "string")):
            errs.append(
                FieldError(
                    "Invalid",
                    path,
                    _type_name(value),
                    f'{path} in body must be of type integer or string: "{_type_name(value)}"',
                )
            )
            return errs
    elif want and not _type_ok(value, want):
        return [
            FieldError(
                "Invalid",
                path,
                _type_name(value),
                f'{path} in body must be of type {want}: "{_type_name(value)}"',
            )
        ]

    errs += _rules(value, schema, path, want or _type_name(value))

    if "enum" in schema and value not in schema["enum"]:
        errs.append(FieldError("NotSupported", path, value, supported=tuple(schema["enum"])))

    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errs.append(
                FieldError("TooLong", path, value, f"may not be more than {schema['maxLength']} bytes")
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            errs.append(
                FieldError(
                    "Invalid",
                    path,
                    value,
                    f"{path} in body should be at least {schema['minLength']} chars long",
                )
            )
        if "pattern" in schema and not re.search(_go_anchors(schema["pattern"]), value):
            errs.append(
                FieldError("Invalid", path, value, f"{path} in body should match '{schema['pattern']}'")
            )
    elif isinstance(value, int | float) and not isinstance(value, bool):
        errs += _numeric(value, schema, path)
    elif isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errs.append(
                FieldError("TooMany", path, len(value), f"must have at most {schema['maxItems']} items")
            )
        if "minItems" in schema and len(value) < schema["minItems"]:
            errs.append(
                FieldError(
                    "Invalid",
                    path,
                    len(value),
                    f"{path} in body should have at least {schema['minItems']} items",
                )
            )
        errs += _duplicates(value, schema, path)
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                errs += validate(item, items, f"{path}[{i}]")
    elif isinstance(value, dict):
        errs += _object(value, schema, path, valid_keys)
    return errs


def _duplicates(value: list[Any], schema: Schema, path: str) -> list[FieldError]:
    """`x-kubernetes-list-type: map` (unique by its map keys) and `set` (unique values), as the real
    server refuses them: `status.conditions[1]: Duplicate value: map[string]interface {}{"type":"Ready"}`."""
    kind = schema.get("x-kubernetes-list-type")
    if kind not in ("map", "set"):
        return []
    keys = list(schema.get("x-kubernetes-list-map-keys") or [])
    seen: list[Any] = []
    errs = []
    for i, item in enumerate(value):
        ident = {k: item.get(k) for k in keys} if kind == "map" and isinstance(item, dict) else item
        if ident in seen:
            shown = ("map[string]interface {}" + json.dumps(ident, separators=(",", ":"), sort_keys=True)
                     if isinstance(ident, dict) else ident)
            errs.append(FieldError("Duplicate", f"{path}[{i}]", shown))
        else:
            seen.append(ident)
    return errs


def _rules(value: Any, schema: Schema, path: str, type_name: str) -> list[FieldError]:
    """`x-kubernetes-validations`: each failing rule is `<path>: Invalid value: "<type>": <message>`, as
    the real server reports it (`failed rule: <rule>` without a message)."""
    errs = []
    for rule in schema.get("x-kubernetes-validations") or []:
        text = str(rule.get("rule", ""))
        try:
            ok = cel.check(text, value)
            detail = "" if ok else str(rule.get("message") or f"failed rule: {text}")
        except cel.CelError as e:
            ok, detail = False, f"{text}: {e}"
        if not ok:
            errs.append(FieldError("Invalid", path, type_name, detail))
    return errs


def _numeric(value: float, schema: Schema, path: str) -> list[FieldError]:
    errs = []
    if "maximum" in schema:
        if schema.get("exclusiveMaximum") and value >= schema["maximum"]:
            errs.append(
                FieldError("Invalid", path, value, f"{path} in body should be less than {schema['maximum']}")
            )
        elif value > schema["maximum"]:
            errs.append(
                FieldError(
                    "Invalid",
                    path,
                    value,
                    f"{path} in body should be less than or equal to {schema['maximum']}",
                )
            )
    if "minimum" in schema:
        if schema.get("exclusiveMinimum") and value <= schema["minimum"]:
            errs.append(
                FieldError(
                    "Invalid", path, value, f"{path} in body should be greater than {schema['minimum']}"
                )
            )
        elif value < schema["minimum"]:
            errs.append(
                FieldError(
                    "Invalid",
                    path,
                    value,
                    f"{path} in body should be greater than or equal to {schema['minimum']}",
                )
            )
    if schema.get("multipleOf") and value % schema["multipleOf"]:
        errs.append(
            FieldError(
                "Invalid", path, value, f"{path} in body should be a multiple of {schema['multipleOf']}"
            )
        )
    return errs


def _object(value: dict[str, Any], schema: Schema, path: str,
            valid_keys: AbstractSet[str] = frozenset()) -> list[FieldError]:
    errs = []
    props = schema.get("properties") or {}
    for req in schema.get("required") or []:
        if req not in value:
            errs.append(FieldError("Required", _child(path, req)))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errs.append(
            FieldError("TooMany", path, len(value), f"must have at most {schema['maxProperties']} items")
        )
    extra = schema.get("additionalProperties")
    for key, sub_value in value.items():
        if key in valid_keys:
            continue
        if key in props:
            if path == "" and key == "metadata":
                continue  # ObjectMeta is validated by the server itself, not by the CRD schema
            errs += validate(sub_value, props[key], _child(path, key))
        elif isinstance(extra, dict):
            errs += validate(sub_value, extra, _child(path, key))
        elif extra is False:
            errs.append(FieldError("Forbidden", _child(path, key), detail="field not declared in schema"))
    return errs


def check_root_metadata(schema: Schema | None, path: str) -> list[FieldError]:
    """The root's `metadata` may say only `type: object` and restrict `name`/`generateName`: the real
    server refuses anything else there (even a description), since metadata is ObjectMeta."""
    meta = ((schema or {}).get("properties") or {}).get("metadata")
    if not isinstance(meta, dict):
        return []
    extra = {k for k in meta if k not in ("type", "properties")}
    names = set(meta.get("properties") or {})
    if extra or not names <= {"name", "generateName"} or meta.get("type", "object") != "object":
        return [FieldError("Forbidden", f"{path}.properties[metadata]",
                           detail="must not specify anything other than name and generateName, but metadata "
                                  "is implicitly specified")]
    return []


def check_crd_schema(schema: Schema | None, path: str) -> list[FieldError]:
    """The structural-schema rules a real server enforces when a CRD is created, as far as they bite
    typical hand-written CRDs: `additionalProperties` next to `properties` (forbidden, apiextensions
    v1), `properties`/`items` on the wrong type, a missing type."""
    if not isinstance(schema, dict):
        return []
    errs: list[FieldError] = []
    props = schema.get("properties") or {}
    if "additionalProperties" in schema and props:
        errs.append(
            FieldError(
                "Forbidden",
                f"{path}.additionalProperties",
                detail="additionalProperties and properties are mutual exclusive",
            )
        )
    if (
        not schema.get("type")
        and not schema.get("x-kubernetes-int-or-string")
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        errs.append(
            FieldError("Required", f"{path}.type", detail="must not be empty for specified object fields")
        )
    for i, rule in enumerate(schema.get("x-kubernetes-validations") or []):
        text = rule.get("rule") if isinstance(rule, dict) else None
        where = f"{path}.x-kubernetes-validations[{i}].rule"
        if not isinstance(text, str) or not text.strip():
            errs.append(FieldError("Required", where))
            continue
        try:
            cel.compile_rule(text)
        except cel.CelError as e:
            errs.append(FieldError("Invalid", where, text,
                                   f"compilation failed: {e} (the emulator implements a CEL subset)"))
    if props and schema.get("type") not in (None, "object"):
        errs.append(FieldError("Invalid", f"{path}.type", schema.get("type"), "must be object"))
    for key, sub in props.items():
        if path.endswith("openAPIV3Schema") and key == "metadata":
            continue
        errs += check_crd_schema(sub, f"{path}.properties[{key}]")
    if isinstance(schema.get("items"), dict):
        errs += check_crd_schema(schema["items"], f"{path}.items")
    if isinstance(schema.get("additionalProperties"), dict):
        errs += check_crd_schema(schema["additionalProperties"], f"{path}.additionalProperties")
    return errs


def _go_anchors(pattern: str) -> str:
    """The API server matches patterns with Go's RE2, where a final `$` is the end of the text; in
    Python's `re` it also matches before a trailing newline, which would let "x\n" pass `^x$`."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        return pattern[:-1] + r"\Z"
    return pattern
