"""The fleet's invariant checks (testbed/fleet/invariants.py) as tables: each case is one snapshot and
the failures each check must report, so a leak or a stuck Proxy cannot go uncounted."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.fleet.invariants import Snapshot, check, empty_hosts, volume_owner
from testbed.fleet.kube import ProxyView

READY = ProxyView(phase="Ready", ready=True, instance="proxy-a", zone="h0")


def host(domains: tuple[tuple[str, str], ...] = (), volumes: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"domains": [{"name": n, "state": s} for n, s in domains],
            "volumes": [{"name": v} for v in volumes]}


CONVERGED_H0 = host((("proxy-a", "running"),),
                    ("proxy-a.qcow2", "proxy-a-seed.iso", "base-fleet.qcow2", "base-fleet.qcow2.sha256"))


def snap(proxies: dict[str, ProxyView], *, expected: frozenset[str] = frozenset({"a"}),
         deleted: frozenset[str] = frozenset(), alive: frozenset[str] = frozenset({"h0", "h1"}),
         hosts: dict[str, Any] | None = None) -> Snapshot:
    return Snapshot(proxies=proxies, expected=set(expected), deleted=set(deleted), alive_hosts=set(alive),
                    zones={"a": "h0", "b": "h1"},
                    hosts=hosts if hosts is not None else {"h0": CONVERGED_H0, "h1": host()})


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
     snap({"a": ProxyView(phase="Ready", ready=True, instance="proxy-a", zone="h0", previous="proxy-old")},
          hosts={"h0": host((("proxy-a", "running"), ("proxy-old", "running")),
                            ("proxy-a.qcow2", "proxy-old.qcow2")), "h1": host()}), {}),
    ("a base image without its marker: an import interrupted and left behind",
     snap({"a": READY}, hosts={"h0": CONVERGED_H0, "h1": host((), ("base-fleet.qcow2",))}),
     {"base images without their marker (an interrupted import left behind)": ["h1/base-fleet.qcow2"]}),
    ("a domain not named as ours is not counted",
     snap({"a": READY}, hosts={"h0": host((("proxy-a", "running"), ("someone-elses", "running")),
                                          ("proxy-a.qcow2",)), "h1": host()}), {}),
]


@pytest.mark.parametrize(("case", "snapshot", "want"), CASES, ids=[c[0] for c in CASES])
def test_check(case: str, snapshot: Snapshot, want: dict[str, list[str]]) -> None:
    assert failures(snapshot) == want


def test_counts_what_it_looked_at() -> None:
    counts = {c.name: c.looked_at for c in check(snap({"a": READY}, deleted=frozenset({"x", "y"})))}
    assert counts == {"expected Proxies on live hosts not Ready": 1,
                      "expected Proxies on live hosts without a running domain": 1,
                      "deleted Proxies still in the API": 2, "domains no Proxy owns (leaked)": 1,
                      "volumes no Proxy owns (leaked)": 4,
                      "base images without their marker (an interrupted import left behind)": 1}


@pytest.mark.parametrize(("volume", "owner"), [("proxy-a.qcow2", "proxy-a"), ("proxy-a-seed.iso", "proxy-a"),
                                               ("base-fleet.qcow2", None), ("proxy-a.raw", None),
                                               ("other.qcow2", None)])
def test_volume_owner(volume: str, owner: str | None) -> None:
    assert volume_owner(volume) == owner


def test_empty_hosts() -> None:
    assert empty_hosts({"h0": host((), ("base-fleet.qcow2", "base-fleet.qcow2.sha256"))}).failed == []
    assert empty_hosts({"h0": host((("proxy-a", "shutoff"),), ("proxy-a.qcow2", "base-x.qcow2"))}).failed == [
        "h0/proxy-a", "h0/proxy-a.qcow2"]
