"""Field ownership (`metadata.managedFields`) and server-side apply, as the real server's field manager
does it where kubectl and a controller can observe it.

A field set is a set of paths; a path is a tuple of structured-merge-diff's elements: `f:<field>`,
`k:{"type":"Ready"}` (an item of a map list, by its keys), `v:<json>` (an item of a set list). A path
that is a prefix of another in the same set is a member (serialized with `.`), as the real server
writes `fieldsV1`. Lists follow the CRD schema's `x-kubernetes-list-type` (`map` with its
`x-kubernetes-list-map-keys`, `set`, else atomic); for built-ins, which have no schema here, lists of
objects that all carry a `name` are maps keyed by name, `metadata.finalizers` is a set and
`metadata.ownerReferences` a map keyed by uid.

- Every write records who changed what: create, update and the non-apply patches give the writer (the
  `fieldManager` parameter, else the User-Agent's product, as the real server) the fields whose values
  it changed, operation `Update`, and take them from everyone else.
- Apply (`application/apply-patch+yaml`) makes the applied configuration's fields the manager's
  `Apply` set, merges it into the object (map lists by key), removes fields this manager applied
  before and no longer applies (unless someone else owns them), and refuses, 409 Conflict with one
  `FieldManagerConflict` cause per field, to change a value another manager owns, unless `force=true`,
  which takes the field over.
- Status writes are recorded with `subresource: status`.
- A non-apply write may set `metadata.managedFields` itself (`sent_ownership`): a list that decodes
  replaces the stored one, an empty list (or one empty entry) clears it, and the write's own change is
  then recorded on top; absent or null, or on a subresource, the stored list stays. One that ObjectMeta
  cannot hold at all is refused before that (`sent_shape_error`). An apply that carries the field is
  refused (`applied_ownership_error`). Unlike the real server, an entry with an empty manager is dropped
  and entries lose fields the object lacks (docs/emulator.md says why that is left).
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from functools import lru_cache
from typing import Any

from testbed.emulator.errors import ApiError
from testbed.emulator.store import clone, same_json

Obj = dict[str, Any]
Path = tuple[str, ...]
MISSING: Any = object()
# Never owned: identity and server-set metadata (the real server strips these from field sets too).
_SKIP_META = {"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
              "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields"}


class Operation(Enum):
    APPLY = "Apply"
    UPDATE = "Update"


@dataclass
class Entry:
    manager: str
    operation: Operation
    api_version: str
    subresource: str = ""
    time: str = ""
    paths: set[Path] = field(default_factory=set)

    @property
    def ident(self) -> tuple[str, Operation, str]:
        return (self.manager, self.operation, self.subresource)

    def shown(self) -> str:
        """How a conflict names the manager (apiserver's printManager)."""
        text = json.dumps(self.manager)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        if self.operation is Operation.UPDATE:
            text += f" using {self.api_version}"
        return text


def manager_from_user_agent(user_agent: str) -> str:
    """The real server's default manager: the User-Agent up to its first `/`, at most 128 characters."""
    return (user_agent.split("/", 1)[0] or "unknown")[:128]


# --- field sets -------------------------------------------------------------------------------------


def _child_schema(schema: Obj | None, name: str) -> Obj | None:
    if not isinstance(schema, dict):
        return None
    props = schema.get("properties") or {}
    if name in props:
        return props[name]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _list_keys(schema: Obj | None, path: Path, value: list[Any]) -> list[str] | str | None:
    """Map keys for a map list, "set" for a set list, None for an atomic list."""
    if isinstance(schema, dict) and "x-kubernetes-list-type" in schema:
        kind = schema["x-kubernetes-list-type"]
        if kind == "map":
            return list(schema.get("x-kubernetes-list-map-keys") or [])
        return "set" if kind == "set" else None
    if path == ("f:metadata", "f:finalizers"):
        return "set"
    if path == ("f:metadata", "f:ownerReferences"):
        return ["uid"]
    if schema is None and value and all(isinstance(v, dict) and "name" in v for v in value):
        return ["name"]  # a built-in's named list (containers, env, volumes...), as its strategic merge key
    return None


def _key_element(item: Obj, keys: list[str]) -> str:
    return "k:" + json.dumps({k: item.get(k) for k in keys}, separators=(",", ":"), sort_keys=True)


def _walk(value: Any, schema: Obj | None, path: Path, out: set[Path], holders: set[Path]) -> None:
    """Adds the paths `value` sets under `path` to `out`, and those that hold others to `holders`."""
    if isinstance(value, dict) and value:
        if path:
            out.add(path)
            holders.add(path)
        for k, v in value.items():
            _walk(v, _child_schema(schema, k), (*path, f"f:{k}"), out, holders)
        return
    if isinstance(value, list) and value:
        keys = _list_keys(schema, path, value)
        item_schema = schema.get("items") if isinstance(schema, dict) else None
        if keys == "set":
            out.add(path)
            holders.add(path)
            for v in value:
                out.add((*path, "v:" + json.dumps(v, separators=(",", ":"), sort_keys=True)))
            return
        if isinstance(keys, list) and keys and all(isinstance(v, dict) for v in value):
            out.add(path)
            holders.add(path)
            for item in value:
                element = (*path, _key_element(item, keys))
                out.add(element)
                if item:
                    holders.add(element)
                for k, v in item.items():
                    _walk(v, _child_schema(item_schema, k), (*element, f"f:{k}"), out, holders)
            return
    out.add(path)  # a scalar, an empty object or list, an atomic list


def field_set(obj: Obj, schema: Obj | None, *, subresource: str = "",
              status_subresource: bool = False, out: set[Path] | None = None,
              holders: set[Path] | None = None) -> set[Path]:
    """Every path the object sets, without identity and server-set metadata; with a status subresource,
    only `.status` for a status write and everything but `.status` for a write to the main resource.
    With `out`, the paths are added to it (and it is returned); with `holders`, the paths that are a
    prefix of another (`out` less them is `_leaves(out)`) are added to that."""
    if out is None:
        out = set()
    if holders is None:
        holders = set()
    for k, v in _part_content(obj, subresource, status_subresource).items():
        if k == "metadata" and isinstance(v, dict):
            if v:
                _walk(v, None, ("f:metadata",), out, holders)
            continue
        _walk(v, _child_schema(schema, k), (f"f:{k}",), out, holders)
    return out


@dataclass(frozen=True)
class _Part:
    """The field set of one part of an object (the main resource or its status, or all of it without a
    status subresource), and its leaves (paths no other path extends)."""

    paths: frozenset[Path]
    leaves: frozenset[Path]


_PARTS_MAX = 4096
# Parts of recently recorded objects, by the object's and schema's identity (both held, so their ids are
# not reused while here): the object a write stores is the next write's old object, whose fields would
# otherwise be walked again. Only for objects never changed in place once recorded: stored ones.
_parts: OrderedDict[tuple[int, int, str, bool], tuple[Obj, Obj | None, _Part]] = OrderedDict()


def _part(obj: Obj, schema: Obj | None, subresource: str, status_subresource: bool) -> _Part:
    key = (id(obj), id(schema), subresource, status_subresource)
    hit = _parts.get(key)
    if hit is not None and hit[0] is obj and hit[1] is schema:
        return hit[2]
    holders: set[Path] = set()
    paths = field_set(obj, schema, subresource=subresource, status_subresource=status_subresource,
                      holders=holders)
    part = _Part(frozenset(paths), frozenset(paths - holders))
    _remember(obj, schema, subresource, status_subresource, part)
    return part


def _remember(obj: Obj, schema: Obj | None, subresource: str, status_subresource: bool, part: _Part) -> None:
    _parts[(id(obj), id(schema), subresource, status_subresource)] = (obj, schema, part)
    if len(_parts) > _PARTS_MAX:
        _parts.popitem(last=False)


def _leaves(paths: set[Path]) -> set[Path]:
    prefixes = {p[:i] for p in paths for i in range(1, len(p))}
    return {p for p in paths if p not in prefixes}


def _keyed(item: Any, keys: Obj) -> bool:
    """Whether a map list's item is the one these key values name."""
    return isinstance(item, dict) and all(item.get(k) == v for k, v in keys.items())


@lru_cache(maxsize=4096)
def _map_keys(rest: str) -> Obj:
    """A `k:` element's key values, parsed once per text; callers only read the dict (_set copies it)."""
    parsed: Obj = json.loads(rest)
    return parsed


def _step(cur: Any, element: str) -> Any:
    """One element of `value_at`: the value under `cur`, or MISSING."""
    kind, _, rest = element.partition(":")
    if kind == "f" and isinstance(cur, dict) and rest in cur:
        return cur[rest]
    if kind == "k" and isinstance(cur, list):
        keys = _map_keys(rest)
        return next((i for i in cur if _keyed(i, keys)), MISSING)
    if kind == "v" and isinstance(cur, list):
        v = json.loads(rest)  # parsed afresh: the value itself is returned
        return v if v in cur else MISSING
    return MISSING


def value_at(obj: Any, path: Path) -> Any:
    cur = obj
    for element in path:
        cur = _step(cur, element)
        if cur is MISSING:
            return MISSING
    return cur


def values_at(obj: Any, paths: list[Path]) -> dict[Path, Any]:
    """`value_at` for many paths in one pass: each prefix is looked up once (a status write compares
    every leaf of its conditions, which share their prefixes)."""
    memo: dict[Path, Any] = {(): obj}

    def at(path: Path) -> Any:
        found = memo.get(path, memo)
        if found is not memo:
            return found
        parent = at(path[:-1])
        found = MISSING if parent is MISSING else _step(parent, path[-1])
        memo[path] = found
        return found

    return {p: at(p) for p in paths}


# --- fieldsV1 ------------------------------------------------------------------------------------------


def to_fields_v1(paths: set[Path]) -> Obj:
    """The fieldsV1 tree of a field set, as a fresh copy the caller may change."""
    tree: Obj = clone(shared_fields_v1(frozenset(paths)))
    return tree


_TREES_MAX = 1024
# Each distinct field set's fieldsV1 tree, built once (building sorts all its paths) and shared by every
# stored entry with that set (every Proxy's status entry has the same one), and the way back from such a
# tree (by identity; the entry holds the tree, so its id is not reused while it is here) to its set.
_trees: dict[frozenset[Path], Obj] = {}
_tree_paths: dict[int, tuple[Obj, frozenset[Path]]] = {}


def shared_fields_v1(paths: frozenset[Path]) -> Obj:
    """The fieldsV1 tree of `paths`, shared: only for stored objects, which are never changed in place
    (store.py); whatever hands one out to a caller that may change it copies it first."""
    tree = _trees.get(paths)
    if tree is None:
        tree = _fields_tree(paths)
        if len(_trees) >= _TREES_MAX:
            evicted = _trees.pop(next(iter(_trees)))
            _tree_paths.pop(id(evicted), None)
        _trees[paths] = tree
        _tree_paths[id(tree)] = (tree, paths)
    return tree


def _fields_tree(paths: frozenset[Path]) -> Obj:
    tree: Obj = {}
    prefixes = {p[:i] for p in paths for i in range(1, len(p))}
    for p in sorted(paths):
        node = tree
        for element in p:
            node = node.setdefault(element, {})
        if p in prefixes:
            node["."] = {}
    return tree


def _paths_of(tree: Obj) -> set[Path]:
    """`from_fields_v1` of a stored entry's tree; a tree `shared_fields_v1` built is not parsed again."""
    hit = _tree_paths.get(id(tree))
    if hit is not None and hit[0] is tree:
        return set(hit[1])
    return from_fields_v1(tree)


def from_fields_v1(tree: Obj, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for element, sub in (tree or {}).items():
        if element == ".":
            out.add(prefix)
            continue
        if _path_element(element) is None:
            continue  # no known path element type: structured-merge-diff drops it
        path = (*prefix, element)
        if not sub or set(sub) == {"."}:
            out.add(path)
        else:
            out |= from_fields_v1(sub, path)
    return out


def entries(meta: Obj) -> list[Entry]:
    out = []
    for m in meta.get("managedFields") or []:
        if not isinstance(m, dict) or not m.get("manager"):
            continue
        try:
            op = Operation(m.get("operation", "Update"))
        except ValueError:
            continue
        out.append(Entry(m["manager"], op, m.get("apiVersion", ""), m.get("subresource", ""),
                         m.get("time", ""), _paths_of(m.get("fieldsV1") or {})))
    return out


def serialize(items: list[Entry], *, shared: bool = False) -> list[Obj]:
    """managedFields as stored. `shared`: the fieldsV1 trees are `shared_fields_v1`'s, not copies: only
    for a list that goes into a stored object (see `record`)."""
    out = []
    for e in items:
        tree = shared_fields_v1(frozenset(e.paths)) if shared else to_fields_v1(e.paths)
        m: Obj = {"manager": e.manager, "operation": e.operation.value, "apiVersion": e.api_version,
                  "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": tree}
        if e.subresource:
            m["subresource"] = e.subresource
        out.append(m)
    return out


# --- ownership a request sets itself ---------------------------------------------------------------

_ENTRY_KEYS = ("manager", "operation", "apiVersion", "time", "fieldsType", "fieldsV1", "subresource")


def _empty_entry(m: Any) -> bool:
    """An entry with every field at its zero value (`[{}]`: the documented way to clear the list; a null
    entry decodes as one). An empty string is no zero time (a write carrying one is refused before,
    `sent_shape_error`) and no empty fieldsV1: the apiserver's field manager cannot read such an entry,
    so the list is not a reset but ignored (the stored list stays)."""
    return m is None or (isinstance(m, dict) and all(
        m.get(k) is None or (m.get(k) == "" and k not in ("time", "fieldsV1")) for k in _ENTRY_KEYS))


_STRING_KEYS = ("manager", "operation", "apiVersion", "fieldsType", "subresource")


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object" if isinstance(value, dict) else "null"


def sent_shape_error(sent: Any) -> str | None:
    """Why `metadata.managedFields` as a write sends it cannot be read into ObjectMeta at all (None: it
    can), naming the field. The real server decodes the whole body (for a patch: the patched object) into
    ObjectMeta before any field manager sees it, and json refuses a list that is no list of objects, a
    string field that is not a string, and a `time` metav1.Time cannot parse; what `fieldsV1` holds is
    read later (a raw value here), so a fieldsV1 that is no field set is `sent_ownership`'s to ignore."""
    if sent is None:
        return None
    if not isinstance(sent, list):
        return f"metadata.managedFields: expected an array of entries, got {_json_type(sent)}"
    for i, m in enumerate(sent):
        if m is None:
            continue  # null: an entry of zero values
        if not isinstance(m, dict):
            return f"metadata.managedFields[{i}]: expected an object, got {_json_type(m)}"
        for k in _STRING_KEYS:
            if m.get(k) is not None and not isinstance(m[k], str):
                return f"metadata.managedFields[{i}].{k}: expected a string, got {_json_type(m[k])}"
        if m.get("time") is not None and not _rfc3339(m["time"]):
            return f"metadata.managedFields[{i}].time: {json.dumps(m['time'])} is no RFC 3339 time"
    return None


def _rfc3339(value: Any) -> bool:
    """Whether metav1.Time reads `value` (RFC 3339: a date, a time and a zone)."""
    if not isinstance(value, str) or "T" not in value.upper():
        return False
    try:
        return datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        return False


def _path_element(key: str) -> bool | None:
    """structured-merge-diff's reading of one fieldsV1 key: True for a well-formed `f:`, `k:` (a JSON
    object), `v:` (a JSON value) or `i:` (an index); False for a malformed one (the set does not
    decode); None for a key of no known type, which it drops."""
    kind, sep, rest = key.partition(":")
    if not sep or kind not in ("f", "k", "v", "i"):
        return None
    if kind == "f":
        return True
    if kind == "i":
        return rest.removeprefix("-").isdigit()
    try:
        value = json.loads(rest)
    except ValueError:
        return False
    return kind == "v" or isinstance(value, dict)


def _fields_v1_decodes(tree: Any) -> bool:
    """Whether a fieldsV1 value decodes as a field set: null, or a map of path elements to such values
    (`.`, the node itself, and keys of no known type are skipped whatever their value)."""
    if tree is None:
        return True
    if not isinstance(tree, dict):
        return False
    for key, sub in tree.items():
        if key == "." or _path_element(key) is None:
            continue
        if not _path_element(key) or not _fields_v1_decodes(sub):
            return False
    return True


def _decodes(m: Any) -> bool:
    """Whether the real server's DecodeManagedFields takes this entry (operation Apply or Update, an
    apiVersion, fieldsType FieldsV1, a fieldsV1 that decodes, a time it can read); one that does not
    makes it fall back to the stored list."""
    return (isinstance(m, dict) and m.get("operation") in (Operation.APPLY.value, Operation.UPDATE.value)
            and isinstance(m.get("apiVersion"), str) and bool(m["apiVersion"])
            and m.get("fieldsType") == "FieldsV1" and _fields_v1_decodes(m.get("fieldsV1"))
            and all(isinstance(m.get(k), str | None) for k in ("manager", "subresource"))
            and (m.get("time") is None or _rfc3339(m["time"])))


def sent_ownership(sent: Any, *, subresource: str) -> list[Obj] | None:
    """The managedFields a create, update or non-apply patch is recorded on top of, given what the
    request's object carries in `metadata.managedFields` (`sent`, None when absent or null): None keeps
    the stored list; [] clears it; a list is taken as sent. As the apiserver's field manager decides
    (k8s.io/apimachinery/pkg/util/managedfields/internal/fieldmanager.go: decodeLiveOrNew,
    isResetManagedFields): a subresource write never sets ownership; a non-nil empty list or a list of
    one empty entry is a reset; a list that does not decode, or decodes to no manager, is ignored so
    that clients unaware of the field cannot clear it by accident."""
    if subresource or not isinstance(sent, list):
        return None
    if not sent or (len(sent) == 1 and _empty_entry(sent[0])):
        return []
    if not all(_decodes(m) for m in sent):
        return None
    return sent


def applied_ownership_error(applied_meta: Obj) -> ApiError | None:
    """An applied configuration may not carry managedFields (the server owns them): 400, as the
    apiserver's structuredMergeManager.Apply answers any non-nil list."""
    if isinstance(applied_meta.get("managedFields"), list):
        return ApiError(400, "BadRequest", "metadata.managedFields must be nil")
    return None


# --- the two operations -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """Who writes and how; `applied` is the applied configuration's field set for an Apply."""

    manager: str
    operation: Operation = Operation.UPDATE
    subresource: str = ""
    applied: frozenset[Path] = frozenset()
    taken: frozenset[Path] = frozenset()  # fields an Apply with force took from other managers
    # managedFields a create, update or patch set itself (`sent_ownership`; kubectl's client-side to
    # server-side apply migration patches them): the ownership the change is recorded on top of, instead
    # of the stored one. None: the stored one.
    base: list[Obj] | None = field(default=None, compare=False)


def conflicts(live: Obj, applied: Obj, applied_paths: set[Path], owners: list[Entry], *, manager: str,
              subresource: str) -> list[tuple[Entry, Path]]:
    """Fields the applied configuration sets to another value than the live one, owned by someone else."""
    found = []
    for path in sorted(_leaves(applied_paths)):
        live_value = value_at(live, path)
        if live_value is MISSING or live_value == value_at(applied, path):
            continue
        for e in owners:
            if (e.manager, e.operation, e.subresource) == (manager, Operation.APPLY, subresource):
                continue
            if path in e.paths:
                found.append((e, path))
    return found


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def last_applied_fields(live: Obj, schema: Obj | None) -> set[Path]:
    """The fields of the client-side apply annotation: those a `kubectl` apply may take without conflict."""
    text = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    try:
        last = json.loads(text) if text else None
    except ValueError:
        return set()
    return field_set(last, schema) if isinstance(last, dict) else set()


def conflict_error(found: list[tuple[Entry, Path]]) -> ApiError:
    """409 as apiserver's NewConflictError words it."""
    causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {e.shown()}",
               "field": path_text(p)} for e, p in found]
    if len(found) == 1:
        e, p = found[0]
        message = f"Apply failed with 1 conflict: conflict with {e.shown()}: {path_text(p)}"
    else:
        by_manager: dict[str, list[str]] = {}
        for e, p in found:
            by_manager.setdefault(e.shown(), []).append(path_text(p))
        lines = []
        for shown in sorted(by_manager):
            lines.append(f"conflicts with {shown}:")
            lines += [f"- {p}" for p in by_manager[shown]]
        message = f"Apply failed with {len(found)} conflicts: " + "\n".join(lines)
    return ApiError(409, "Conflict", message, {"causes": causes})


