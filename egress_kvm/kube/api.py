"""KubeApi over kubernetes-asyncio: Proxies (with the status subresource), Secrets and Events.

Writes are full-object PUTs carrying the resourceVersion we read, so a stale write is refused with 409
instead of silently undoing someone else's change; on 409 we re-read and re-apply our part (the status
is computed by us alone; the finalizer list is edited, not replaced). Events follow client-go's recorder
closely enough for `kubectl describe`: core/v1 Events with involvedObject, reason, type, source, and a
repeat of the same (object, type, reason, message) bumps `count` and `lastTimestamp` on the existing
Event instead of creating a new one. `record_event` only queues: Events are written by background
senders (kube/recorder.py), so `close()` them before the ApiClient.
"""

from __future__ import annotations

import base64
import socket
import time
from collections import OrderedDict
from datetime import UTC, datetime

from ..log import Logger, get_logger
from .interfaces import FINALIZER, GROUP, PLURAL, VERSION, Obj, ProxyGone, SpecChanged
from .k8s import ApiClient, ApiException, CoreV1Api, CustomObjectsApi
from .recorder import CAPACITY, DRAIN_TIMEOUT, SENDERS, EventQueue, PendingEvent
from .rest import MERGE_PATCH, KubeApiError, from_api_exception, path_of, request_json, send_json

COMPONENT = "egress-kvm"
# Every write names the operator as its field manager, so `kubectl get px --show-managed-fields` (and a
# server-side apply conflict) says egress-kvm owns status and the finalizer, not "OpenAPI-Generator".
FIELD_MANAGER = "egress-kvm"
CONFLICT_RETRIES = 8
EVENT_CACHE_SIZE = 4096
REQUEST_TIMEOUT = 30.0
# The typed CustomObjectsApi's paths and Accept header, sent through rest.send_json (its docstring says why).
PROXY_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}"
ACCEPT_JSON = {"Accept": "application/json"}


def rfc3339(ts: float | None = None) -> str:
    """metav1.Time: seconds precision, UTC, `Z`."""
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(ts: float | None = None) -> str:
    """metav1.MicroTime: always six fraction digits (the server's parser insists)."""
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")


