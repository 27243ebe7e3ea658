"""The API semantics, independent of HTTP: what create, update, patch and delete do to stored objects.

The rules are the real server's where a controller or kubectl can observe them:
- every write takes a new resourceVersion; a write that changes nothing is a no-op (no new version, no
  watch event), so a controller patching the same status does not wake itself up;
- PUT with a stale metadata.resourceVersion is 409 Conflict; custom resources also refuse a PUT without
  one (AllowUnconditionalUpdate is false for them); a patch carrying a resourceVersion is a precondition;
- with a status subresource, the main endpoint ignores `.status` and `/status` changes only `.status`;
  `metadata.generation` moves on changes outside metadata (and outside status when the status
  subresource exists);
- delete with finalizers sets deletionTimestamp (and bumps generation) and keeps the object; the write
  that removes the last finalizer deletes it; no new finalizer may be added once deletion started;
- deleting a namespace or a CRD deletes what it contains first (honouring those objects' finalizers),
  then itself, as the namespace controller and the CRD cleanup finalizer do;
- custom resources are defaulted, pruned and validated against their CRD's openAPIV3Schema.
"""

from __future__ import annotations

import base64
import json
import random
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from testbed.emulator import errors, fieldmanager, patch, schema
from testbed.emulator.errors import ApiError, FieldError
from testbed.emulator.fieldmanager import Change, Operation
from testbed.emulator.resources import CRD_KEY, NAMESPACE_KEY, SECRET_KEY, Registry, ResourceType
from testbed.emulator.selectors import field_matcher, label_matcher
from testbed.emulator.store import Store, clone, same_json

Obj = dict[str, Any]
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
PROTECTED_NAMESPACES = ("default", "kube-system", "kube-public")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_GEN_CHARS = "bcdfghjklmnpqrstvwxz2456789"
# Fields a client may not set: the server owns them.
_SERVER_META = (
    "uid",
    "creationTimestamp",
    "resourceVersion",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "managedFields",
)
PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)


def rfc3339(t: datetime) -> str:
    return _rfc3339_seconds(t.replace(microsecond=0))


@lru_cache(maxsize=64)
def _rfc3339_seconds(t: datetime) -> str:
    """Formatted once per second of the clock (every write asks for the time two or three times)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Encodings:
    """The JSON text of recently served stored objects, per (object, resource type): a write's response,
    its watch event (for every watcher) and the GETs after it send the same text, encoded once. Keyed by
    the stored dict and the type themselves (identity, both held here so their ids are not reused): a
    stored object never changes in place (store.py), and a CRD change makes new ResourceTypes."""

    def __init__(self, size: int = 2048) -> None:
        self._size = size
        self._texts: OrderedDict[tuple[int, int], tuple[Obj, ResourceType, str]] = OrderedDict()

    def get(self, rt: ResourceType, obj: Obj, encode: Callable[[], str]) -> str:
        key = (id(obj), id(rt))
        hit = self._texts.get(key)
        if hit is not None and hit[0] is obj and hit[1] is rt:
            return hit[2]
        text = encode()
        self._texts[key] = (obj, rt, text)
        if len(self._texts) > self._size:
            self._texts.popitem(last=False)
        return text


class _Validated:
    """Objects that validated against a schema, by identity (both held, so their ids are not reused):
    a custom resource's fields but metadata do not change between validation and storing, and a stored
    object never changes, so a stored one found here holds no violation of that schema in them."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._seen: OrderedDict[tuple[int, int], tuple[Obj, Obj]] = OrderedDict()

    def add(self, obj: Obj, schema: Obj) -> None:
        self._seen[(id(obj), id(schema))] = (obj, schema)
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)

    def holds(self, obj: Obj, schema: Obj) -> bool:
        hit = self._seen.get((id(obj), id(schema)))
        return hit is not None and hit[0] is obj and hit[1] is schema


