"""The fleet's invariant checks (testbed/fleet/invariants.py) as tables: each case is one snapshot and
the failures each check must report, so a leak or a stuck Proxy cannot go uncounted."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.fleet.invariants import Snapshot, check, empty_hosts, volume_owner
from testbed.fleet.kube import ProxyView

READY = ProxyView(phase="Ready", ready=True, instance="proxy-a", zone="h0")


def host(domains: tuple[tuple[str, str], ...] = (), volumes: tuple[str | tuple[str, int], ...] = ()
         ) -> dict[str, Any]:
    """A simulator's state; a volume is a name (a marker then holds its digest: 64 bytes) or (name, size)."""
    vols = [v if isinstance(v, tuple) else (v, 64 if v.endswith(".sha256") else 1) for v in volumes]
    return {"domains": [{"name": n, "state": s} for n, s in domains],
            "volumes": [{"name": n, "capacity": c} for n, c in vols]}


CONVERGED_H0 = host((("proxy-a", "running"),),
                    ("proxy-a.qcow2", "proxy-a-seed.iso", "base-fleet.qcow2", "base-fleet.qcow2.sha256"))


def snap(proxies: dict[str, ProxyView], *, expected: frozenset[str] = frozenset({"a"}),
         deleted: frozenset[str] = frozenset(), alive: frozenset[str] = frozenset({"h0", "h1"}),
         hosts: dict[str, Any] | None = None) -> Snapshot:
    return Snapshot(proxies=proxies, expected=set(expected), deleted=set(deleted), alive_hosts=set(alive),
                    zones={"a": "h0", "b": "h1"},
                    hosts=hosts if hosts is not None else {"h0": CONVERGED_H0, "h1": host()})


HALF = "half-imported base images (an interrupted import left behind)"


def failures(s: Snapshot) -> dict[str, list[str]]:
    return {c.name: c.failed for c in check(s) if c.failed}


