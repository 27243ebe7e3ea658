"""Quota and cluster identity on a real host (issue 9 item 8): two clusters share one lab host.

Two clusters are two `egress-kvm emulator` processes, each with its own operator process (`egress-kvm
run`, GC every 5 s with a 15 s grace); each operator's cluster id is its own cluster's (the uid of its
emulator's kube-system Namespace, read at start, as in a real cluster). Both use the lab's host0, whose
pool starts on a 1.5 GiB tmpfs (testbed/lab/pool.py): room for the base image and the 1 GiB reserve,
none for a 10 GiB overlay. Each cluster has a Proxy of the same name, `default/shared`. The steps run in
order on one stack and build on each other (one VM per cluster). No guest is waited for to boot: what quota
and identity can break is whether a VM is created and whose it is; a booted guest becoming Ready is
test_e2e.py's subject (the fault campaign converges the same way), and two software-emulated boots in
parallel would be most of this module's time.

1. Cluster A's Proxy finds no room: QuotaExceeded, its status message names host, pool, the space
   available (libvirt's own figure, the reserve) and what the VM needs; the retry is on the quota
   backoff (60 s, from the operator's log), not the transient one.
2. The pool grows (a tmpfs remount: space freed outside libvirt, no `virsh pool-refresh`): A's Proxy
   gets its VM (created and running, QuotaExceeded gone) after that one quota backoff step; B's Proxy of
   the same name gets its own beside it, another VM (names are keyed with the cluster id), each domain
   carrying its own cluster's id.
3. Both GCs run past the grace period and each lists both domains: neither deletes, stops or redefines
   the other's domain (same UUID, running) or touches its volumes.
4. Deleting B's Proxy removes B's VM and volumes only.
5. A leftover of cluster A (operator A stopped, the Proxy's finalizer dropped, the Proxy deleted): B's GC
   keeps listing it and leaves it alone; operator A, started again, collects it.

Volumes: step 3 and 5 assert each cluster's overlay and seed survive the other's GC passes. Orphan-volume
GC (volumes without a domain) does not exist yet on main; once it does, step 5 gains a case where the
leftover is volumes alone.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from e2e_stack import OPERATOR_FLAGS as STACK_FLAGS
from e2e_stack import Stack, domains, lab_base, log_records, volumes, wait_until

from egress_kvm.providers.kvm import naming
from egress_kvm.providers.kvm.capacity import fmt_bytes
from testbed import lab as labmod
from testbed.lab.pool import set_pool_size

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

HOST = "host0"
NAME = "shared"  # the same Proxy name in both clusters
POOL_MIB = 1536  # the base image (~235 MiB) and the 1 GiB reserve fit; a 10 GiB overlay does not
GROWN_MIB = 16 * 1024
GC_GRACE = 15.0  # OPERATOR_FLAGS (e2e_stack's, grace 15 s not 30): a GC pass proves something past it
OPERATOR_FLAGS = [f"{GC_GRACE:.0f}s" if prev == "--gc-grace-period" else f
                  for prev, f in zip(["", *STACK_FLAGS], STACK_FLAGS, strict=False)]
QUOTA_FIRST_STEP = 60.0  # egress_kvm.controller.queue.QUOTA_BACKOFF.base
META_NS = "https://egressproxies.io/kvm/v1"
QUOTA_MSG = re.compile(
    r"^out of capacity: host '(?P<host>[^']+)' pool '(?P<pool>[^']+)' "
    r"has (?P<avail>[\d.]+) (?P<aunit>MiB|GiB) available "
    r"\((?P<reserve>[\d.]+ GiB) of it kept in reserve, poolReserveGb\), "
    r"VM '(?P<vm>proxy-[^']+)' \(overlay \+ seed\) needs (?P<need>[\d.]+) (?P<nunit>MiB|GiB)$")


class Clusters:
    def __init__(self, lab: labmod.LabInfo, a: Stack, b: Stack) -> None:
        self.lab, self.a, self.b = lab, a, b
        self.failed: str | None = None
        self.times: dict[str, float] = {}
        self.pool_small = False
        self.quota_vm = ""  # the VM the quota message named

    @property
    def both(self) -> tuple[Stack, Stack]:
        return self.a, self.b


@pytest.fixture(scope="module")
def clusters(lab, tmp_path_factory):
    a = Stack(lab, tmp_path_factory.mktemp("cluster-a"), operator_flags=OPERATOR_FLAGS)
    b = Stack(lab, tmp_path_factory.mktemp("cluster-b"), operator_flags=OPERATOR_FLAGS)
    cl = Clusters(lab, a, b)
    try:
        a.start()  # empties host pools first
        b.start()
        set_pool_size(lab, HOST, POOL_MIB)  # on the emptied pool
        cl.pool_small = True
        yield cl
    finally:
        a.close()  # operators, emulator; empties the pools (both clusters' VMs)
        b.close()
        if cl.pool_small:
            set_pool_size(lab, HOST, None)
        print("\n=== two clusters: step times ===")
        for name, seconds in cl.times.items():
            print(f"  {name:<70} {seconds:7.1f}s")
        print(f"  logs: {a.workdir} {b.workdir}")


@pytest.fixture
def step(clusters, request):
    if clusters.failed:
        pytest.skip(f"an earlier step failed ({clusters.failed})")
    t0 = time.monotonic()
    yield clusters
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        clusters.failed = request.node.name
    clusters.times[request.node.name] = time.monotonic() - t0
    print(f"\ntwo clusters {request.node.name}: {clusters.times[request.node.name]:.1f}s")


def cluster_id(st: Stack) -> str:
    starts = wait_until(lambda: st.log_msgs("operator starting"), timeout=60,
                        what="the operator's 'operator starting' line")
    return str(starts[-1]["clusterID"])


def instance(st: Stack) -> str:
    return str(st.status(NAME)["instance"]["name"])


def created(st: Stack) -> str:
    """Wait until the Proxy's VM is made: its status names an instance, that domain runs on HOST, and the
    Ready condition no longer says QuotaExceeded. Returns the instance's name."""
    def made() -> str | None:
        s = st.status(NAME)
        name = (s.get("instance") or {}).get("name")
        ready = [c for c in s.get("conditions", []) if c.get("type") == "Ready"]
        if not name or not ready or ready[0].get("reason") == "QuotaExceeded":
            return None
        if name not in domains(st.lab, HOST):
            return None
        return str(name) if labmod.virsh(st.lab, HOST, "domstate", name).strip() == "running" else None
    return wait_until(made, timeout=300, what=f"Proxy {NAME}'s VM created and running", interval=2)


