"""An in-memory Kubernetes for the controller's unit tests: KubeApi and ProxyStore over one dict.

Faithful where the controller depends on it: resourceVersion bumped on every write, metadata.generation
bumped on spec changes only, status written only through `update_proxy_status` (conflicts re-read and
retried, as the contract says the real client does, unless the spec moved on: SpecChanged;
`inject_conflicts` forces some), finalizers holding
a deletion as deletionTimestamp until the last one goes, ProxyGone for a vanished object, and every
status checked against the CRD's status schema (so a misspelt field or an invalid phase fails a test).
Watchers get ADDED/MODIFIED/DELETED as an informer would, on the next loop iteration.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from egress_kvm.kube.interfaces import FINALIZER, Key, Obj, ProxyGone, SpecChanged, key_of

CRD = Path(__file__).resolve().parents[3] / "deploy" / "crd" / "egressproxies.io_proxies.yaml"
_STATUS_SCHEMA = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"]["status"]


def _check(value: Any, schema: dict[str, Any], path: str) -> None:
    t = schema.get("type")
    if t == "object":
        assert isinstance(value, dict), f"{path}: not an object"
        props = schema.get("properties")
        if props is not None:
            extra = set(value) - set(props)
            assert not extra, f"{path}: fields not in the CRD schema: {sorted(extra)}"
            for k, v in value.items():
                _check(v, props[k], f"{path}.{k}")
        for r in schema.get("required", []):
            assert r in value, f"{path}.{r}: required"
    elif t == "array":
        assert isinstance(value, list), f"{path}: not an array"
        for i, v in enumerate(value):
            _check(v, schema["items"], f"{path}[{i}]")
    elif t == "string":
        assert isinstance(value, str), f"{path}: not a string: {value!r}"
        if "enum" in schema:
            assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    elif t == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{path}: not an integer"
    elif t == "boolean":
        assert isinstance(value, bool), f"{path}: not a boolean"


def check_status(status: Obj) -> None:
    _check(status, _STATUS_SCHEMA, "status")


class FakeKube:
    def __init__(self, *, synced: bool = True) -> None:
        self.objects: dict[Key, Obj] = {}
        self.secrets: dict[Key, dict[str, bytes]] = {}
        self.secret_labels: dict[Key, dict[str, str]] = {}
        self.events: list[dict[str, Any]] = []
        self.status_writes = 0
        self.conflicts = 0
        self.stale_rejected = 0  # status writes refused: computed from an older generation
        self.inject_conflicts = 0
        self.synced = synced
        self._rv = 0
        self._watchers: list[Callable[[str, Obj], None]] = []

    # --- test-side writes (what a user with kubectl does) -------------------------------------------

    def watch(self, callback: Callable[[str, Obj], None]) -> None:
        self._watchers.append(callback)

    def create_proxy(self, name: str, spec: Obj, *, namespace: str = "default") -> Obj:
        key = (namespace, name)
        assert key not in self.objects, f"{key} exists"
        obj: Obj = {
            "apiVersion": "egressproxies.io/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "generation": 1,
                         "creationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
            "spec": copy.deepcopy(spec),
        }
        self.objects[key] = obj
        self._bump(obj, "ADDED")
        return copy.deepcopy(obj)

    def set_spec(self, key: Key, spec: Obj) -> None:
        obj = self.objects[key]
        if obj["spec"] != spec:
            obj["spec"] = copy.deepcopy(spec)
            obj["metadata"]["generation"] += 1
            self._bump(obj, "MODIFIED")

    def delete(self, key: Key) -> None:
        obj = self.objects[key]
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                self._bump(obj, "MODIFIED")
        else:
            self._remove(key)

    def force_remove(self, key: Key) -> None:
        """Gone without our finalizer running (e.g. removed by hand while the operator was down)."""
        self._remove(key)

    def put_secret(self, namespace: str, name: str, data: dict[str, bytes], *,
                   labels: dict[str, str] | None = None) -> None:
        """A Secret; `labels=USABLE` is the opt-in a Proxy needs to use it (egress_kvm/policy/secrets.py)."""
        self.secrets[(namespace, name)] = dict(data)
        self.secret_labels[(namespace, name)] = dict(labels or {})

    def events_for(self, name: str) -> list[tuple[str, str, str]]:
        return [(e["type"], e["reason"], e["message"]) for e in self.events if e["name"] == name]

    def reasons(self, name: str) -> list[str]:
        return [e["reason"] for e in self.events if e["name"] == name]

    def status(self, key: Key) -> Obj:
        return copy.deepcopy(self.objects[key].get("status") or {})

    # --- KubeApi ------------------------------------------------------------------------------------

    async def get_proxy(self, namespace: str, name: str) -> Obj | None:
        obj = self.objects.get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    async def list_proxies(self, namespace: str | None) -> list[Obj]:
        return [copy.deepcopy(o) for k, o in self.objects.items() if namespace in (None, k[0])]

    async def update_proxy_status(self, obj: Obj, status: Obj) -> Obj:
        stored = self._stored_for(obj)
        if self.inject_conflicts > 0 or obj["metadata"].get("resourceVersion") != \
                stored["metadata"]["resourceVersion"]:
            # What the real client does on 409: re-read, and retry onto the newest object only if it is
            # still the spec the status was computed from.
            self.inject_conflicts = max(0, self.inject_conflicts - 1)
            self.conflicts += 1
            if stored["metadata"]["generation"] != obj["metadata"].get("generation"):
                self.stale_rejected += 1
                raise SpecChanged(f"proxy {key_of(obj)} changed generation since it was read")
        check_status(status)
        stored["status"] = copy.deepcopy(status)
        self.status_writes += 1
        self._bump(stored, "MODIFIED")
        written = copy.deepcopy(stored)  # what this write stored, not what others wrote since
        await asyncio.sleep(0)
        return written

    async def set_finalizer(self, obj: Obj, *, present: bool) -> Obj:
        stored = self._stored_for(obj)
        finalizers = list(stored["metadata"].get("finalizers") or [])
        if present and FINALIZER not in finalizers:
            finalizers.append(FINALIZER)
        elif not present and FINALIZER in finalizers:
            finalizers.remove(FINALIZER)
        else:
            return copy.deepcopy(stored)
        stored["metadata"]["finalizers"] = finalizers
        if not finalizers and stored["metadata"].get("deletionTimestamp"):
            last = copy.deepcopy(stored)
            self._remove(key_of(stored))
            return last
        self._bump(stored, "MODIFIED")
        written = copy.deepcopy(stored)
        await asyncio.sleep(0)
        return written

    async def read_secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        data = self.secrets.get((namespace, name))
        return dict(data) if data is not None else None

    async def read_secret_labels(self, namespace: str, name: str
                                 ) -> tuple[dict[str, str], dict[str, bytes]] | None:
        data = self.secrets.get((namespace, name))
        if data is None:
            return None
        return dict(self.secret_labels.get((namespace, name), {})), dict(data)

    async def record_event(self, obj: Obj, *, type_: str, reason: str, message: str) -> None:
        assert type_ in ("Normal", "Warning"), type_
        meta = obj["metadata"]
        self.events.append({"namespace": meta.get("namespace"), "name": meta["name"], "uid": meta.get("uid"),
                            "type": type_, "reason": reason, "message": message})

    # --- ProxyStore ---------------------------------------------------------------------------------

    def get(self, key: Key) -> Obj | None:
        obj = self.objects.get(key)
        return copy.deepcopy(obj) if obj is not None else None

    def keys(self) -> list[Key]:
        return list(self.objects)

    def has_synced(self) -> bool:
        return self.synced

    # --- internals ----------------------------------------------------------------------------------

    def _stored_for(self, obj: Obj) -> Obj:
        stored = self.objects.get(key_of(obj))
        if stored is None or stored["metadata"]["uid"] != obj["metadata"].get("uid"):
            raise ProxyGone(f"proxy {key_of(obj)} not found")
        return stored

    def _bump(self, obj: Obj, kind: str) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._notify(kind, obj)

    def _remove(self, key: Key) -> None:
        obj = self.objects.pop(key)
        self._rv += 1
        self._notify("DELETED", obj)

    def _notify(self, kind: str, obj: Obj) -> None:
        snapshot = copy.deepcopy(obj)
        for w in self._watchers:
            try:
                asyncio.get_running_loop().call_soon(w, kind, snapshot)
            except RuntimeError:  # no loop (a test setting up before it starts)
                w(kind, snapshot)


class LaggingStore:
    """A ProxyStore (informer cache) that can fall behind the API server: `freeze()` keeps serving the
    objects as they are now while the FakeKube moves on, as a stalled watch does, still reporting synced.
    Without it the cache could never lag in a test, since FakeKube is both cache and API server."""

    def __init__(self, api: FakeKube) -> None:
        self._api = api
        self._frozen: dict[Key, Obj] | None = None

    def freeze(self) -> None:
        self._frozen = copy.deepcopy(self._api.objects)

    def thaw(self) -> None:
        self._frozen = None

    def get(self, key: Key) -> Obj | None:
        if self._frozen is None:
            return self._api.get(key)
        obj = self._frozen.get(key)
        return copy.deepcopy(obj) if obj is not None else None

    def keys(self) -> list[Key]:
        return list(self._frozen) if self._frozen is not None else self._api.keys()

    def has_synced(self) -> bool:
        return True
