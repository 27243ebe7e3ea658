"""labelSelector and fieldSelector, parsed and matched as the real server does.

Field selectors are limited per kind, as on a real server (`field label not supported` otherwise):
every kind takes metadata.name and metadata.namespace; Events add the involvedObject.* fields that
`kubectl describe` sends; Secrets `type`; Namespaces `status.phase`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from testbed.emulator.errors import bad_request

Obj = dict[str, Any]
Matcher = Callable[[Obj], bool]

_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)
FIELDS_BY_KIND: dict[str, tuple[str, ...]] = {
    "Event": _EVENT_FIELDS,
    "Secret": ("type",),
    "Namespace": ("status.phase",),
}


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses (`env in (a,b),tier`)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


_SET = re.compile(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$")


def label_matcher(selector: str | None) -> Matcher:
    if not selector:
        return lambda obj: True
    tests: list[Matcher] = []
    for req in _split_top(selector):
        tests.append(_label_requirement(req))
    return lambda obj: all(t((obj.get("metadata") or {}).get("labels") or {}) for t in tests)


def _label_requirement(req: str) -> Callable[[dict[str, str]], bool]:
    m = _SET.match(req)
    if m:
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: key not in labels or labels[key] not in values
    for op in ("!=", "==", "="):
        if op in req:
            key, value = (s.strip() for s in req.split(op, 1))
            _check_key(key, req)
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if req.startswith("!"):
        key = req[1:].strip()
        _check_key(key, req)
        return lambda labels: key not in labels
    _check_key(req, req)
    return lambda labels: req in labels


def _check_key(key: str, req: str) -> None:
    if not key or not re.fullmatch(r"([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", key):
        raise bad_request(f"unable to parse requirement: {req!r}: invalid label key {key!r}")


def _field_value(obj: Obj, path: str) -> str:
    if path == "source":
        return ((obj.get("source") or {}).get("component")) or ""
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return ""
    return cur if isinstance(cur, str) else str(cur)


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def field_matcher(selector: str | None, *, kind: str) -> Matcher:
    if not selector:
        return lambda obj: True
    allowed = ("metadata.name", "metadata.namespace", *FIELDS_BY_KIND.get(kind, ()))
    tests: list[Matcher] = []
    for req in re.split(r"(?<!\\),", selector):
        req = req.strip()
        if not req:
            continue
        m = re.match(r"^([^!=]+?)\s*(!=|==|=)\s*(.*)$", req)
        if not m:
            raise bad_request(f"invalid field selector: {req!r}: expected KEY=VALUE or KEY!=VALUE")
        key, op, value = m.group(1).strip(), m.group(2), _unescape(m.group(3))
        if key not in allowed:
            raise bad_request(f"field label not supported: {key}")
        if op == "!=":
            tests.append(lambda obj, k=key, v=value: _field_value(obj, k) != v)
        else:
            tests.append(lambda obj, k=key, v=value: _field_value(obj, k) == v)
    return lambda obj: all(t(obj) for t in tests)