def path_text(path: Path) -> str:
    """structured-merge-diff's Path.String(): `.spec.port`, `.status.conditions[type="Ready"]`."""
    out = ""
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f":
            out += f".{rest}"
        elif kind == "k":
            out += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(rest).items()) + "]"
        else:
            out += f"[={rest}]"
    return out


@dataclass(frozen=True)
class Dropped:
    """What an Apply removes: `fields` (leaves and list items this manager applied before, applies no
    more, and nobody else owns), and `holders`, objects that held such fields, removed once empty."""

    fields: frozenset[Path]
    holders: frozenset[Path]


def dropped_paths(before: set[Path], applied: set[Path], others: set[Path]) -> Dropped:
    kept = applied | others
    leaves = _leaves(before)
    gone = {p for p in before - kept if p in leaves or p[-1][:2] in ("k:", "v:")}
    holders = {p for p in before - kept - gone if len(p) > 1}
    return Dropped(frozenset(gone), frozenset(holders))


def merge_applied(live: Obj, applied: Obj, *, applied_paths: set[Path], dropped: Dropped) -> Obj:
    """The live object with the applied configuration's fields set, and what `dropped` says removed."""
    out = copy.deepcopy(live)
    for path in sorted(_leaves(applied_paths), key=len):
        _set(out, path, copy.deepcopy(value_at(applied, path)))
    for path in sorted(dropped.fields, key=len, reverse=True):
        _remove(out, path)
    for path in sorted(dropped.holders, key=len, reverse=True):
        if value_at(out, path) in ({}, []):
            _remove(out, path)
    return out


