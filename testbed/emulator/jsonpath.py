"""The JSONPath subset CRD printer columns use: `.a.b`, `['a.b']`, `[0]`, `[-1]`, `[*]`, `..name`
and filters `[?(@.type=="Healthy")]` (==, !=, <, >, <=, >=, and bare existence `[?(@.x)]`).

The evaluator returns every match in document order; the Table printer shows the first, as the real
server's CRD table convertor does.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

Step = tuple[
    str, Any
]  # ("key", name) | ("index", i) | ("all", None) | ("filter", (path, op, value)) | ("deep", name)


class JsonPathError(ValueError):
    pass


@lru_cache(maxsize=256)
def parse(expr: str) -> tuple[Step, ...]:
    text = expr.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if text.startswith("$"):
        text = text[1:]
    steps: list[Step] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if text.startswith("..", i):
            m = re.match(r"\.\.([A-Za-z0-9_\-]+)", text[i:])
            if not m:
                raise JsonPathError(f"unsupported JSONPath {expr!r} at {i}")
            steps.append(("deep", m.group(1)))
            i += m.end()
        elif ch == ".":
            m = re.match(r"\.([A-Za-z0-9_\-/]+|\*)?", text[i:])
            assert m is not None
            if m.group(1) == "*":
                steps.append(("all", None))
            elif m.group(1):
                steps.append(("key", m.group(1)))
            i += m.end()
        elif ch == "[":
            end = _bracket_end(text, i, expr)
            inner = text[i + 1 : end].strip()
            steps.append(_bracket(inner, expr))
            i = end + 1
        else:
            raise JsonPathError(f"unsupported JSONPath {expr!r}: unexpected {ch!r} at {i}")
    return tuple(steps)


def _bracket_end(text: str, start: int, expr: str) -> int:
    depth, quote = 0, ""
    for j in range(start, len(text)):
        c = text[j]
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return j
    raise JsonPathError(f"unterminated [ in JSONPath {expr!r}")


def _bracket(inner: str, expr: str) -> Step:
    if inner == "*":
        return ("all", None)
    if re.fullmatch(r"-?\d+", inner):
        return ("index", int(inner))
    if inner[:1] in "'\"" and inner[-1:] == inner[:1]:
        return ("key", inner[1:-1])
    m = re.fullmatch(r"\?\(\s*@((?:\.[A-Za-z0-9_\-]+)+)\s*(?:(==|!=|<=|>=|<|>)\s*(.+?))?\s*\)", inner)
    if m:
        path = tuple(m.group(1)[1:].split("."))
        value = _literal(m.group(3), expr) if m.group(2) else None
        return ("filter", (path, m.group(2), value))
    raise JsonPathError(f"unsupported JSONPath {expr!r}: [{inner}]")


def _literal(text: str, expr: str) -> Any:
    text = text.strip()
    if text[:1] == "'" and text[-1:] == "'":
        return text[1:-1]
    try:
        return json.loads(text)
    except ValueError:
        raise JsonPathError(f"unsupported literal {text!r} in JSONPath {expr!r}") from None


_MISSING = object()


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for p in path:
        if not isinstance(obj, dict) or p not in obj:
            return _MISSING
        obj = obj[p]
    return obj


def _compare(left: Any, op: str, right: Any) -> bool:
    try:
        return (
            {"==": left == right, "!=": left != right}[op]
            if op in ("==", "!=")
            else {"<": left < right, ">": left > right, "<=": left <= right, ">=": left >= right}[op]
        )
    except TypeError:
        return False


def _deep(value: Any, name: str) -> list[Any]:
    out = []
    if isinstance(value, dict):
        if name in value:
            out.append(value[name])
        for v in value.values():
            out += _deep(v, name)
    elif isinstance(value, list):
        for v in value:
            out += _deep(v, name)
    return out


def evaluate(expr: str, document: Any) -> list[Any]:
    current = [document]
    for kind, arg in parse(expr):
        nxt: list[Any] = []
        for value in current:
            if kind == "key":
                if isinstance(value, dict) and arg in value:
                    nxt.append(value[arg])
            elif kind == "index":
                if isinstance(value, list) and -len(value) <= arg < len(value):
                    nxt.append(value[arg])
            elif kind == "all":
                if isinstance(value, list):
                    nxt += value
                elif isinstance(value, dict):
                    nxt += list(value.values())
            elif kind == "deep":
                nxt += _deep(value, arg)
            elif kind == "filter" and isinstance(value, list):
                path, op, lit = arg
                for item in value:
                    got = _get(item, path)
                    if got is _MISSING:
                        continue
                    if op is None or _compare(got, op, lit):
                        nxt.append(item)
        current = nxt
    return current
