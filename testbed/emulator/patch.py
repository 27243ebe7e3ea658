"""The PATCH bodies the real server accepts: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a
strategic merge patch good enough for the kinds stored here.

Strategic merge: like merge patch, except lists of objects that all carry a `name` are merged by name
(that is the merge key of containers, volumes, env, ports... in the kinds kubectl applies here), the
`$patch: delete|replace` directives work on maps and named list items, and `$setElementOrder/<field>`
orders the merged list. Other `$` directives are dropped. Lists without names are replaced.
"""

from __future__ import annotations

import copy
from typing import Any

from testbed.emulator.errors import ApiError, bad_request


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}: must start with '/'")
    return [_unescape(t) for t in path[1:].split("/")]


def _walk(doc: Any, tokens: list[str], path: str) -> Any:
    for tok in tokens:
        if isinstance(doc, dict):
            if tok not in doc:
                raise _missing(path)
            doc = doc[tok]
        elif isinstance(doc, list):
            doc = doc[_index(doc, tok, path, allow_end=False)]
        else:
            raise _missing(path)
    return doc


def _missing(path: str) -> ApiError:
    return ApiError(
        422,
        "Invalid",
        f"the server rejected our request due to an error in our request: "
        f"jsonpatch: path {path!r} does not exist",
    )


def _index(lst: list[Any], tok: str, path: str, *, allow_end: bool) -> int:
    if allow_end and tok == "-":
        return len(lst)
    if not tok.isdigit():
        raise _missing(path)
    i = int(tok)
    if i > len(lst) or (i == len(lst) and not allow_end):
        raise _missing(path)
    return i


def json_patch(doc: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        # What the real server answers, e.g. to kubernetes-asyncio's custom-object patch with a dict body
        # and no _content_type (it picks application/json-patch+json).
        raise bad_request("json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise bad_request(f"json patch: invalid operation {op!r}")
        kind, path = op["op"], op.get("path", "")
        if kind in ("add", "replace", "test") and "value" not in op:
            raise bad_request(f"json patch: operation {kind!r} on {path!r} has no value")
        if kind == "test":
            if _walk(doc, _pointer(path), path) != op["value"]:
                raise ApiError(422, "Invalid", f"json patch: test failed at {path!r}")
            continue
        if kind in ("move", "copy"):
            src = op.get("from", "")
            value = copy.deepcopy(_walk(doc, _pointer(src), src))
            if kind == "move":
                doc = _remove(doc, _pointer(src), src)
            doc = _add(doc, _pointer(path), path, value)
        elif kind == "add":
            doc = _add(doc, _pointer(path), path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc = _remove(doc, _pointer(path), path)
        elif kind == "replace":
            doc = _remove(doc, _pointer(path), path)
            doc = _add(doc, _pointer(path), path, copy.deepcopy(op["value"]))
        else:
            raise bad_request(f"json patch: unknown operation {kind!r}")
    return doc


def _add(doc: Any, tokens: list[str], path: str, value: Any) -> Any:
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1], path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, path, allow_end=True), value)
    else:
        raise _missing(path)
    return doc


def _remove(doc: Any, tokens: list[str], path: str) -> Any:
    if not tokens:
        return None
    parent = _walk(doc, tokens[:-1], path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _missing(path)
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, path, allow_end=False)]
    else:
        raise _missing(path)
    return doc


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and _named(value) and _named(result.get(key)):
            result[key] = _merge_named(result.get(key) or [], value, orders.get(key))
        elif isinstance(value, list):
            result[key] = [
                strategic_merge_patch(None, v) if isinstance(v, dict) else copy.deepcopy(v)
                for v in value
                if not (isinstance(v, dict) and v.get("$patch") == "delete")
            ]
        else:
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _named(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and "name" in v for v in value)


def _merge_named(
    current: list[dict[str, Any]], patch: list[dict[str, Any]], order: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    by_name = {item["name"]: copy.deepcopy(item) for item in current}
    names = [item["name"] for item in current]
    for item in patch:
        name = item["name"]
        if item.get("$patch") == "delete":
            by_name.pop(name, None)
            continue
        by_name[name] = strategic_merge_patch(by_name.get(name), item)
        if name not in names:
            names.append(name)
    if order:
        wanted = [o.get("name") for o in order if isinstance(o, dict)]
        names = [n for n in wanted if n in by_name] + [n for n in names if n not in wanted]
    return [by_name[n] for n in names if n in by_name]