class KubeApiClient:
    """The controller's window on the API server. Construct with an ApiClient from kube.client."""

    def __init__(self, api_client: ApiClient, *, component: str = COMPONENT,
                 logger: Logger | None = None, event_senders: int = SENDERS,
                 event_capacity: int = CAPACITY) -> None:
        self._api_client = api_client
        self._custom = CustomObjectsApi(api_client)
        self._core = CoreV1Api(api_client)
        self._component = component
        self._instance = socket.gethostname()
        self._log = logger or get_logger("kube")
        # (uid, type, reason, message) -> (namespace, event name, count): dedupe like client-go's
        # EventCorrelator, bounded so a long-lived process does not grow without end.
        self._events: OrderedDict[tuple[str, str, str, str], tuple[str, str, int]] = OrderedDict()
        # Events are written in the background, never inside a reconcile (recorder.py says why and how).
        self._event_queue = EventQueue(self._send_event, senders=event_senders, capacity=event_capacity,
                                       logger=self._log)

    # --- Proxies -------------------------------------------------------------------------------------

    async def get_proxy(self, namespace: str, name: str) -> Obj | None:
        try:
            result: Obj = await send_json(self._api_client, "GET", path_of(PROXY_PATH, namespace=namespace,
                                                                            name=name),
                                          headers=dict(ACCEPT_JSON), timeout=REQUEST_TIMEOUT)
        except KubeApiError as err:
            if err.not_found:
                return None
            raise
        return result

    async def list_proxies(self, namespace: str | None) -> list[Obj]:
        try:
            if namespace:
                result = await self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, _request_timeout=REQUEST_TIMEOUT)
            else:
                result = await self._custom.list_cluster_custom_object(
                    GROUP, VERSION, PLURAL, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            raise from_api_exception(exc) from None
        return list(result.get("items") or [])

    async def update_proxy_status(self, obj: Obj, status: Obj) -> Obj:
        current = obj
        for _attempt in range(CONFLICT_RETRIES):
            # No copy: send_json serialises the body before it yields.
            body = {**_unmanaged(current), "status": status}
            namespace, name = _ns_name(current)
            try:
                result: Obj = await send_json(
                    self._api_client, "PUT", path_of(PROXY_PATH, namespace=namespace, name=name) + "/status",
                    query=[("fieldManager", FIELD_MANAGER)], body=body, headers=dict(ACCEPT_JSON),
                    timeout=REQUEST_TIMEOUT)
                return result
            except KubeApiError as err:
                if err.not_found:
                    raise ProxyGone(f"Proxy {namespace}/{name} no longer exists") from None
                if not err.conflict:
                    raise err from None
            self._log.v(1).info("status update conflicted, re-reading", namespace=namespace, name=name)
            current = _check_same(obj, await self.get_proxy(namespace, name))
        raise KubeApiError(409, "Conflict", f"status of Proxy {_key_text(obj)} still conflicting after "
                                            f"{CONFLICT_RETRIES} attempts")

    async def set_finalizer(self, obj: Obj, *, present: bool) -> Obj:
        current = obj
        for _attempt in range(CONFLICT_RETRIES):
            finalizers = list(current.get("metadata", {}).get("finalizers") or [])
            if (FINALIZER in finalizers) == present:
                return current
            if present:
                finalizers.append(FINALIZER)
            else:
                finalizers = [f for f in finalizers if f != FINALIZER]
            base = _unmanaged(current)
            # A new metadata with the edited list (the key where it was): `current` stays as it is.
            body = {**base, "metadata": {**base["metadata"], "finalizers": finalizers}}
            namespace, name = _ns_name(current)
            try:
                result: Obj = await send_json(
                    self._api_client, "PUT", path_of(PROXY_PATH, namespace=namespace, name=name),
                    query=[("fieldManager", FIELD_MANAGER)], body=body, headers=dict(ACCEPT_JSON),
                    timeout=REQUEST_TIMEOUT)
                return result
            except KubeApiError as err:
                if err.not_found:
                    if present:
                        raise ProxyGone(f"Proxy {namespace}/{name} no longer exists") from None
                    return current
                if not err.conflict:
                    raise err from None
            fresh = await self.get_proxy(namespace, name)
            if fresh is None or fresh["metadata"].get("uid") != (obj.get("metadata") or {}).get("uid"):
                # Gone, or the name now belongs to a recreated Proxy: its finalizer is not ours to touch.
                if present:
                    raise ProxyGone(f"Proxy {namespace}/{name} no longer exists")
                return current
            current = fresh
        raise KubeApiError(409, "Conflict", f"finalizer of Proxy {_key_text(obj)} still conflicting after "
                                            f"{CONFLICT_RETRIES} attempts")

    # --- Secrets -------------------------------------------------------------------------------------

    async def read_secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        found = await self.read_secret_labels(namespace, name)
        return None if found is None else found[1]

    async def read_secret_labels(self, namespace: str, name: str
                                 ) -> tuple[dict[str, str], dict[str, bytes]] | None:
        try:
            secret = await self._core.read_namespaced_secret(name, namespace,
                                                             _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            err = from_api_exception(exc)
            if err.not_found:
                return None
            raise err from None
        labels = dict((secret.metadata.labels if secret.metadata else None) or {})
        return labels, {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}

    # --- Events --------------------------------------------------------------------------------------

    async def record_event(self, obj: Obj, *, type_: str, reason: str, message: str) -> None:
        """Queue the Event and return at once: senders write it (kube/recorder.py). Never raises."""
        try:
            self._event_queue.submit(PendingEvent.about(obj, type_=type_, reason=reason, message=message))
        except Exception as exc:  # best effort by contract: an Event must never fail a reconcile
            self._log.error(exc, "recording event failed", namespace=_ns_name(obj)[0],
                            name=_ns_name(obj)[1], reason=reason)

    async def flush_events(self) -> None:
        """Wait until every Event recorded so far has been written (or failed): for tests and tools."""
        await self._event_queue.flush()

    async def close(self, *, timeout: float = DRAIN_TIMEOUT) -> None:  # noqa: ASYNC109 - a drain bound
        """Stop the Event senders: what is queued gets up to `timeout` seconds, then is dropped. Close this
        before the ApiClient it writes through."""
        await self._event_queue.close(timeout=timeout)

    async def _send_event(self, ev: PendingEvent) -> None:
        """Write one Event: a repeat of a series still cached PATCHes its count, else a new one is POSTed.
        Called by one sender per object (recorder.shard_of), so one series is never written concurrently."""
        cache_key = ev.series_key
        seen = self._events.get(cache_key)
        if seen is not None:
            ev_ns, ev_name, count = seen
            try:
                await request_json(
                    self._api_client, "PATCH", f"/api/v1/namespaces/{ev_ns}/events/{ev_name}",
                    query={"fieldManager": FIELD_MANAGER},
                    body={"count": count + 1, "lastTimestamp": rfc3339(ev.at)}, content_type=MERGE_PATCH)
            except KubeApiError as err:
                if not err.not_found:
                    raise
                # The Event expired (the server's event TTL) or was deleted: start a new series.
                self._events.pop(cache_key, None)
            else:
                self._events[cache_key] = (ev_ns, ev_name, count + 1)
                self._events.move_to_end(cache_key)
                return
        name = f"{ev.name or 'unknown'}.{time.time_ns():x}"
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ev.namespace},
            "involvedObject": {
                "apiVersion": ev.api_version,
                "kind": ev.kind,
                "namespace": ev.namespace,
                "name": ev.name,
                "uid": ev.uid,
                "resourceVersion": ev.resource_version,
            },
            "reason": ev.reason,
            "message": ev.message,
            "type": ev.type_,
            "count": 1,
            "firstTimestamp": rfc3339(ev.at),
            "lastTimestamp": rfc3339(ev.at),
            "source": {"component": self._component, "host": self._instance},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
        }
        await request_json(self._api_client, "POST", f"/api/v1/namespaces/{ev.namespace}/events",
                           query={"fieldManager": FIELD_MANAGER}, body=body)
        self._events[cache_key] = (ev.namespace, name, 1)
        while len(self._events) > EVENT_CACHE_SIZE:
            self._events.popitem(last=False)


