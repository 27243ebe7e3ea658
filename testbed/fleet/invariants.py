"""The fleet's invariants, decided from one snapshot (no I/O): what converged, what is stuck, what leaked.

A snapshot is the Proxies the API holds (name -> ProxyView), the Proxies the run expects to exist and
those it deleted, the hosts that are alive, and each host's domains and volumes as its simulator reports
them. The checks:

- every expected Proxy whose zone is alive is Ready (phase Ready, Healthy True);
- its status instance is a running domain on that zone;
- every deleted Proxy is gone from the API;
- no host holds a domain (under any name: the fleet's hosts are ours alone) that no Proxy's instance or
  previousInstance names on that host (a Proxy's name on another host does not own it);
- no host holds a volume that is neither a base image (`base-...`) or its marker nor an overlay or seed
  of an instance some Proxy names on that host (a half-made or forgotten disk under any name counts);
- no host holds a half-imported base: a base without its marker, a marker without its base, or a marker
  that holds no digest (its size is not a sha256's): an import interrupted and left behind (the next
  import of that image on that host would redo it, but if no Proxy needs it there any more, none comes).

Each check reports how many it looked at and which failed, so a run prints counts, not just a verdict.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from testbed.fleet.kube import ProxyView

INSTANCE_PREFIX = "proxy-"  # egress_kvm.controller.naming.PREFIX
VOLUME_SUFFIXES = (".qcow2", "-seed.iso")  # egress_kvm.providers.kvm.naming: overlay, seed
BASE_PREFIX = "base-"
MARKER_SUFFIX = ".sha256"  # egress_kvm.providers.kvm.naming.marker_volume: a base is finished once it has one
DIGEST_LEN = 64  # egress_kvm.providers.kvm.images.DIGEST_LEN: a finished marker's size


@dataclass
class Check:
    name: str
    looked_at: int
    failed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def line(self) -> str:
        shown = ", ".join(self.failed[:5]) + (" ..." if len(self.failed) > 5 else "")
        verdict = "ok  " if self.ok else "FAIL"
        detail = f" ({shown})" if shown else ""
        return f"{verdict} {self.name}: {len(self.failed)} of {self.looked_at}{detail}"


@dataclass
class Snapshot:
    proxies: dict[str, ProxyView]
    expected: set[str]
    deleted: set[str]
    alive_hosts: set[str]
    zones: dict[str, str]  # expected Proxy -> the host it was placed on (spec.placement.zone)
    hosts: dict[str, dict[str, Any]]  # host -> simulator state (domains [{name, state}], volumes [{name}])


def volume_owner(volume: str) -> str | None:
    """The instance a volume belongs to by its name (overlay or seed: `<instance>.<namespace>.<tag>` or the
    older `<instance>` before the suffix; instance names hold no `.`), None for any other name."""
    for suffix in VOLUME_SUFFIXES:
        if volume.endswith(suffix) and volume.startswith(INSTANCE_PREFIX):
            return volume[: -len(suffix)].split(".", 1)[0]
    return None


def owned(proxies: Iterable[ProxyView]) -> set[tuple[str, str]]:
    """(host, instance) pairs some Proxy names as its instance or previousInstance."""
    return {(zone, name) for v in proxies
            for zone, name in ((v.zone, v.instance), (v.previous_zone, v.previous)) if name}


def check(s: Snapshot) -> list[Check]:
    running = {h: {d["name"] for d in st["domains"] if d["state"] == "running"} for h, st in s.hosts.items()}
    considered = sorted(n for n in s.expected if s.zones.get(n) in s.alive_hosts)
    not_ready = [n for n in considered if not (s.proxies.get(n) and s.proxies[n].ready)]
    no_vm = [n for n in considered if not (s.proxies.get(n) and s.proxies[n].zone == s.zones[n] and
                                           s.proxies[n].instance in running.get(s.zones[n], set()))]
    not_gone = sorted(n for n in s.deleted if n in s.proxies)
    mine = owned(s.proxies.values())
    leaked_domains = [f"{h}/{d['name']}" for h, st in sorted(s.hosts.items()) for d in st["domains"]
                      if (h, d["name"]) not in mine]
    all_volumes = [(h, v["name"]) for h, st in sorted(s.hosts.items()) for v in st["volumes"]]
    leaked_volumes = [f"{h}/{v}" for h, v in all_volumes
                      if not v.startswith(BASE_PREFIX) and (h, volume_owner(v)) not in mine]
    n_domains = sum(len(st["domains"]) for st in s.hosts.values())
    return [
        Check("expected Proxies on live hosts not Ready", len(considered), not_ready),
        Check("expected Proxies on live hosts without a running domain", len(considered), no_vm),
        Check("deleted Proxies still in the API", len(s.deleted), not_gone),
        Check("domains no Proxy owns (leaked)", n_domains, leaked_domains),
        Check("volumes no Proxy owns (leaked)", len(all_volumes), leaked_volumes),
        half_imported(s.hosts),
    ]


def half_imported(hosts: dict[str, dict[str, Any]]) -> Check:
    """Base images and markers an interrupted import left (checked when nothing imports: after
    convergence, after delete): a base without its marker, a marker without its base, a marker whose
    size is not a digest's (created empty, its upload cut). Looked at: every `base-...` volume."""
    sizes = {h: {v["name"]: v.get("capacity") for v in st["volumes"]} for h, st in hosts.items()}
    failed: list[str] = []
    looked = 0
    for h, vols in sorted(sizes.items()):
        for v, size in sorted(vols.items()):
            if not v.startswith(BASE_PREFIX):
                continue
            looked += 1
            if v.endswith(MARKER_SUFFIX):
                if v.removesuffix(MARKER_SUFFIX) not in vols:
                    failed.append(f"{h}/{v} (no base)")
                elif size != DIGEST_LEN:
                    failed.append(f"{h}/{v} ({size} bytes, no digest)")
            elif v + MARKER_SUFFIX not in vols:
                failed.append(f"{h}/{v} (no marker)")
    return Check("half-imported base images (an interrupted import left behind)", looked, failed)


def empty_hosts(hosts: dict[str, dict[str, Any]]) -> Check:
    """After every Proxy is deleted: no domain and no volume but base images on any host."""
    left = [f"{h}/{d['name']}" for h, st in sorted(hosts.items()) for d in st["domains"]]
    left += [f"{h}/{v['name']}" for h, st in sorted(hosts.items()) for v in st["volumes"]
             if not v["name"].startswith(BASE_PREFIX)]
    looked = sum(len(st["domains"]) + len(st["volumes"]) for st in hosts.values())
    return Check("domains and volumes left on the hosts after deleting every Proxy", looked, left)