def domain_facts(lab: labmod.LabInfo, name: str) -> dict[str, Any]:
    """What another cluster's GC must not change: identity, state, owner metadata, volumes."""
    meta = labmod.virsh(lab, HOST, "metadata", name, META_NS)
    vols = set(volumes(lab, HOST))
    return {"uuid": labmod.virsh(lab, HOST, "domuuid", name).strip(),
            "state": labmod.virsh(lab, HOST, "domstate", name).strip(),
            "cluster": re.search(r"<cluster>([^<]*)</cluster>", meta).group(1),  # type: ignore[union-attr]
            "created": re.search(r"<created>([^<]*)</created>", meta).group(1),  # type: ignore[union-attr]
            "volumes": sorted(v for v in vols if v.startswith(name))}


def listings(st: Stack) -> list[dict[str, Any]]:
    """The operator's domain listings of HOST (GC's `list_managed`), from its debug `libvirt call` lines."""
    return [r for r in log_records(st.all_log_lines())
            if r.get("msg") == "libvirt call" and r.get("host") == HOST
            and r.get("method") == "connect_list_all_domains" and "error" not in r]


def gc_attempts(st: Stack) -> list[dict[str, Any]]:
    """Every delete the operator's GC made or tried. Another cluster's domain must never get this far:
    list_managed leaves it out (the provider's delete would also refuse it, a second line of defence
    that must not be the one holding)."""
    return [*st.log_msgs("orphan instance deleted"), *st.log_msgs("orphan GC could not delete an instance")]