class Api:
    """One emulated cluster's objects and verbs. Methods raise ApiError as the real server answers."""

    def __init__(self, store: Store | None = None, *, clock: Callable[[], datetime] | None = None) -> None:
        self.store = store or Store()
        self.registry = Registry()
        self._encodings = _Encodings()
        self._validated = _Validated()
        self._stored_answers = False
        self._clock = clock or (lambda: datetime.now(UTC))
        namespaces = self.resource("", "v1", "namespaces")
        for ns in INITIAL_NAMESPACES:
            self.create(namespaces, "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    def now(self) -> str:
        return rfc3339(self._clock())

    # --- lookups -----------------------------------------------------------------------------
    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.registry.get(group, version, plural)
        if rt is None:
            raise ApiError(
                404,
                "NotFound",
                "the server could not find the requested resource",
                {"group": group, "kind": plural} if group else {"kind": plural},
            )
        return rt

    def get(self, rt: ResourceType, ns: str, name: str) -> Obj:
        obj = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if obj is None:
            raise errors.not_found(rt.group_resource, name)
        return self.served(rt, obj)

    def list(
        self,
        rt: ResourceType,
        ns: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        labels = label_matcher(label_selector)
        fields = field_matcher(field_selector, kind=rt.kind)
        items = [self.served(rt, o) for o in self.store.list(rt.key, ns if rt.namespaced else None)]
        return [o for o in items if labels(o) and fields(o)], str(self.store.resource_version)

    def served(self, rt: ResourceType, obj: Obj) -> Obj:
        """As read back: apiVersion of the requested version, and schema defaults (the real server
        defaults on read too, so a default added to a CRD later shows on old objects)."""
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        if rt.custom and rt.schema:
            schema.apply_defaults(obj, rt.schema)
        return obj

    @contextmanager
    def stored_answers(self) -> Iterator[None]:
        """Within it, a create, update or patch that stores an object returns the stored dict itself, as
        stored (not `served`), instead of a served copy: for the HTTP server, which only encodes it
        (`stored_encoded`), so the copy would be made for nothing. The caller must not change it."""
        self._stored_answers = True
        try:
            yield
        finally:
            self._stored_answers = False

    def _answer(self, rt: ResourceType, stored: Obj) -> Obj:
        """What a write that stored `stored` returns: `Store.put`'s copy, served; the stored dict itself
        within `stored_answers` (put made no copy then)."""
        return stored if self._stored_answers else self.served(rt, stored)

    def encoded(self, rt: ResourceType, stored: Obj) -> str:
        """The compact JSON text of `served(rt, copy of stored)` for a stored object (one `Store.peek` or
        an event hands out), encoded once per object and type (`_Encodings`); `stored` is not changed."""

        def encode() -> str:
            if rt.custom and rt.schema and schema.lacks_defaults(stored, rt.schema):
                served = self.served(rt, clone(stored))
            else:  # only apiVersion and kind change: a shallow copy, encoded at once, never changed
                served = {**stored, "apiVersion": rt.api_version, "kind": rt.kind}
            return json.dumps(served, separators=(",", ":"))

        return self._encodings.get(rt, stored, encode)

    def get_encoded(self, rt: ResourceType, ns: str, name: str) -> str:
        """`get`, as the JSON text of what it returns (without copying the stored object)."""
        obj = self.store.peek(rt.key, ns if rt.namespaced else "", name)
        if obj is None:
            raise errors.not_found(rt.group_resource, name)
        return self.encoded(rt, obj)

    def stored_encoded(self, rt: ResourceType, served: Obj) -> str | None:
        """The JSON text of `served`, an object a write just returned, when it is the stored object as
        served (the same resourceVersion is stored: it was stored or left unchanged by the write; a dry
        run's object is not, and its caller must not ask); else None."""
        meta = served.get("metadata") or {}
        ns = meta.get("namespace", "") if rt.namespaced else ""
        stored = self.store.peek(rt.key, ns, meta.get("name", ""))
        if stored is None or stored["metadata"].get("resourceVersion") != meta.get("resourceVersion"):
            return None
        return self.encoded(rt, stored)

    # --- create ------------------------------------------------------------------------------
    def create(
        self,
        rt: ResourceType,
        ns: str,
        body: Any,
        *,
        field_validation: str = "",
        dry_run: bool = False,
        manager: str = "",
        change: Change | None = None,
        owned: bool = False,
    ) -> tuple[Obj, list[str]]:
        """`owned`: the caller hands `body` over (a request body it just parsed from JSON, nothing else
        refers to it), so it is used as the new object instead of a copy of it."""
        obj = self._check_body(rt, body, owned=owned)
        meta = obj.setdefault("metadata", {})
        _check_sent_ownership(meta)
        sent = fieldmanager.sent_ownership(meta.get("managedFields"), subresource="")
        for k in _SERVER_META:
            meta.pop(k, None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(_GEN_CHARS, k=5))
        name = meta.get("name") or ""
        self._place(rt, ns, meta)
        errs = self._validate_name(rt, name)
        if errs:
            raise errors.invalid(rt.group_kind, name, errs)
        if rt.namespaced:
            namespace = self.store.peek(NAMESPACE_KEY, "", meta["namespace"])
            if namespace is None:
                raise errors.not_found(("", "namespaces"), meta["namespace"])
            if (namespace.get("metadata") or {}).get("deletionTimestamp"):
                raise errors.forbidden(
                    rt.group_resource,
                    name,
                    f"unable to create new content in namespace "
                    f"{meta['namespace']} because it is being terminated",
                )
        if rt.custom and self._crd_terminating(rt):
            raise errors.forbidden(rt.group_resource, name, "the custom resource definition is being deleted")
        if self.store.peek(rt.key, meta.get("namespace", ""), name) is not None:
            raise errors.already_exists(rt.group_resource, name)
        if rt.status_subresource:
            obj.pop("status", None)
        warnings = self._apply_schema(rt, obj, field_validation)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self.now()
        if rt.generation != "none":
            meta["generation"] = 1
        self._on_create(rt, obj)
        self._track(rt, None, obj, change or Change(manager or "unknown", base=sent))
        if dry_run:
            _own_ownership(obj)
            return obj, warnings
        # obj: this call's own copy
        stored = self.store.put(rt.key, obj, event="ADDED", adopt=True, copy=not self._stored_answers)
        if rt.key == CRD_KEY:
            self._rebuild_registry()
        return self._answer(rt, stored), warnings

    def _check_body(self, rt: ResourceType, body: Any, *, owned: bool = False) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request(
                f"the body of the request must be a JSON object, not {type(body).__name__}"
            )
        obj = body if owned else clone(body)
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if api_version and api_version != rt.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({rt.api_version})"
            )
        if kind and kind != rt.kind:
            raise errors.bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        if not isinstance(obj.get("metadata", {}), dict):
            raise errors.bad_request("metadata must be an object")
        return obj

    def _place(self, rt: ResourceType, ns: str, meta: Obj) -> None:
        if rt.namespaced:
            if meta.get("namespace") and ns and meta["namespace"] != ns:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)

    def _validate_name(self, rt: ResourceType, name: str) -> list[FieldError]:
        if not name:
            return [FieldError("Required", "metadata.name", detail="name or generateName is required")]
        if rt.key == NAMESPACE_KEY:
            if len(name) > 63 or not _LABEL.match(name):
                return [
                    FieldError(
                        "Invalid",
                        "metadata.name",
                        name,
                        "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                        "characters or '-', and must start and end with an alphanumeric character "
                        "(e.g. 'my-name',  or '123-abc', regex used for validation is "
                        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                    )
                ]
            return []
        if rt.group.startswith("rbac."):
            return []  # RBAC names are path segments, e.g. system:controller:foo
        if len(name) > 253 or not _SUBDOMAIN.match(name):
            return [
                FieldError(
                    "Invalid",
                    "metadata.name",
                    name,
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                    "characters, '-' or '.', and must start and end with an alphanumeric character "
                    "(e.g. 'example.com', regex used for validation is "
                    r"'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                )
            ]
        return []

    def _apply_schema(self, rt: ResourceType, obj: Obj, field_validation: str, old: Obj | None = None
                      ) -> list[str]:
        """Default, prune, validate. Returns warnings for pruned fields (fieldValidation=Warn, the
        default); Strict refuses them as the real server does. `old`: the stored object a write starts
        from; its fields that `obj` has unchanged are not validated again if it validated against this
        schema (`_Validated`)."""
        if not rt.custom or not rt.schema:
            return []
        schema.apply_defaults(obj, rt.schema)
        dropped = [] if rt.preserve_unknown else schema.prune(obj, rt.schema, root=True)
        if dropped and field_validation == "Strict":
            raise errors.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding '
                "error: " + ", ".join(f'unknown field "{p}"' for p in dropped)
            )
        valid: set[str] = set()
        if old is not None and self._validated.holds(old, rt.schema):
            # metadata changes after this (managedFields, generation): never taken as validated
            valid = {k for k, v in obj.items() if k != "metadata" and k in old and same_json(old[k], v)}
        errs = schema.validate(obj, rt.schema, valid_keys=valid)
        if errs:
            raise errors.invalid(rt.group_kind, (obj.get("metadata") or {}).get("name", ""), errs)
        self._validated.add(obj, rt.schema)
        if field_validation == "Ignore":
            return []
        return [f'unknown field "{p}"' for p in dropped]

    @staticmethod
    def _fold_string_data(rt: ResourceType, obj: Obj) -> None:
        """Secrets: `stringData` is write-only; the server merges it into `data` (base64)."""
        if rt.key != SECRET_KEY:
            return
        obj.setdefault("type", "Opaque")  # the real server's default
        if not isinstance(obj.get("stringData"), dict):
            return
        data = obj.setdefault("data", {}) or {}
        for k, v in obj.pop("stringData").items():
            data[k] = base64.b64encode(str(v).encode()).decode()
        obj["data"] = data

    def _on_create(self, rt: ResourceType, obj: Obj) -> None:
        self._fold_string_data(rt, obj)
        if rt.key == NAMESPACE_KEY:
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif rt.key == CRD_KEY:
            self._check_crd(obj)
            obj["status"] = self._crd_status(obj)

    # --- update / patch ----------------------------------------------------------------------
    def _existing(self, rt: ResourceType, ns: str, name: str, subresource: str) -> tuple[str, Obj]:
        """The namespace as stored (none for cluster-scoped kinds) and the object a write starts from: the
        stored one itself (Store.peek), which the write reads and copies from but never changes."""
        ns = ns if rt.namespaced else ""
        self._check_subresource(rt, subresource)
        current = self.store.peek(rt.key, ns, name)
        if current is None:
            raise errors.not_found(rt.group_resource, name)
        return ns, current

    def update(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        body: Any,
        *,
        subresource: str = "",
        field_validation: str = "",
        dry_run: bool = False,
        manager: str = "",
        owned: bool = False,
    ) -> tuple[Obj, list[str]]:
        """`owned` as for `create`."""
        ns, current = self._existing(rt, ns, name, subresource)
        obj = self._check_body(rt, body, owned=owned)
        meta = obj.setdefault("metadata", {})
        _check_sent_ownership(meta)
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        self._place(rt, ns, meta)
        rv = meta.get("resourceVersion")
        if rv:
            if rv != current["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.group_resource, name, errors.STALE)
        elif not rt.unconditional_update:
            raise errors.invalid(
                rt.group_kind,
                name,
                [FieldError("Invalid", "metadata.resourceVersion", 0, "must be specified for an update")],
            )
        sent = fieldmanager.sent_ownership(meta.get("managedFields"), subresource=subresource)
        return self._write(
            rt,
            current,
            obj,
            subresource=subresource,
            field_validation=field_validation,
            dry_run=dry_run,
            change=Change(manager or "unknown", subresource=subresource, base=sent),
        )

    def patch(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        content_type: str,
        body: Any,
        *,
        subresource: str = "",
        field_validation: str = "",
        dry_run: bool = False,
        manager: str = "",
        force: bool = False,
    ) -> tuple[Obj, list[str]]:
        if content_type == "application/apply-patch+yaml":
            return self.apply(
                rt,
                ns,
                name,
                body,
                manager=manager,
                force=force,
                subresource=subresource,
                field_validation=field_validation,
                dry_run=dry_run,
            )
        ns, current = self._existing(rt, ns, name, subresource)
        base = self.served(rt, clone(current))
        if content_type == "application/merge-patch+json":
            if not isinstance(body, dict):
                raise errors.bad_request("merge patch: the body must be a JSON object")
            patched = patch.merge_patch(base, body)
        elif content_type == "application/json-patch+json":
            patched = patch.json_patch(base, body)
        elif content_type == "application/strategic-merge-patch+json" and not rt.custom:
            if not isinstance(body, dict):
                raise errors.bad_request("strategic merge patch: the body must be a JSON object")
            patched = patch.strategic_merge_patch(base, body)
        else:
            accepted = PATCH_TYPES[:2] if rt.custom else PATCH_TYPES
            raise errors.unsupported_media_type(accepted)
        if not isinstance(patched, dict):
            raise errors.bad_request("the patch does not leave an object")
        meta = patched.setdefault("metadata", {})
        if meta.get("name") != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.group_resource, name, errors.STALE)
        obj = self._check_body(rt, patched)
        if (why := fieldmanager.sent_shape_error(obj["metadata"].get("managedFields"))) is not None:
            # The real server cannot decode the patched object: 422 on the field `patch`, which holds
            # the patched object (apiserver's jsonPatcher.applyPatchToCurrentObject).
            raise errors.invalid(("", ""), "", [FieldError(
                "Invalid", "patch", json.dumps(patched, separators=(",", ":")), why)])
        self._place(rt, ns, obj["metadata"])
        # The patched object's managedFields: the stored list unless the patch changed it (kubectl's
        # client-side to server-side apply migration patches it itself).
        sent = fieldmanager.sent_ownership(obj["metadata"].get("managedFields"), subresource=subresource)
        return self._write(
            rt,
            current,
            obj,
            subresource=subresource,
            field_validation=field_validation,
            dry_run=dry_run,
            change=Change(manager or "unknown", subresource=subresource, base=sent),
        )

    def apply(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        body: Any,
        *,
        manager: str,
        force: bool = False,
        subresource: str = "",
        field_validation: str = "",
        dry_run: bool = False,
    ) -> tuple[Obj, list[str]]:
        """Server-side apply (fieldmanager.py): create the object if it is missing, else merge the applied
        configuration in, refusing (409) to change fields other managers own unless `force`."""
        if not manager:
            raise errors.bad_request("PATCH, application/apply-patch+yaml: fieldManager is required")
        if not isinstance(body, dict):
            raise errors.bad_request("apply: the body must be an object")
        if not body.get("apiVersion") or not body.get("kind"):
            raise errors.bad_request("apiVersion and kind must be set in an applied configuration")
        applied = self._check_body(rt, body)
        meta = applied.setdefault("metadata", {})
        refused = fieldmanager.applied_ownership_error(meta)
        if refused is not None:
            raise refused
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        meta["name"] = name
        for k in _SERVER_META:
            meta.pop(k, None)
        self._place(rt, ns, meta)
        self._check_subresource(rt, subresource)
        status_sub = rt.status_subresource
        paths = fieldmanager.field_set(
            applied, rt.schema, subresource=subresource, status_subresource=status_sub
        )
        change = Change(manager, Operation.APPLY, subresource, frozenset(paths))
        stored_ns = ns if rt.namespaced else ""
        current = self.store.peek(rt.key, stored_ns, name)  # read and copied from, never changed
        if current is None:
            if subresource:
                raise errors.not_found(rt.group_resource, name)
            return self.create(
                rt, ns, applied, field_validation=field_validation, dry_run=dry_run, change=change
            )
        live = self.served(rt, clone(current))
        owners = fieldmanager.entries(current["metadata"])
        found = fieldmanager.conflicts(live, applied, paths, owners, manager=manager, subresource=subresource)
        if found and manager == "kubectl":
            # The real server's lastAppliedManager: kubectl's first server-side apply of an object it applied
            # client-side takes over the fields of the last-applied annotation instead of conflicting.
            allowed = fieldmanager.last_applied_fields(live, rt.schema)
            if all(p in allowed for _, p in found):
                force = True
            else:
                found = [(e, p) for e, p in found if p not in allowed]
        if found and not force:
            raise fieldmanager.conflict_error(found)
        before = next(
            (e.paths for e in owners if e.ident == (manager, Operation.APPLY, subresource)), set()
        )
        others = set().union(
            *(e.paths for e in owners if e.ident != (manager, Operation.APPLY, subresource))
        )
        dropped = fieldmanager.dropped_paths(before, paths, others)
        merged = fieldmanager.merge_applied(live, applied, applied_paths=paths, dropped=dropped)
        merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        obj = self._check_body(rt, merged)
        self._place(rt, ns, obj["metadata"])
        change = Change(
            manager, Operation.APPLY, subresource, frozenset(paths), frozenset(p for _, p in found)
        )
        return self._write(
            rt,
            current,
            obj,
            subresource=subresource,
            field_validation=field_validation,
            dry_run=dry_run,
            change=change,
        )

    def _track(self, rt: ResourceType, old: Obj | None, new: Obj, change: Change) -> None:
        new["metadata"]["managedFields"] = fieldmanager.record(
            old,
            new,
            change,
            schema=rt.schema,
            api_version=rt.api_version,
            status_subresource=rt.status_subresource,
            now=self.now(),
        )
        if not new["metadata"]["managedFields"]:
            new["metadata"].pop("managedFields")

    @staticmethod
    def _check_subresource(rt: ResourceType, subresource: str) -> None:
        if subresource and (subresource != "status" or not rt.status_subresource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _write(
        self,
        rt: ResourceType,
        current: Obj,
        obj: Obj,
        *,
        subresource: str,
        field_validation: str,
        dry_run: bool,
        change: Change | None = None,
    ) -> tuple[Obj, list[str]]:
        name = current["metadata"]["name"]
        if subresource == "status":
            # current's own status is replaced: copy the rest only (None keeps status's place in the keys)
            # (metadata.managedFields is not copied: the loop below replaces it)
            new: Obj = {k: None if k == "status" else _clone_meta(v) if k == "metadata" else clone(v)
                        for k, v in current.items()}
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
        else:
            new = obj
            if rt.status_subresource:
                if "status" in current:
                    new["status"] = clone(current["status"])
                else:
                    new.pop("status", None)
        meta, old_meta = new["metadata"], current["metadata"]
        shared_ownership = not _defaults_reach_metadata(rt)
        for k in _SERVER_META:
            if k in old_meta:
                # managedFields only holds its place until _track replaces it (record reads the stored
                # list, not this one), so it is the stored list itself unless defaulting `new` can reach
                # into it (a root additionalProperties schema applies to metadata): then a copy.
                shared = k == "managedFields" and shared_ownership
                meta[k] = old_meta[k] if shared else clone(old_meta[k])
            else:
                meta.pop(k, None)
        if old_meta.get("deletionTimestamp"):
            added = sorted(set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or []))
            if added:
                raise errors.invalid(
                    rt.group_kind,
                    name,
                    [
                        FieldError(
                            "Forbidden",
                            "metadata.finalizers",
                            detail="no new finalizers can be added if the object is being deleted, found new "
                            f"finalizers []string{{{', '.join(chr(34) + f + chr(34) for f in added)}}}",
                        )
                    ],
                )
        warnings = self._apply_schema(rt, new, field_validation, old=current)
        self._fold_string_data(rt, new)
        if rt.key == CRD_KEY:
            self._check_crd(new, old=current)
            new["status"] = self._crd_status(new, current.get("status"))
        if rt.generation != "none" and self._spec_changed(rt, current, new):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        self._track(rt, current, new, change or Change("unknown", subresource=subresource))
        if self._same(current, new):
            return self.served(rt, clone(current)), warnings
        if dry_run:
            _own_ownership(new)
            return self.served(rt, new), warnings
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and self._may_vanish(rt, new):
            final = self.store.remove(rt.key, new, adopt=True)  # new: this write's own copy
            self._after_remove(rt, final)
            return self.served(rt, final), warnings
        stored = self.store.put(rt.key, new, event="MODIFIED", adopt=True, copy=not self._stored_answers)
        if rt.key == CRD_KEY:
            self._rebuild_registry()
        return self._answer(rt, stored), warnings

    @staticmethod
    def _same(a: Obj, b: Obj) -> bool:
        """Equal but for apiVersion and metadata.resourceVersion (compared in place, without copies)."""
        skip = ("apiVersion", "metadata")
        if {k: v for k, v in a.items() if k not in skip} != {k: v for k, v in b.items() if k not in skip}:
            return False
        ma, mb = a["metadata"], b["metadata"]
        return {k: v for k, v in ma.items() if k != "resourceVersion"} == {
            k: v for k, v in mb.items() if k != "resourceVersion"
        }

    @staticmethod
    def _spec_changed(rt: ResourceType, old: Obj, new: Obj) -> bool:
        skip = {"metadata", "apiVersion", "kind"} | ({"status"} if rt.status_subresource else set())
        return {k: v for k, v in old.items() if k not in skip} != {
            k: v for k, v in new.items() if k not in skip
        }

    # --- delete ------------------------------------------------------------------------------
    def delete(
        self, rt: ResourceType, ns: str, name: str, options: Obj | None = None, *, dry_run: bool = False
    ) -> tuple[Obj, bool]:
        """Returns (object, gone): gone is False when finalizers keep it (HTTP 202 on a real server)."""
        ns = ns if rt.namespaced else ""
        current = self.store.get(rt.key, ns, name)
        if current is None:
            raise errors.not_found(rt.group_resource, name)
        pre = (options or {}).get("preconditions") or {}
        meta = current["metadata"]
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise errors.conflict(
                rt.group_resource,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta['uid']}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise errors.conflict(
                rt.group_resource,
                name,
                "Precondition failed: ResourceVersion in "
                f"precondition: {pre['resourceVersion']}, ResourceVersion in object meta: "
                f"{meta['resourceVersion']}",
            )
        if rt.key == NAMESPACE_KEY and name in PROTECTED_NAMESPACES:
            raise errors.forbidden(rt.group_resource, name, "this namespace may not be deleted")
        if dry_run:
            return self.served(rt, current), not meta.get("finalizers")
        if meta.get("deletionTimestamp"):
            return self.served(rt, current), False
        cascades = rt.key in (NAMESPACE_KEY, CRD_KEY)
        if meta.get("finalizers") or cascades:
            meta["deletionTimestamp"] = self.now()
            meta["deletionGracePeriodSeconds"] = 0
            if "generation" in meta:
                meta["generation"] += 1
            if rt.key == NAMESPACE_KEY:
                current.setdefault("status", {})["phase"] = "Terminating"
            stored = self.store.put(rt.key, current, event="MODIFIED", adopt=True)  # current: a copy (get)
            if cascades:
                self._cascade(rt, stored)
                again = self.store.get(rt.key, ns, name)
                if again is None:
                    return self.served(rt, stored), True
                stored = again
            return self.served(rt, stored), False
        final = self.store.remove(rt.key, current, adopt=True)
        self._after_remove(rt, final)
        return self.served(rt, final), True

    def delete_collection(
        self,
        rt: ResourceType,
        ns: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        items, _ = self.list(rt, ns, label_selector=label_selector, field_selector=field_selector)
        out = []
        for item in items:
            m = item["metadata"]
            try:
                out.append(self.delete(rt, m.get("namespace", ""), m["name"])[0])
            except ApiError:
                continue
        return out

    def _may_vanish(self, rt: ResourceType, obj: Obj) -> bool:
        """Namespaces and CRDs go only once empty, even with no finalizers left."""
        if rt.key == NAMESPACE_KEY:
            return not any(self.store.count(k, obj["metadata"]["name"]) for k in self._namespaced_keys())
        if rt.key == CRD_KEY:
            return not any(self.store.count(t.key) for t in self._crd_types(obj))
        return True

    def _namespaced_keys(self) -> list[tuple[str, str]]:
        keys = []
        for k in self.store.type_keys():
            t = self.registry.by_key(k)
            if t is None or t.namespaced:
                keys.append(k)
        return keys

    def _crd_types(self, crd: Obj) -> list[ResourceType]:
        from testbed.emulator.resources import types_from_crd

        return types_from_crd(crd)[:1]

    def _cascade(self, rt: ResourceType, owner: Obj) -> None:
        if rt.key == NAMESPACE_KEY:
            ns = owner["metadata"]["name"]
            victims = [(k, o) for k in self._namespaced_keys() for o in self.store.list(k, ns)]
        else:
            victims = [(t.key, o) for t in self._crd_types(owner) for o in self.store.list(t.key)]
        for key, obj in victims:
            t = self.registry.by_key(key)
            if t is None:
                continue
            m = obj["metadata"]
            try:
                self.delete(t, m.get("namespace", ""), m["name"])
            except ApiError:
                continue
        self._maybe_finish(rt, owner)

    def _maybe_finish(self, rt: ResourceType, owner: Obj) -> None:
        current = self.store.peek(rt.key, "", owner["metadata"]["name"])  # read only; remove copies it
        if current is None or not current["metadata"].get("deletionTimestamp"):
            return
        if current["metadata"].get("finalizers") or not self._may_vanish(rt, current):
            return
        final = self.store.remove(rt.key, current)
        self._after_remove(rt, final)

    def _after_remove(self, rt: ResourceType, final: Obj) -> None:
        """Finish a terminating namespace or CRD once its last object is gone."""
        if rt.key == CRD_KEY:
            self._rebuild_registry()
            return
        if rt.namespaced:
            ns_type = self.registry.by_key(NAMESPACE_KEY)
            assert ns_type is not None
            self._maybe_finish(ns_type, {"metadata": {"name": final["metadata"]["namespace"]}})
        if rt.custom:
            crds = self.store.peek_list(CRD_KEY)
            crd = next((c for c in crds if any(t.key == rt.key for t in self._crd_types(c))), None)
            crd_type = self.registry.by_key(CRD_KEY)
            if crd is not None and crd_type is not None:
                self._maybe_finish(crd_type, crd)

    # --- CRDs --------------------------------------------------------------------------------
    def _rebuild_registry(self) -> None:
        self.registry.rebuild(self.store.list(CRD_KEY))

    def _crd_terminating(self, rt: ResourceType) -> bool:
        for crd in self.store.peek_list(CRD_KEY):
            spec = crd.get("spec") or {}
            if spec.get("group") == rt.group and (spec.get("names") or {}).get("plural") == rt.plural:
                return bool(crd["metadata"].get("deletionTimestamp"))
        return False

    def _check_crd(self, crd: Obj, old: Obj | None = None) -> None:
        spec, name = crd.get("spec") or {}, crd["metadata"]["name"]
        names = spec.get("names") or {}
        errs: list[FieldError] = []
        for f in ("group",):
            if not spec.get(f):
                errs.append(FieldError("Required", f"spec.{f}"))
        for f in ("plural", "kind"):
            if not names.get(f):
                errs.append(FieldError("Required", f"spec.names.{f}"))
        if spec.get("scope") not in ("Namespaced", "Cluster"):
            errs.append(
                FieldError(
                    "NotSupported", "spec.scope", spec.get("scope"), supported=("Cluster", "Namespaced")
                )
            )
        if names.get("plural") and spec.get("group") and name != f"{names['plural']}.{spec['group']}":
            errs.append(
                FieldError("Invalid", "metadata.name", name, 'must be spec.names.plural+"."+spec.group')
            )
        versions = spec.get("versions") or []
        if not versions:
            errs.append(
                FieldError(
                    "Invalid",
                    "spec.versions",
                    versions,
                    "must have exactly one version marked as storage version",
                )
            )
        elif sum(1 for v in versions if v.get("storage")) != 1:
            errs.append(
                FieldError(
                    "Invalid",
                    "spec.versions",
                    [v.get("name") for v in versions],
                    "must have exactly one version marked as storage version",
                )
            )
        for i, v in enumerate(versions):
            s = (v.get("schema") or {}).get("openAPIV3Schema")
            if s is None and not spec.get("preserveUnknownFields"):
                errs.append(
                    FieldError(
                        "Required",
                        f"spec.versions[{i}].schema.openAPIV3Schema",
                        detail="schemas are required",
                    )
                )
            errs += schema.check_crd_schema(s, f"spec.versions[{i}].schema.openAPIV3Schema")
            errs += schema.check_root_metadata(s, f"spec.versions[{i}].schema.openAPIV3Schema")
        if old is not None:
            ospec = old.get("spec") or {}
            if ospec.get("group") != spec.get("group"):
                errs.append(FieldError("Invalid", "spec.group", spec.get("group"), "field is immutable"))
        for other in self.store.peek_list(CRD_KEY):
            if other["metadata"]["name"] == name:
                continue
            ospec = other.get("spec") or {}
            if ospec.get("group") == spec.get("group") and (ospec.get("names") or {}).get(
                "plural"
            ) == names.get("plural"):
                errs.append(FieldError("Invalid", "spec.names.plural", names.get("plural"), "already in use"))
        if errs:
            raise errors.invalid(("apiextensions.k8s.io", "CustomResourceDefinition"), name, errs)

    def _crd_status(self, crd: Obj, old: Obj | None = None) -> Obj:
        """Established and NamesAccepted at once: nothing here runs the naming controller's delay."""
        now = self.now()
        old_times = {c.get("type"): c.get("lastTransitionTime") for c in (old or {}).get("conditions") or []}
        names = clone((crd.get("spec") or {}).get("names") or {})
        names.setdefault("singular", str(names.get("kind", "")).lower())
        names.setdefault("listKind", f"{names.get('kind', '')}List")
        conds = [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": old_times.get("NamesAccepted", now),
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": old_times.get("Established", now),
            },
        ]
        if crd["metadata"].get("deletionTimestamp"):
            conds.append(
                {
                    "type": "Terminating",
                    "status": "True",
                    "reason": "InstanceDeletionInProgress",
                    "message": "CustomResource deletion is in progress",
                    "lastTransitionTime": now,
                }
            )
        return {
            "acceptedNames": names,
            "conditions": conds,
            "storedVersions": [
                v["name"] for v in (crd.get("spec") or {}).get("versions") or [] if v.get("storage")
            ],
        }