def _set(obj: Obj, path: Path, value: Any) -> None:
    cur: Any = obj
    for i, element in enumerate(path):
        last = i == len(path) - 1
        kind, _, rest = element.partition(":")
        if kind == "f":
            if last:
                cur[rest] = value
                return
            nxt = path[i + 1]
            if rest not in cur or not isinstance(cur[rest], dict | list):
                cur[rest] = [] if nxt[0] in "kv" else {}
            cur = cur[rest]
        elif kind == "k":
            keys = _map_keys(rest)
            item = next((x for x in cur if _keyed(x, keys)), None)
            if item is None:
                item = dict(keys)
                cur.append(item)
            if last:
                item.clear()
                item.update(value)
                return
            cur = item
        else:
            v = json.loads(rest)
            if v not in cur:
                cur.append(v)
            return


def _remove(obj: Obj, path: Path) -> None:
    parent = value_at(obj, path[:-1]) if len(path) > 1 else obj
    kind, _, rest = path[-1].partition(":")
    if kind == "f" and isinstance(parent, dict):
        parent.pop(rest, None)
    elif kind == "k" and isinstance(parent, list):
        keys = _map_keys(rest)
        parent[:] = [x for x in parent if not _keyed(x, keys)]
    elif kind == "v" and isinstance(parent, list):
        v = json.loads(rest)
        parent[:] = [x for x in parent if x != v]


