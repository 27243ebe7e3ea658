"""Orphan GC: delete managed instances that no Proxy owns any more.

The reconciler deletes what a Proxy owns while the Proxy exists (finalizer, replacement). What escapes it:
instances whose Proxy was deleted while the operator was down with its finalizer removed by hand, and
instances a Proxy no longer names (a crash between a create and a status write, a replacement dropped by
a lost update). GC lists each zone's managed instances (`provider.list_managed(zone)`; libvirt has no
labels, the domain metadata carries the owner UID) and deletes one when

- its owner UID matches no Proxy in the informer's cache, confirmed by a fresh read of the owner by
  name (the cache may lag behind a Proxy just created), or
- its name is neither the owner's `status.instance` nor `status.previousInstance` nor the name the
  owner would get now (the reconciler may be about to create it), judged again on a fresh read of the
  owner before anything is deleted (the cache may hold an old spec and status).

It never acts before the informer's first full list (an empty cache would make everything look
orphaned), never on a zone whose listing failed (a partial view is no view), never on an instance
younger than the grace period or of unknown age (a Create in flight), never on an owner being deleted
(the finalizer handles it), and never outside the operator's namespace scope.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from egress_kvm.kube.interfaces import KubeApi, Obj, ProxyStore
from egress_kvm.log import Logger, get_logger
from egress_kvm.providers.base import Instance, Provider, ProviderError

from .desired import desired_instance
from .proxyspec import EXTERNAL, parse_spec
from .status import Ref


@dataclass(frozen=True)
class Collected:
    provider: str
    zone: str
    name: str
    reason: str


async def collect_orphans(*, providers: Mapping[str, Provider], store: ProxyStore, kube: KubeApi,
                          grace_period: float, namespace: str | None = None, now: datetime | None = None,
                          logger: Logger | None = None,
                          failing: set[tuple[str, str]] | None = None) -> list[Collected]:
    """`failing`: the (provider, zone) pairs whose listing failed on the last pass, kept by the caller
    across passes, so a host that is down logs one ERROR line per outage, not one per interval."""
    log = logger or get_logger("controller.gc")
    failing = failing if failing is not None else set()
    if not store.has_synced():
        log.v(1).info("orphan GC skipped: Proxies not listed yet")
        return []
    now = now or datetime.now(UTC)
    owners: dict[str, Obj] = {}
    for key in store.keys():  # noqa: SIM118 - a ProxyStore, not a dict
        obj = store.get(key)
        if obj is not None and obj["metadata"].get("uid"):
            owners[obj["metadata"]["uid"]] = obj
    desired_names: dict[str, str | None] = {}
    collected: list[Collected] = []
    for pname, provider in providers.items():
        for zone in provider.zones():
            try:
                instances = await provider.list_managed(zone)
            except ProviderError as e:
                if (pname, zone) in failing:
                    log.v(1).info("orphan GC skipped a zone: listing still fails", provider=pname, zone=zone,
                                  error=str(e))
                else:
                    failing.add((pname, zone))
                    log.error(e, "orphan GC skipped a zone: listing failed", provider=pname, zone=zone)
                continue
            if (pname, zone) in failing:
                failing.discard((pname, zone))
                log.info("orphan GC lists the zone again", provider=pname, zone=zone)
            for inst in instances:
                reason = await _orphan_reason(inst, owners=owners, kube=kube, providers=providers,
                                              grace=timedelta(seconds=grace_period), now=now,
                                              namespace=namespace, desired_names=desired_names, log=log)
                if reason is None:
                    continue
                try:
                    await provider.delete(inst.name, inst.zone, owner_uid=inst.owner_uid or None)
                except ProviderError as e:
                    log.error(e, "orphan GC could not delete an instance", provider=pname, zone=inst.zone,
                              instance=inst.name)
                    continue
                log.info("orphan instance deleted", provider=pname, zone=inst.zone, instance=inst.name,
                         reason=reason)
                collected.append(Collected(provider=pname, zone=inst.zone, name=inst.name, reason=reason))
    return collected


async def _orphan_reason(inst: Instance, *, owners: dict[str, Obj], kube: KubeApi,
                         providers: Mapping[str, Provider], grace: timedelta, now: datetime,
                         namespace: str | None, desired_names: dict[str, str | None],
                         log: Logger) -> str | None:
    """Why `inst` should be collected, or None to spare it."""
    if inst.created_at is None:
        log.v(1).info("orphan GC spares an instance of unknown age", instance=inst.name, zone=inst.zone)
        return None
    created = inst.created_at if inst.created_at.tzinfo else inst.created_at.replace(tzinfo=UTC)
    if now - created < grace:
        return None
    if namespace and inst.owner_namespace != namespace:
        return None  # not ours to judge: another scope's operator may own it
    owner = owners.get(inst.owner_uid)
    if owner is not None:
        reason = await _judge(inst, owner, providers=providers, kube=kube, desired_names=desired_names,
                              log=log)
        if reason is None:
            return None
        # The cache may be stale (a watch that stalls still counts as synced): a delete is decided on
        # a fresh read of the owner, never on the cached one alone.
        meta = owner["metadata"]
        fresh = await kube.get_proxy(meta.get("namespace", ""), meta.get("name", ""))
    elif inst.owner_namespace and inst.owner_name:
        fresh = await kube.get_proxy(inst.owner_namespace, inst.owner_name)
    else:
        fresh = None
    if fresh is None or fresh["metadata"].get("uid") != inst.owner_uid:
        who = f"{inst.owner_namespace}/{inst.owner_name}" if inst.owner_name else "?"
        return f"its Proxy {who} (uid {inst.owner_uid}) no longer exists"
    return await _judge(inst, fresh, providers=providers, kube=kube, desired_names={}, log=log)


async def _judge(inst: Instance, owner: Obj, *, providers: Mapping[str, Provider], kube: KubeApi,
                 desired_names: dict[str, str | None], log: Logger) -> str | None:
    """Why `inst` is not an instance of its existing `owner`, or None if it may be."""
    meta = owner["metadata"]
    if meta.get("deletionTimestamp"):
        return None  # the finalizer deletes it
    status = owner.get("status") or {}
    named = {r.name for r in (Ref.from_status(status.get("instance")),
                              Ref.from_status(status.get("previousInstance"))) if r is not None}
    if inst.name in named:
        return None
    uid = meta.get("uid", "")
    if uid not in desired_names:
        desired_names[uid] = await _desired_name(owner, providers=providers, kube=kube, log=log)
    desired = desired_names[uid]
    if desired is None or desired == inst.name:
        return None  # cannot tell what it would be now: spare rather than guess
    return (f"not an instance of Proxy {meta.get('namespace')}/{meta.get('name')} (it names "
            f"{sorted(named) or 'none'} and would create {desired})")


async def _desired_name(owner: Obj, *, providers: Mapping[str, Provider], kube: KubeApi,
                        log: Logger) -> str | None:
    try:
        spec = parse_spec(owner.get("spec"))
        if spec.mode == EXTERNAL:
            return ""  # wants no instance at all
        return (await desired_instance(proxy=owner, spec=spec, providers=providers, kube=kube)).name
    except Exception as e:  # a Proxy we cannot evaluate keeps everything it may own
        log.v(1).info("orphan GC cannot compute a Proxy's instance name; sparing its instances",
                      proxy=f"{owner['metadata'].get('namespace')}/{owner['metadata'].get('name')}",
                      reason=str(e))
        return None