def _defaults_reach_metadata(rt: ResourceType) -> bool:
    """Whether defaulting an object of this type can write into its metadata: a root schema whose
    `additionalProperties` applies to `metadata` (no `metadata` property)."""
    root = rt.schema if rt.custom and isinstance(rt.schema, dict) else {}
    props = root.get("properties") or {}
    return isinstance(root.get("additionalProperties"), dict) and "metadata" not in props


def _clone_meta(meta: Obj) -> Obj:
    """A copy of stored metadata whose managedFields is the stored list itself (only to be replaced)."""
    return {k: v if k == "managedFields" else clone(v) for k, v in meta.items()}


def _own_ownership(obj: Obj) -> None:
    """A copy of the managedFields `_track` set, for an object handed out unstored (a dry run): that list
    shares parts with stored objects (fieldmanager.record)."""
    meta = obj["metadata"]
    if "managedFields" in meta:
        meta["managedFields"] = clone(meta["managedFields"])


def _check_sent_ownership(meta: Obj) -> None:
    """A create or update whose body carries a `metadata.managedFields` ObjectMeta cannot hold: 400
    BadRequest naming the field, as the real server's decode of the body answers."""
    why = fieldmanager.sent_shape_error(meta.get("managedFields"))
    if why is not None:
        raise errors.bad_request(f"the body cannot be decoded: {why}")
