"""Orphan-volume GC: the decision as a table (orphan_volumes.py), then the pass (volume_gc.py) over the
real KvmProvider on the fake libvirt and the in-memory Kubernetes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from fakes import DEFAULT_BASE, DEFAULT_MARKER, FakeHypervisors, fake_kvm_provider
from fakes.libvirt import lv_error

from egress_kvm.controller.orphan_volumes import judge_volumes
from egress_kvm.controller.volume_gc import VolumeClocks, collect_orphan_volumes
from egress_kvm.providers.base import CreateRequest, InstanceVolume, Placement, TransientError, VolumeListing
from egress_kvm.providers.kvm import KvmProvider
from rpc.constants import ErrorCode

from .fakekube import FakeKube, LaggingStore

GRACE = 600.0
T0 = 1000.0


def vol(instance: str, ns: str = "default", kind: str = ".qcow2") -> InstanceVolume:
    return InstanceVolume(zone="host0", name=f"{instance}.{ns}.0123456789abcdef{kind}", instance=instance,
                          owner_namespace=ns)


A, A_SEED, B = vol("proxy-a"), vol("proxy-a", kind="-seed.iso"), vol("proxy-b")
C_OTHER_NS = vol("proxy-c", "team-x")


@pytest.mark.parametrize(("volumes", "domains", "claimed", "scope", "seen", "now", "due", "clocks"), [
    # first seen unclaimed: the clock starts, nothing is due yet
    ([A, A_SEED], [], [], None, {}, T0, [], {A.name: T0, A_SEED.name: T0}),
    # still unclaimed one grace later: both due (clocks kept until deleted)
    ([A, A_SEED], [], [], None, {A.name: T0, A_SEED.name: T0}, T0 + GRACE, [A, A_SEED],
     {A.name: T0, A_SEED.name: T0}),
    # a second short of the grace: not yet
    ([A], [], [], None, {A.name: T0}, T0 + GRACE - 1, [], {A.name: T0}),
    # a domain of its instance exists on the host: never an orphan, its clock goes
    ([A], ["proxy-a"], [], None, {A.name: T0}, T0 + GRACE, [], {}),
    # a Proxy claims its instance (status.instance / previousInstance): spared, clock goes
    ([A, B], [], ["proxy-a"], None, {A.name: T0, B.name: T0}, T0 + GRACE, [B], {B.name: T0}),
    # a domain of another name does not make it anyone's
    ([A], ["proxy-z"], [], None, {A.name: T0}, T0 + GRACE, [A], {A.name: T0}),
    # namespace-scoped operator: another namespace's volume is not its to judge (and gets no clock)
    ([A, C_OTHER_NS], [], [], "default", {A.name: T0, C_OTHER_NS.name: T0}, T0 + GRACE, [A], {A.name: T0}),
    ([C_OTHER_NS], [], [], "team-x", {C_OTHER_NS.name: T0}, T0 + GRACE, [C_OTHER_NS], {C_OTHER_NS.name: T0}),
    # a volume gone from the listing drops its clock; one that comes back starts again
    ([], [], [], None, {A.name: T0}, T0 + GRACE, [], {}),
    ([A], [], [], None, {}, T0 + GRACE, [], {A.name: T0 + GRACE}),
    # grace 0 (tests, impatient operators) still needs one sighting, which is this one
])
def test_judge_volumes(volumes, domains, claimed, scope, seen, now, due, clocks) -> None:  # type: ignore[no-untyped-def]
    judged = judge_volumes(VolumeListing(volumes=tuple(volumes), domains=frozenset(domains)),
                           claimed=frozenset(claimed), namespace=scope, seen=seen, now=now, grace=GRACE)
    assert list(judged.due) == due
    assert judged.seen == clocks


def test_grace_zero_collects_on_first_sight() -> None:
    judged = judge_volumes(VolumeListing(volumes=(A,), domains=frozenset()), claimed=frozenset(),
                           namespace=None, seen={}, now=T0, grace=0.0)
    assert judged.due == (A,)


# --- the pass, over the real provider -----------------------------------------------------------------

PROVIDER = "kvm-test"


@pytest.fixture
async def kvm() -> AsyncIterator[tuple[KvmProvider, FakeHypervisors]]:
    provider, hv = fake_kvm_provider(hosts=["host0"], cluster_id="c1")
    yield provider, hv
    await provider.close()


def spec(user_data: str = "#cloud-config\n") -> dict:
    return {"mode": "Managed", "provider": PROVIDER,
            "placement": {"zone": "host0", "machineType": "small", "image": "debian-12"},
            "port": 8888, "cloudInit": {"userData": user_data}}


async def crashed_create(provider: KvmProvider, hv: FakeHypervisors, name: str, *, namespace: str = "default",
                         ) -> set[str]:
    """A create that died between its volumes and its domain; returns the volumes it left."""
    before = set(hv["host0"].volumes)
    hv["host0"].fail["domain_define_xml"] = lv_error(ErrorCode.INTERNAL_ERROR, "internal error: crash")
    with pytest.raises(TransientError):
        await provider.create(CreateRequest(
            name=name, owner_uid="uid-gone", placement=provider.resolve(Placement(zone="host0")),
            user_data=b"#cloud-config\n", owner_namespace=namespace, owner_name="px-gone"))
    left = set(hv["host0"].volumes) - before
    assert len(left) == 2 and name not in hv["host0"].domains
    return left


async def gc_pass(kube: FakeKube, provider: KvmProvider, clocks: VolumeClocks, now: float, *,
                  store: object = None, namespace: str | None = None) -> set[str]:
    done = await collect_orphan_volumes(providers={PROVIDER: provider}, store=store or kube,  # type: ignore[arg-type]
                                        kube=kube, grace_period=GRACE, clocks=clocks, now=now,
                                        namespace=namespace)
    return {c.name for c in done}


async def test_volumes_of_a_crashed_create_go_after_the_grace_period(kube: FakeKube, kvm) -> None:  # type: ignore[no-untyped-def]
    provider, hv = kvm
    left = await crashed_create(provider, hv, "proxy-crashed")
    clocks: VolumeClocks = {}
    assert await gc_pass(kube, provider, clocks, T0) == set()  # first sight: the clock starts
    assert await gc_pass(kube, provider, clocks, T0 + GRACE - 1) == set()
    assert left <= set(hv["host0"].volumes)
    assert await gc_pass(kube, provider, clocks, T0 + GRACE) == left
    assert not left & set(hv["host0"].volumes)
    assert {DEFAULT_BASE, DEFAULT_MARKER} <= set(hv["host0"].volumes)  # not ours
    assert clocks[(PROVIDER, "host0")] == {}


async def test_another_clusters_volumes_on_the_same_host_are_never_touched(kube: FakeKube, kvm) -> None:  # type: ignore[no-untyped-def]
    provider, hv = kvm
    theirs = KvmProvider(name=provider.name, config=provider.config, cluster_id="c2", dial=hv.dial)
    try:
        their_left = await crashed_create(theirs, hv, "proxy-theirs")
        legacy = {"proxy-old.qcow2", "proxy-old-seed.iso"}  # made before the tag: unprovable, kept
        for v in legacy:
            hv["host0"].put_volume(v, b"old")
        clocks: VolumeClocks = {}
        for now in (T0, T0 + GRACE, T0 + 10 * GRACE):
            assert await gc_pass(kube, provider, clocks, now) == set()
        assert their_left | legacy <= set(hv["host0"].volumes)
    finally:
        await theirs.close()


async def test_a_claimed_instance_keeps_its_volumes(kube: FakeKube, kvm) -> None:  # type: ignore[no-untyped-def]
    """status.instance names it (a create that keeps failing after its volumes): spared however old."""
    provider, hv = kvm
    left = await crashed_create(provider, hv, "proxy-claimed")
    kube.create_proxy("px1", spec())
    kube.objects[("default", "px1")]["status"] = {"instance": {"name": "proxy-claimed", "zone": "host0"}}
    clocks: VolumeClocks = {}
    for now in (T0, T0 + GRACE):
        assert await gc_pass(kube, provider, clocks, now) == set()
    assert left <= set(hv["host0"].volumes)


async def test_a_lagging_cache_is_confirmed_by_a_fresh_list_with_desired_names(kube: FakeKube, kvm) -> None:  # type: ignore[no-untyped-def]
    """The cache does not show the Proxy; the API server does, and the name it would create now is the
    volume's instance: nothing is deleted."""
    provider, hv = kvm
    store = LaggingStore(kube)
    store.freeze()  # the cache stops here: no Proxies
    kube.create_proxy("px1", spec())
    from egress_kvm.controller.desired import desired_instance
    from egress_kvm.controller.proxyspec import parse_spec
    obj = kube.objects[("default", "px1")]
    name = (await desired_instance(proxy=obj, spec=parse_spec(obj["spec"]), providers={PROVIDER: provider},
                                   kube=kube)).name
    left = await crashed_create(provider, hv, name)
    clocks: VolumeClocks = {}
    assert await gc_pass(kube, provider, clocks, T0, store=store) == set()
    assert await gc_pass(kube, provider, clocks, T0 + GRACE, store=store) == set()
    assert left <= set(hv["host0"].volumes)