def wait_listings(st: Stack, *, after: int, more: int, seeing: int) -> None:
    """`more` listings after the first `after`, each of them seeing `seeing` domains on the host."""
    def enough() -> bool:
        new = listings(st)[after:]
        return len(new) >= more and all(r.get("count") == seeing for r in new)
    wait_until(enough, timeout=120, what=f"{more} GC listings seeing {seeing} domains", interval=1)


def test_1_no_room_is_quota_exceeded_naming_pool_and_sizes_on_the_slow_backoff(step):
    a = step.a
    ids = {cluster_id(a), cluster_id(step.b)}
    assert len(ids) == 2, ids  # two clusters, two ids
    a.kubectl.apply(a.proxy(NAME, zone=HOST))

    def quota() -> dict[str, Any] | None:
        s = a.status(NAME)
        ready = [c for c in s.get("conditions", []) if c.get("type") == "Ready"]
        return s if ready and ready[0].get("reason") == "QuotaExceeded" else None
    st = wait_until(quota, timeout=300, what="A's Proxy QuotaExceeded", interval=2)
    msg = st["message"]
    print(f"\n[quota] phase {st['phase']}: {msg}")
    m = QUOTA_MSG.match(msg)
    assert m, msg
    assert (m["host"], m["pool"], m["reserve"]) == (HOST, "default", "1.0 GiB")
    assert st["phase"] == "Provisioning"
    # the figures: what libvirt says the pool has now (the base image is in it), and the overlay's
    # full diskSizeGb (10 GiB) plus the seed
    labmod.virsh(step.lab, HOST, "pool-refresh", "default")
    info = labmod.virsh(step.lab, HOST, "pool-info", "default", "--bytes")
    available = int(re.search(r"Available:\s+(\d+)", info).group(1))  # type: ignore[union-attr]
    assert f"{m['avail']} {m['aunit']}" == fmt_bytes(available), (msg, info)  # libvirt's figure
    assert available < (POOL_MIB - 200) * 2**20  # the base image took its share
    assert f"{m['need']} {m['nunit']}" == "10.0 GiB", msg  # diskSizeGb 10 (in full) + a seed of KiB
    step.quota_vm = m["vm"]
    assert set(lab_base(step.lab)) <= set(volumes(step.lab, HOST))
    assert not [d for d in domains(step.lab, HOST) if d.startswith("proxy-")]  # nothing half-made
    assert not [v for v in volumes(step.lab, HOST) if v.startswith(m["vm"])]
    # the slow schedule: the retry is the quota backoff's first step
    # (the status is written before the operator logs the retry and records the Event: wait for both)
    retries = wait_until(lambda: [(r["backoff"], r["retryIn"]) for r in a.log_msgs(
        "reconcile will be retried", proxy=f"default/{NAME}") if "backoff" in r], timeout=30,
        what="the operator's retry line for A's Proxy")
    assert retries == [("quota", QUOTA_FIRST_STEP)], retries

    def warned() -> list[str]:
        events = json.loads(a.kubectl("get", "events", "--field-selector", f"involvedObject.name={NAME}",
                                      "-o", "json").stdout)["items"]
        return [e["message"] for e in events
                if (e.get("type"), e.get("reason")) == ("Warning", "QuotaExceeded")]
    messages = wait_until(warned, timeout=30, what="a QuotaExceeded Warning Event on A's Proxy")
    assert len(messages) == 1 and QUOTA_MSG.match(f"out of capacity: {messages[0]}"), messages