CASES = [
    ("converged: one Ready Proxy with its domain and disks, bases kept", snap({"a": READY}), {}),
    ("a Proxy not Ready", snap({"a": ProxyView(phase="Provisioning", instance="proxy-a", zone="h0")}),
     {"expected Proxies on live hosts not Ready": ["a"]}),
    ("a Ready Proxy whose domain is shut off",
     snap({"a": READY}, hosts={"h0": host((("proxy-a", "shutoff"),), ("proxy-a.qcow2",)), "h1": host()}),
     {"expected Proxies on live hosts without a running domain": ["a"]}),
    ("a missing Proxy", snap({}), {"expected Proxies on live hosts not Ready": ["a"],
                                   "expected Proxies on live hosts without a running domain": ["a"],
                                   "domains no Proxy owns (leaked)": ["h0/proxy-a"],
                                   "volumes no Proxy owns (leaked)": ["h0/proxy-a.qcow2",
                                                                      "h0/proxy-a-seed.iso"]}),
    ("a Proxy on a dead host is not expected Ready",
     snap({}, expected=frozenset({"b"}), alive=frozenset({"h0"}), hosts={"h0": host(), "h1": host()}), {}),
    ("a deleted Proxy still in the API",
     snap({"a": READY, "b": ProxyView(phase="Deleting")}, deleted=frozenset({"b"})),
     {"deleted Proxies still in the API": ["b"]}),
    ("an orphan domain and its disks",
     snap({"a": READY}, hosts={"h0": host((("proxy-a", "running"),), ("proxy-a.qcow2",)),
                               "h1": host((("proxy-z", "shutoff"),), ("proxy-z.qcow2", "proxy-z-seed.iso"))}),
     {"domains no Proxy owns (leaked)": ["h1/proxy-z"],
      "volumes no Proxy owns (leaked)": ["h1/proxy-z.qcow2", "h1/proxy-z-seed.iso"]}),
    ("a volume under any other name is a leak (a half-made upload)",
     snap({"a": READY}, hosts={"h0": host((("proxy-a", "running"),), ("proxy-a.qcow2", "upload.tmp")),
                               "h1": host()}),
     {"volumes no Proxy owns (leaked)": ["h0/upload.tmp"]}),
    ("previousInstance owns its VM mid-replacement",
     snap({"a": ProxyView(phase="Ready", ready=True, instance="proxy-a", zone="h0", previous="proxy-old",
                          previous_zone="h0")},
          hosts={"h0": host((("proxy-a", "running"), ("proxy-old", "running")),
                            ("proxy-a.qcow2", "proxy-old.qcow2")), "h1": host()}), {}),
    ("a base image without its marker: an import interrupted and left behind",
     snap({"a": READY}, hosts={"h0": CONVERGED_H0, "h1": host((), ("base-fleet.qcow2",))}),
     {HALF: ["h1/base-fleet.qcow2 (no marker)"]}),
    ("a marker without its base", snap({"a": READY}, hosts={"h0": CONVERGED_H0, "h1": host((), (
        "base-fleet.qcow2.sha256",))}), {HALF: ["h1/base-fleet.qcow2.sha256 (no base)"]}),
    ("a marker created but its digest never written (an upload cut)",
     snap({"a": READY}, hosts={"h0": CONVERGED_H0, "h1": host((), ("base-fleet.qcow2",
                                                                   ("base-fleet.qcow2.sha256", 0)))}),
     {HALF: ["h1/base-fleet.qcow2.sha256 (0 bytes, no digest)"]}),
    ("a domain under any name is counted (the fleet's hosts are ours alone)",
     snap({"a": READY}, hosts={"h0": host((("proxy-a", "running"), ("someone-elses", "running")),
                                          ("proxy-a.qcow2",)), "h1": host()}),
     {"domains no Proxy owns (leaked)": ["h0/someone-elses"]}),
    ("a Proxy's instance name owns it on its own host only: a copy on another host is a leak",
     snap({"a": READY}, hosts={"h0": CONVERGED_H0,
                               "h1": host((("proxy-a", "shutoff"),), ("proxy-a.qcow2", "proxy-a-seed.iso"))}),
     {"domains no Proxy owns (leaked)": ["h1/proxy-a"],
      "volumes no Proxy owns (leaked)": ["h1/proxy-a.qcow2", "h1/proxy-a-seed.iso"]}),
    ("a previousInstance owns its VM on its own zone only",
     snap({"a": ProxyView(phase="Ready", ready=True, instance="proxy-a", zone="h0", previous="proxy-old",
                          previous_zone="h0")},
          hosts={"h0": CONVERGED_H0, "h1": host((("proxy-old", "running"),), ("proxy-old.qcow2",))}),
     {"domains no Proxy owns (leaked)": ["h1/proxy-old"],
      "volumes no Proxy owns (leaked)": ["h1/proxy-old.qcow2"]}),
    ("a Ready Proxy whose status names another host than its placement",
     snap({"a": ProxyView(phase="Ready", ready=True, instance="proxy-a", zone="h1")},
          hosts={"h0": host(), "h1": CONVERGED_H0}),
     {"expected Proxies on live hosts without a running domain": ["a"]}),
]


@pytest.mark.parametrize(("case", "snapshot", "want"), CASES, ids=[c[0] for c in CASES])
def test_check(case: str, snapshot: Snapshot, want: dict[str, list[str]]) -> None:
    assert failures(snapshot) == want


def test_counts_what_it_looked_at() -> None:
    counts = {c.name: c.looked_at for c in check(snap({"a": READY}, deleted=frozenset({"x", "y"})))}
    assert counts == {"expected Proxies on live hosts not Ready": 1,
                      "expected Proxies on live hosts without a running domain": 1,
                      "deleted Proxies still in the API": 2, "domains no Proxy owns (leaked)": 1,
                      "volumes no Proxy owns (leaked)": 4, HALF: 2}


@pytest.mark.parametrize(("volume", "owner"), [("proxy-a.qcow2", "proxy-a"), ("proxy-a-seed.iso", "proxy-a"),
                                               ("base-fleet.qcow2", None), ("proxy-a.raw", None),
                                               ("other.qcow2", None)])
def test_volume_owner(volume: str, owner: str | None) -> None:
    assert volume_owner(volume) == owner


def test_empty_hosts() -> None:
    assert empty_hosts({"h0": host((), ("base-fleet.qcow2", "base-fleet.qcow2.sha256"))}).failed == []
    assert empty_hosts({"h0": host((("proxy-a", "shutoff"),), ("proxy-a.qcow2", "base-x.qcow2"))}).failed == [
        "h0/proxy-a", "h0/proxy-a.qcow2"]