async def test_the_fresh_check_evaluates_only_proxies_of_the_orphans_namespace(kube: FakeKube, kvm) -> None:  # type: ignore[no-untyped-def]
    """Computing the name a Proxy would create may read its Secret: a Proxy of another namespace cannot
    have made (or be about to make) a volume tagged with this one, so it costs nothing."""
    provider, hv = kvm
    left = await crashed_create(provider, hv, "proxy-orphan", namespace="team-a")
    from_secret = {**spec(), "cloudInit": {"secretRef": {"name": "ud", "key": "user-data"}}}
    for i in range(3):
        kube.create_proxy(f"px{i}", from_secret, namespace="team-b")
    kube.create_proxy("pxa", from_secret, namespace="team-a")
    read: list[str] = []
    real_read = kube.read_secret_labels

    async def counting_read(namespace: str, name: str):  # type: ignore[no-untyped-def]
        read.append(namespace)
        return await real_read(namespace, name)

    kube.read_secret_labels = counting_read  # type: ignore[method-assign]
    clocks: VolumeClocks = {}
    assert await gc_pass(kube, provider, clocks, T0) == set()
    assert await gc_pass(kube, provider, clocks, T0 + GRACE) == left
    assert "team-b" not in read and "team-a" in read


async def test_a_namespace_scoped_operator_leaves_other_namespaces_volumes(kube: FakeKube, kvm) -> None:  # type: ignore[no-untyped-def]
    provider, hv = kvm
    mine = await crashed_create(provider, hv, "proxy-mine", namespace="team-a")
    other = await crashed_create(provider, hv, "proxy-other", namespace="team-b")
    clocks: VolumeClocks = {}
    await gc_pass(kube, provider, clocks, T0, namespace="team-a")
    assert await gc_pass(kube, provider, clocks, T0 + GRACE, namespace="team-a") == mine
    assert other <= set(hv["host0"].volumes)


