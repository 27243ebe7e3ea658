"""Which Proxies a host's instance event concerns: a pure lookup over the Proxies the controller caches.

An event names a domain on a zone of a provider. It is ours when a Proxy of this cluster records that
instance (`status.instance`, or `status.previousInstance` while a replacement runs) on that provider and
zone: instance names hash the Proxy's UID, so another cluster's domain on a shared host (or a domain of
nobody's) matches no Proxy here, and costs nothing but this lookup (no RPC). The reconcile the event
triggers reads the domain and its metadata fresh, as always, so a wrong match would cost one reconcile,
never an action on someone else's VM. Status written before a create records the name, so even a VM
whose create is still running is found.
"""

from __future__ import annotations

from collections.abc import Iterable

from egress_kvm.kube.interfaces import Key, Obj
from egress_kvm.providers.base import AgentState

INSTANCE_FIELDS = ("instance", "previousInstance")


def keys_for(*, provider: str, zone: str, name: str | None, proxies: Iterable[tuple[Key, Obj | None]]
             ) -> list[Key]:
    """The keys whose recorded instances run on `provider`/`zone` and, given `name`, are named so (None:
    every Proxy on that zone). A reference without `provider` (written before the field existed) matches
    any provider. The definition: the controller asks instanceindex.py, which answers the same without
    scanning every Proxy per event (its tests compare the two)."""
    out: list[Key] = []
    for key, obj in proxies:
        status = (obj or {}).get("status") or {}
        for field in INSTANCE_FIELDS:
            ref = status.get(field) or {}
            if not isinstance(ref, dict) or ref.get("zone") != zone:
                continue
            if ref.get("provider", provider) not in (provider, ""):
                continue
            if name is None or ref.get("name") == name:
                out.append(key)
                break
    return out


def wakes_now(*, failures: int, restarts: int) -> bool:
    """Whether an instance event reconciles its Proxy at once. Not while its reconciles are failing
    (`failures`: the operator's own cleanup of a failed create sends STOPPED/UNDEFINED events, and
    reconciling on them would retry at once, defeating the backoff) nor while it is in a restart loop
    (`restarts` since it was last Ready: a guest that dies at boot would be started again on each STOPPED
    event, defeating the growing restart delay). Those keys are already scheduled by their backoff."""
    return failures == 0 and restarts == 0


def agent_wakes(*, state: AgentState, target: bool, ip_waits: int, failures: int) -> bool:
    """Whether a guest agent event reconciles its Proxy at once: the agent `state` is CONNECTED (the guest
    booted far enough to report its addresses), the instance is the Proxy's `target` (status.instance,
    not a previousInstance being replaced), its last reconcile found it running without an address
    (`ip_waits` > 0: it waits on the IP timer, planner.py), and its reconciles are not failing (the
    backoff schedules those). Anything else waits for its timer, as without events."""
    return state is AgentState.CONNECTED and target and ip_waits > 0 and failures == 0