def test_2_space_freed_both_clusters_same_name_get_their_own_vms(step):
    a, b = step.both
    set_pool_size(step.lab, HOST, GROWN_MIB)  # no pool-refresh: libvirt's figures stay stale
    b.kubectl.apply(b.proxy(NAME, zone=HOST))
    made = {id(st): created(st) for st in (b, a)}  # B's comes first: A waits out its quota backoff
    # exactly one quota backoff step: the retry after 60 s found the room (the operator refreshed)
    steps = [(r["backoff"], r["retryIn"]) for r in a.log_msgs("reconcile will be retried",
                                                             proxy=f"default/{NAME}") if "backoff" in r]
    assert steps == [("quota", QUOTA_FIRST_STEP)], steps
    name_a, name_b = instance(a), instance(b)
    assert (name_a, name_b) == (made[id(a)], made[id(b)])
    assert name_a == step.quota_vm  # the VM the quota message named is the one created now
    assert name_a != name_b  # the same Proxy name, keyed with each cluster's id
    for st, name in ((a, name_a), (b, name_b)):
        facts = domain_facts(step.lab, name)
        assert facts["cluster"] == cluster_id(st), facts
        assert facts["state"] == "running"
        owner = {"cluster_id": cluster_id(st), "namespace": "default"}
        assert facts["volumes"] == sorted([naming.overlay_volume(name, **owner),
                                           naming.seed_volume(name, **owner)]), facts
    print(f"\n[two clusters] A {cluster_id(a)}: {name_a}; B {cluster_id(b)}: {name_b}")


def test_3_each_gc_lists_the_others_vm_and_leaves_it_alone(step):
    a, b = step.both
    names = [instance(a), instance(b)]
    before = {n: domain_facts(step.lab, n) for n in names}
    youngest = max(datetime.fromisoformat(f["created"].replace("Z", "+00:00")) for f in before.values())
    wait_until(lambda: datetime.now(UTC) > youngest + timedelta(seconds=GC_GRACE + 1), timeout=60,
               what="both domains older than the GC grace period", interval=1)
    for st in (a, b):
        wait_listings(st, after=len(listings(st)), more=3, seeing=2)
    after = {n: domain_facts(step.lab, n) for n in names}
    assert after == before
    for st in (a, b):
        assert not gc_attempts(st), gc_attempts(st)
    assert [instance(a), instance(b)] == names  # and neither operator replaced its own


def test_4_deleting_one_clusters_proxy_removes_only_its_vm(step):
    a, b = step.both
    name_a, name_b = instance(a), instance(b)
    before_a = domain_facts(step.lab, name_a)
    b.kubectl("delete", "px", NAME, "--wait=true", "--timeout=300s", timeout=330)
    assert name_b not in domains(step.lab, HOST)
    assert not [v for v in volumes(step.lab, HOST) if v.startswith(name_b)]
    assert domain_facts(step.lab, name_a) == before_a
    assert instance(a) == name_a


def test_5_a_leftover_of_cluster_a_is_collected_by_a_and_ignored_by_b(step):
    a, b = step.both
    name = instance(a)
    assert a.operator.stop() == 0
    a.kubectl("patch", "px", NAME, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    a.kubectl("delete", "px", NAME, "--wait=false")
    wait_until(lambda: a.kubectl.get("px", NAME) is None, timeout=30, what="A's Proxy gone")
    before = domain_facts(step.lab, name)
    # B's GC lists the leftover (its only domain on the host) pass after pass, past the grace period,
    # and leaves it alone: it is not B's
    wait_listings(b, after=len(listings(b)), more=4, seeing=1)
    assert domain_facts(step.lab, name) == before
    assert not gc_attempts(b), gc_attempts(b)
    # A's GC collects it: domain, overlay and seed; the shared base stays
    a.start_operator()

    def collected() -> bool:
        return name not in domains(step.lab, HOST) and not [v for v in volumes(step.lab, HOST)
                                                            if v.startswith(name)]
    wait_until(collected, timeout=120, what=f"A's GC collecting {name}", interval=1)
    done = a.log_msgs("orphan instance deleted", instance=name)
    assert len(done) == 1 and "no longer exists" in done[0]["reason"], done
    assert not gc_attempts(b), gc_attempts(b)
    assert set(lab_base(step.lab)) <= set(volumes(step.lab, HOST))