async def test_nothing_before_the_first_full_list_and_a_failing_zone_keeps_its_clocks(kvm) -> None:  # type: ignore[no-untyped-def]
    provider, hv = kvm
    left = await crashed_create(provider, hv, "proxy-crashed")
    clocks: VolumeClocks = {}
    assert await gc_pass(FakeKube(synced=False), provider, clocks, T0 + 10 * GRACE) == set()
    assert clocks == {}
    kube = FakeKube()
    await gc_pass(kube, provider, clocks, T0)
    hv.set_unreachable("host0")
    assert await gc_pass(kube, provider, clocks, T0 + GRACE) == set()
    assert set(clocks[(PROVIDER, "host0")]) == left  # kept while the host is away


async def test_the_controllers_gc_pass_collects_orphan_volumes(  # type: ignore[no-untyped-def]
        kube: FakeKube, kvm, make_controller) -> None:
    """Wired into the manager's pass: the crash left volumes, the Proxy is gone (its finalizer removed
    by hand), and `collect_garbage` returns them among what it collected."""
    provider, hv = kvm
    c = make_controller({PROVIDER: provider}, gc_grace_period=0.0)
    left = await crashed_create(provider, hv, "proxy-crashed")
    collected = await c.collect_garbage()
    assert {x.name for x in collected} == left
    assert all("no Proxy claims it" in x.reason for x in collected)
    assert not left & set(hv["host0"].volumes)