def _changed(old: Any, new: Any, paths: list[Path]) -> set[Path]:
    """Those of `paths` whose value differs between `old` and `new`: `values_at` of both, compared, but
    a value under an equal prefix (an unchanged condition, the whole spec of a status write) is not
    looked up: equal there means equal below."""
    old_at: dict[Path, Any] = {(): old}
    new_at: dict[Path, Any] = {(): new}
    equal: dict[Path, bool] = {}

    def value(memo: dict[Path, Any], path: Path) -> Any:
        found = memo.get(path, memo)
        if found is memo:
            parent = value(memo, path[:-1])
            found = MISSING if parent is MISSING else _step(parent, path[-1])
            memo[path] = found
        return found

    out = set()
    for p in paths:
        for i in range(1, len(p) + 1):
            prefix = p[:i]
            same = equal.get(prefix)
            if same is None:
                same = equal[prefix] = value(old_at, prefix) == value(new_at, prefix)
            if same:
                break
        else:
            out.add(p)
    return out


def _part_content(obj: Obj, subresource: str, status_subresource: bool) -> Obj:
    """What `field_set` reads of one part of `obj` (its result is a function of this, and the schema)."""
    out = {}
    for k, v in obj.items():
        if k in ("apiVersion", "kind"):
            continue
        if status_subresource and (k == "status") != (subresource == "status"):
            continue
        if k == "metadata" and isinstance(v, dict):
            v = {mk: mv for mk, mv in v.items() if mk not in _SKIP_META}
        out[k] = v
    return out


