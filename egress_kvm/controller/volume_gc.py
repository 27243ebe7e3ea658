"""Orphan-volume GC: the I/O around orphan_volumes.judge_volumes.

Each pass lists every zone's instance volumes (providers that can: `CollectsVolumes`), judges them
against the names the informer's Proxies claim, and, for the ones past their grace, confirms on a fresh
list of Proxies from the API server (the cache may lag) with the names those Proxies would create now
(`desired_instance`, as the domain GC spares them) before asking the provider to delete: the provider
deletes a volume only while no domain of its instance exists, under the instance's lock. Like the domain
GC it never acts before the informer's first full list, and a zone whose listing fails is skipped with
its clocks kept (a partial view is no view).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping

from egress_kvm.kube.interfaces import KubeApi, Obj, ProxyStore
from egress_kvm.log import Logger, get_logger
from egress_kvm.providers.base import CollectsVolumes, InstanceVolume, Provider, ProviderError

from .desired import desired_instance
from .gc import Collected
from .orphan_volumes import judge_volumes
from .proxyspec import EXTERNAL, parse_spec
from .status import Ref

#: (provider, zone) -> volume name -> monotonic time it was first seen orphaned
VolumeClocks = MutableMapping[tuple[str, str], dict[str, float]]


def claimed_names(proxies: list[Obj]) -> set[str]:
    """The instance names Proxies' status records (current and the one being replaced)."""
    names: set[str] = set()
    for obj in proxies:
        status = obj.get("status") or {}
        for field in ("instance", "previousInstance"):
            ref = Ref.from_status(status.get(field))
            if ref is not None:
                names.add(ref.name)
    return names


async def collect_orphan_volumes(*, providers: Mapping[str, Provider], store: ProxyStore, kube: KubeApi,
                                 grace_period: float, clocks: VolumeClocks, namespace: str | None = None,
                                 now: float | None = None, logger: Logger | None = None) -> list[Collected]:
    log = logger or get_logger("controller.gc")
    if not store.has_synced():
        return []
    now = time.monotonic() if now is None else now
    cached = [obj for key in store.keys() if (obj := store.get(key)) is not None]  # noqa: SIM118 - a ProxyStore
    claimed = frozenset(claimed_names(cached))
    due: list[tuple[str, Provider, InstanceVolume]] = []
    for pname, provider in providers.items():
        if not isinstance(provider, CollectsVolumes):
            continue
        for zone in provider.zones():
            try:
                listing = await provider.list_instance_volumes(zone)
            except ProviderError as e:  # the domain GC logs the outage; its clocks wait for a full view
                log.v(1).info("orphan volume GC skipped a zone: listing failed", provider=pname, zone=zone,
                              error=str(e))
                continue
            judged = judge_volumes(listing, claimed=claimed, namespace=namespace,
                                   seen=clocks.get((pname, zone), {}), now=now, grace=grace_period)
            clocks[(pname, zone)] = judged.seen
            due += [(pname, provider, v) for v in judged.due]
    if not due:
        return []
    fresh = await kube.list_proxies(namespace)  # the cache may lag behind a Proxy that claims one
    # A Proxy's instance name hashes its uid and its volumes carry its namespace: only Proxies of a due
    # volume's namespace can be about to create it, so only they are evaluated (each evaluation may read
    # a Secret: at 1,000 Proxies, one orphan must not cost 1,000 reads).
    namespaces = {v.owner_namespace for _, _, v in due}
    candidates = fresh if "" in namespaces else [
        p for p in fresh if p["metadata"].get("namespace") in namespaces]
    spared = claimed_names(fresh) | await _desired_names(candidates, providers=providers, kube=kube, log=log)
    collected: list[Collected] = []
    for pname, provider, vol in due:
        if vol.instance in spared:
            continue
        assert isinstance(provider, CollectsVolumes)
        try:
            deleted = await provider.delete_orphan_volume(vol)
        except ProviderError as e:
            log.error(e, "orphan GC could not delete a volume", provider=pname, zone=vol.zone,
                      volume=vol.name)
            continue
        if not deleted:
            continue  # its domain exists now: not an orphan after all
        clocks.get((pname, vol.zone), {}).pop(vol.name, None)
        reason = (f"a volume of instance {vol.instance} (namespace {vol.owner_namespace or '?'}): no domain "
                  f"and no Proxy claims it")
        log.info("orphan volume deleted", provider=pname, zone=vol.zone, volume=vol.name, reason=reason)
        collected.append(Collected(provider=pname, zone=vol.zone, name=vol.name, reason=reason))
    return collected


async def _desired_names(proxies: list[Obj], *, providers: Mapping[str, Provider], kube: KubeApi,
                         log: Logger) -> set[str]:
    """The names Proxies would create now (not yet in their status only if a create is about to start);
    a Proxy that cannot be evaluated cannot create either, so it spares nothing."""
    names: set[str] = set()
    for obj in proxies:
        if obj["metadata"].get("deletionTimestamp"):
            continue
        try:
            spec = parse_spec(obj.get("spec"))
            if spec.mode == EXTERNAL:
                continue
            names.add((await desired_instance(proxy=obj, spec=spec, providers=providers, kube=kube)).name)
        except Exception as e:
            log.v(1).info("orphan volume GC cannot compute a Proxy's instance name", reason=str(e),
                          proxy=f"{obj['metadata'].get('namespace')}/{obj['metadata'].get('name')}")
    return names
