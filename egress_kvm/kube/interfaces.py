"""What the controller needs from Kubernetes, as protocols.

The controller (queue, reconciler, health prober, GC) depends only on these, so it can be tested over an
in-memory implementation, and the kubernetes-asyncio implementation (egress_kvm/kube/) can be tested
against the API emulator on its own. Objects are plain dicts as the API serves them (camelCase keys).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

GROUP = "egressproxies.io"
VERSION = "v1alpha1"
PLURAL = "proxies"
KIND = "Proxy"
FINALIZER = "egressproxies.io/finalizer"

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)


def key_of(obj: Obj) -> Key:
    meta = obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])


class ProxyStore(Protocol):
    """The informer's cache of Proxies: the last state seen by list+watch."""

    def get(self, key: Key) -> Obj | None: ...

    def keys(self) -> list[Key]: ...

    def has_synced(self) -> bool:
        """True once the first full list has been stored (GC must not act before)."""
        ...


EventHandler = Callable[[str, Obj], Awaitable[None] | None]  # (ADDED|MODIFIED|DELETED, obj)


class SpecChanged(Exception):
    """A status write found the object's metadata.generation moved on since the status was computed:
    writing it would claim a spec was observed that never was. The caller starts over."""


class ProxyGone(Exception):
    """The Proxy no longer exists (deleted, or deleted and its name reused by another uid): whatever was
    being done for it is moot. Its own type, so a KeyError from a bug is never taken for it."""


class KubeApi(Protocol):
    async def get_proxy(self, namespace: str, name: str) -> Obj | None:
        """A fresh read from the API server (not the cache); None if it does not exist."""
        ...

    async def list_proxies(self, namespace: str | None) -> list[Obj]: ...

    async def update_proxy_status(self, obj: Obj, status: Obj) -> Obj:
        """Write `status` through the status subresource. On 409 Conflict re-read and retry (status is
        computed by us alone, so the newest object plus our status is right) unless the re-read object
        has another generation (SpecChanged: the status describes a spec that is no longer the one) or
        another uid (ProxyGone: ours was deleted and the name reused). Returns the stored object;
        raises ProxyGone if the Proxy is gone."""
        ...

    async def set_finalizer(self, obj: Obj, *, present: bool) -> Obj:
        """Add or remove our finalizer (metadata.finalizers), retrying conflicts. Returns the new object
        (or the last one seen if the object is gone after removal)."""
        ...

    async def read_secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """Decoded Secret data; None if the Secret does not exist."""
        ...

    async def read_secret_labels(self, namespace: str, name: str
                                 ) -> tuple[dict[str, str], dict[str, bytes]] | None:
        """The Secret's labels and decoded data in one read; None if it does not exist."""
        ...

    async def record_event(self, obj: Obj, *, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about `obj` (type_ Normal|Warning). Never raises: events are best effort."""
        ...