def _part_after(old: Obj | None, new: Obj, schema: Obj | None, subresource: str,
                status_subresource: bool) -> _Part:
    """`_part` of `new`, taken from `old` when that part of it is equal (compared, not walked), and kept
    for `new` (it is the next write's old object)."""
    if old is not None and same_json(_part_content(old, subresource, status_subresource), _part_content(
            new, subresource, status_subresource)):
        part = _part(old, schema, subresource, status_subresource)
        _remember(new, schema, subresource, status_subresource, part)
        return part
    return _part(new, schema, subresource, status_subresource)


def record(old: Obj | None, new: Obj, change: Change, *, schema: Obj | None, api_version: str,
           status_subresource: bool, now: str) -> list[Obj]:
    """`new`'s managedFields after `change`: the writer's entry gains what it changed (Update) or is the
    applied set (Apply); other entries lose what it took and every entry loses fields that are gone.
    When nothing but times would change, the old list is kept as it was (itself, not a copy).

    The list returned is for storing: it shares parts with stored objects (the fieldsV1 trees are
    `shared_fields_v1`'s, or it is the old list), which are never changed in place; a caller that hands it
    out unstored (a dry run) copies it first."""
    old_meta = (old or {}).get("metadata") or {}
    if change.base is not None:
        old_meta = {**old_meta, "managedFields": change.base}
    before = entries(old_meta)
    sub = change.subresource
    # `new` is stored after this (or dropped): its parts are the next write's old ones (`_part`).
    written = _part_after(old, new, schema, sub, status_subresource)
    new_paths, leaves = written.paths, written.leaves
    # Everything set on the object, main resource and status, to drop fields that no longer exist: the
    # write's side plus the other side (disjoint top-level fields, so the leaves are each side's). The
    # other side is usually unchanged (a status write copies the rest): then it is the old object's.
    if status_subresource:
        other = _part_after(old, new, schema, "" if sub == "status" else "status", True)
        everywhere, everywhere_leaves = new_paths | other.paths, leaves | other.leaves
    else:
        everywhere, everywhere_leaves = new_paths, leaves
    if change.operation is Operation.APPLY:
        taken = set(change.applied) & everywhere
        taken_from_others = set(change.taken)
    else:
        old_paths = _part(old, schema, sub, status_subresource).paths if old else frozenset()
        changed = _changed(old, new, [p for p in new_paths if p in old_paths and p in leaves])
        taken = {p for p in new_paths if p not in old_paths or p in changed}
        taken_from_others = taken
    ident = (change.manager, change.operation, sub)
    after: list[Entry] = []
    mine: Entry | None = None
    for e in before:
        e = Entry(e.manager, e.operation, e.api_version, e.subresource, e.time, set(e.paths))
        if e.ident == ident:
            mine = e
            continue
        e.paths = _settle(e.paths - taken_from_others, everywhere, everywhere_leaves)
        if e.paths:
            after.append(e)
    if change.operation is Operation.APPLY:
        paths = taken
    else:
        paths = _settle((mine.paths if mine else set()) | taken, everywhere, everywhere_leaves)
    if paths:
        unchanged = mine is not None and mine.paths == paths and mine.api_version == api_version
        after.append(Entry(change.manager, change.operation, api_version, sub,
                           mine.time if unchanged and mine else now, paths))
    result = serialize(after, shared=True)
    if _same_but_times(result, old_meta.get("managedFields") or []):
        kept: list[Obj] = old_meta.get("managedFields") or []
        return kept
    return result


