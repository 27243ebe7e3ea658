"""Which instance volumes are orphans: the decision of orphan-volume GC, pure (volume_gc.py does the I/O).

A crash between creating an instance's volumes and defining its domain leaves an overlay and a seed that
no domain listing shows. The provider lists the volumes this cluster provably made (their names carry a
cluster-keyed tag, providers/kvm/naming.py) and every domain's name on the host; a volume is an orphan
when

- no domain of its instance exists on that host (a domain's volumes go with it, through the domain GC or
  the finalizer),
- no Proxy claims its instance (`status.instance` or `status.previousInstance`: written before any
  create, so a create in flight is claimed; volume_gc.py adds the names Proxies would create now before
  anything is deleted),
- it is within the operator's namespace scope (the owner's namespace is in the volume's name), and
- it has been seen as such, continuously, for the grace period. Volumes carry no creation time, so the
  clock is when this process first saw it unclaimed: a restart starts it again, which only delays.

A volume that stops being an orphan (a domain appears, a Proxy claims it) loses its clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from egress_kvm.providers.base import InstanceVolume, VolumeListing


@dataclass(frozen=True)
class Judged:
    due: tuple[InstanceVolume, ...]  # orphans past their grace: to delete
    seen: dict[str, float]  # volume name -> when first seen orphaned: the zone's clocks from now on


def judge_volumes(listing: VolumeListing, *, claimed: frozenset[str], namespace: str | None,
                  seen: Mapping[str, float], now: float, grace: float) -> Judged:
    """One zone's listing judged; `seen` is the zone's clocks from the previous pass (monotonic times)."""
    due: list[InstanceVolume] = []
    clocks: dict[str, float] = {}
    for vol in listing.volumes:
        if vol.instance in listing.domains or vol.instance in claimed:
            continue
        if namespace and vol.owner_namespace != namespace:
            continue  # another scope's operator judges it
        first = seen.get(vol.name, now)
        clocks[vol.name] = first
        if now - first >= grace:
            due.append(vol)
    return Judged(due=tuple(due), seen=clocks)