async def namespace_uid(api_client: ApiClient, name: str = "kube-system") -> str:
    """The uid of a Namespace: `kube-system`'s is the conventional stable cluster identity."""
    ns = await request_json(api_client, "GET", f"/api/v1/namespaces/{name}")
    uid = ns.get("metadata", {}).get("uid")
    if not uid:
        raise KubeApiError(0, "NoUID", f"Namespace {name} has no metadata.uid")
    return str(uid)


def _check_same(ours: Obj, fresh: Obj | None) -> Obj:
    """A conflict's re-read may only carry a write over to the same object at the same spec: a recreated
    Proxy (another uid) is not ours, and a newer generation was not what the write was computed from."""
    namespace, name = _ns_name(ours)
    meta, fresh_meta = ours.get("metadata") or {}, (fresh or {}).get("metadata") or {}
    if fresh is None or (meta.get("uid") and fresh_meta.get("uid") != meta.get("uid")):
        raise ProxyGone(f"Proxy {namespace}/{name} no longer exists")
    if fresh_meta.get("generation") != meta.get("generation"):
        raise SpecChanged(f"Proxy {namespace}/{name} changed from generation {meta.get('generation')} to "
                          f"{fresh_meta.get('generation')} since it was read")
    return fresh


def _ns_name(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


def _key_text(obj: Obj) -> str:
    ns, name = _ns_name(obj)
    return f"{ns}/{name}"


def _unmanaged(obj: Obj) -> Obj:
    """`obj` without metadata.managedFields, for a write body: the API server keeps the stored list when
    a write omits it (only an explicit list replaces it), and sending it back costs both sides encoding
    and parsing it on every status write (it is most of a small object's metadata)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