def _settle(paths: set[Path], everywhere: AbstractSet[Path], leaves: AbstractSet[Path]) -> set[Path]:
    """Only fields the object still has; an object or list whose owned fields all went elsewhere is no
    longer owned (it would read as owning the whole value). `leaves` is `_leaves(everywhere)`."""
    paths = paths & everywhere
    holding = {q[:i] for q in paths for i in range(1, len(q))}
    return {p for p in paths if p in leaves or p in holding}


def _same_but_times(result: list[Obj], old: list[Any]) -> bool:
    """`result` (fresh from `serialize`: strings and dicts only) and `old` (as stored; a patch may have
    written it, from JSON) are the same entries in any order, times aside, as `_without_times` compares
    them, but without encoding: a string or dict of `result` is JSON-equal to a JSON value exactly when
    it is Python-equal to it (JSON object keys are strings), so matching each entry of `result` to an
    equal one of `old` decides it. A non-object entry in `old` takes `_without_times` (which fails on it
    as it always did)."""
    if not all(isinstance(m, dict) for m in old):
        return _without_times(result) == _without_times(old)
    if len(result) != len(old):
        return False
    unmatched = [{k: v for k, v in m.items() if k != "time"} for m in old]
    for m in result:
        mine = {k: v for k, v in m.items() if k != "time"}
        if mine not in unmatched:
            return False
        unmatched.remove(mine)
    return True


def _without_times(items: list[Obj]) -> list[str]:
    return sorted(json.dumps({k: v for k, v in m.items() if k != "time"}, sort_keys=True) for m in items)
