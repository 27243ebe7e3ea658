"""Orphan GC: what it collects, and everything it must spare."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from egress_kvm.controller.gc import collect_orphans
from egress_kvm.providers.base import Instance, PowerState

from .conftest import eventually
from .fakekube import FakeKube, LaggingStore
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, phase, spec_for

OLD = datetime.now(UTC) - timedelta(hours=2)
GRACE = 600.0


def vm(name: str, *, uid: str, zone: str = "nas1", created: datetime | None = OLD, ns: str = "default",
       owner: str = "px1") -> Instance:
    return Instance(name=name, zone=zone, power_state=PowerState.RUNNING, ip="127.0.0.1", owner_uid=uid,
                    created_at=created, owner_namespace=ns, owner_name=owner)


async def gc(kube: FakeKube, provider: FakeProvider, **kw: object) -> set[str]:
    done = await collect_orphans(providers={"kvm-home": provider}, store=kube, kube=kube,
                                 grace_period=GRACE, **kw)  # type: ignore[arg-type]
    return {c.name for c in done}


async def test_instance_whose_proxy_vanished_while_the_operator_was_down_is_collected(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({"kvm-home": provider}, gc_grace_period=0.0)
    kube.create_proxy("px1", spec_for(proxy_server))
    kube.create_proxy("px2", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready" and phase(kube, ("default", "px2")) == "Ready")
    await c.stop(timeout=1)  # the operator goes down...
    gone = kube.status(KEY)["instance"]["name"]
    kept = kube.status(("default", "px2"))["instance"]["name"]
    kube.force_remove(KEY)  # ...and the Proxy is removed with its finalizer stripped by hand
    collected = await c.collect_garbage()
    assert [x.name for x in collected] == [gone]
    assert "no longer exists" in collected[0].reason
    assert provider.names() == {kept}


async def test_grace_period_spares_a_create_in_flight(kube: FakeKube, provider: FakeProvider) -> None:
    provider.plant(vm("proxy-young", uid="nobody", created=datetime.now(UTC) - timedelta(seconds=5)))
    provider.plant(vm("proxy-unknown-age", uid="nobody", created=None))
    provider.plant(vm("proxy-old", uid="nobody"))
    assert await gc(kube, provider) == {"proxy-old"}
    assert provider.names() == {"proxy-young", "proxy-unknown-age"}


async def test_a_zone_whose_listing_failed_is_left_alone(kube: FakeKube) -> None:
    provider = FakeProvider(zones=("nas1", "nas2"))
    provider.plant(vm("proxy-a", uid="nobody", zone="nas1"))
    provider.plant(vm("proxy-b", uid="nobody", zone="nas2"))
    provider.list_fails.add("nas1")
    assert await gc(kube, provider) == {"proxy-b"}
    provider.unreachable.add("nas2")
    provider.list_fails.clear()
    assert await gc(kube, provider) == {"proxy-a"}


async def test_a_host_down_for_many_passes_logs_one_error_line(kube: FakeKube, logs) -> None:  # type: ignore[no-untyped-def]
    """One ERROR per outage, not one per GC interval (issue 13 item 9); its return is logged once."""
    provider = FakeProvider(zones=("nas1",))
    provider.unreachable.add("nas1")
    failing: set[tuple[str, str]] = set()
    for _ in range(3):
        await gc(kube, provider, failing=failing)
    lines = [json.loads(line) for line in logs.getvalue().splitlines() if line.strip()]
    errors = [r for r in lines if r["msg"] == "orphan GC skipped a zone: listing failed"]
    assert len(errors) == 1 and errors[0]["zone"] == "nas1"
    provider.unreachable.clear()
    await gc(kube, provider, failing=failing)
    await gc(kube, provider, failing=failing)
    lines = [json.loads(line) for line in logs.getvalue().splitlines() if line.strip()]
    assert [r["zone"] for r in lines if r["msg"] == "orphan GC lists the zone again"] == ["nas1"]
    assert failing == set()


async def test_nothing_is_collected_before_the_first_full_list(provider: FakeProvider) -> None:
    kube = FakeKube(synced=False)
    provider.plant(vm("proxy-a", uid="nobody"))
    assert await gc(kube, provider) == set()
    assert provider.calls == []  # did not even list


async def test_current_previous_and_desired_names_are_spared_others_collected(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    await c.stop(timeout=1)
    obj = kube.objects[KEY]
    uid = obj["metadata"]["uid"]
    current = obj["status"]["instance"]["name"]
    obj["status"]["previousInstance"] = {"name": "proxy-previous", "zone": "nas1"}
    provider.plant(vm("proxy-previous", uid=uid))
    provider.plant(vm("proxy-stray", uid=uid))
    # The name the Proxy would get after a spec change the reconciler has not acted on yet:
    spec["placement"]["machineType"] = "large"
    kube.set_spec(KEY, spec)
    from egress_kvm.controller.desired import desired_instance
    from egress_kvm.controller.proxyspec import parse_spec
    desired = (await desired_instance(proxy=kube.objects[KEY], spec=parse_spec(spec),
                                      providers={"kvm-home": provider}, kube=kube)).name
    provider.plant(vm(desired, uid=uid))
    assert await gc(kube, provider) == {"proxy-stray"}
    assert provider.names() == {current, "proxy-previous", desired}


async def test_owner_missing_from_a_lagging_cache_is_confirmed_by_a_fresh_read(
        provider: FakeProvider) -> None:
    api = FakeKube()
    obj = api.create_proxy("px1", {"mode": "Managed", "provider": "kvm-home"})
    api.objects[KEY]["status"] = {"phase": "Provisioning", "instance": {"name": "proxy-x", "zone": "nas1"}}
    cache = FakeKube()  # an informer cache that has not seen px1 yet
    provider.plant(vm("proxy-x", uid=obj["metadata"]["uid"]))
    done = await collect_orphans(providers={"kvm-home": provider}, store=cache, kube=api, grace_period=GRACE)
    assert done == [] and provider.names() == {"proxy-x"}
    del api.objects[KEY]  # really gone now
    done = await collect_orphans(providers={"kvm-home": provider}, store=cache, kube=api, grace_period=GRACE)
    assert [c.name for c in done] == ["proxy-x"]


async def test_a_stale_cached_owner_is_read_fresh_before_its_instance_is_deleted(
        provider: FakeProvider) -> None:
    """The cache still has the pre-replacement spec and status (a stalled watch); the API server names
    the new instance. GC must judge on the fresh owner and spare the instance that serves."""
    api = FakeKube()
    obj = api.create_proxy("px1", {"mode": "Managed", "provider": "kvm-home",
                                   "placement": {"zone": "nas1", "machineType": "small"}})
    cache = FakeKube()
    cache.objects[KEY] = {**obj, "status": {"phase": "Ready",
                                            "instance": {"name": "proxy-old", "zone": "nas1"}}}
    api.objects[KEY]["spec"]["placement"]["machineType"] = "large"
    api.objects[KEY]["status"] = {"phase": "Ready", "instance": {"name": "proxy-new", "zone": "nas1"}}
    provider.plant(vm("proxy-new", uid=obj["metadata"]["uid"]))
    provider.plant(vm("proxy-stray", uid=obj["metadata"]["uid"]))  # named by neither: still collected
    done = await collect_orphans(providers={"kvm-home": provider}, store=cache, kube=api, grace_period=GRACE)
    assert [c.name for c in done] == ["proxy-stray"]
    assert provider.names() == {"proxy-new"}


async def test_a_proxy_being_deleted_or_unevaluable_keeps_its_instances(
        kube: FakeKube, provider: FakeProvider) -> None:
    a = kube.create_proxy("a", {"mode": "Managed", "provider": "kvm-home",
                                "cloudInit": {"secretRef": {"name": "missing", "key": "k"}}})
    b = kube.create_proxy("b", {"mode": "Managed", "provider": "kvm-home"})
    kube.objects[("default", "b")]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    provider.plant(vm("proxy-a1", uid=a["metadata"]["uid"], owner="a"))
    provider.plant(vm("proxy-b1", uid=b["metadata"]["uid"], owner="b"))
    assert await gc(kube, provider) == set()


async def test_namespace_scope_limits_what_gc_judges(kube: FakeKube, provider: FakeProvider) -> None:
    provider.plant(vm("proxy-mine", uid="gone1", ns="team-a"))
    provider.plant(vm("proxy-theirs", uid="gone2", ns="team-b"))
    assert await gc(kube, provider, namespace="team-a") == {"proxy-mine"}
    assert provider.names() == {"proxy-theirs"}


async def test_an_external_proxy_owns_no_instance(kube: FakeKube, provider: FakeProvider) -> None:
    obj = kube.create_proxy("px1", {"mode": "External", "external": {"address": "127.0.0.1:3128"}})
    provider.plant(vm("proxy-left-from-managed", uid=obj["metadata"]["uid"]))
    assert await gc(kube, provider) == {"proxy-left-from-managed"}


async def test_periodic_gc_runs_in_the_controller(
        kube: FakeKube, provider: FakeProvider, make_controller) -> None:
    provider.plant(vm("proxy-orphan", uid="nobody"))
    make_controller({"kvm-home": provider}, gc_interval=0.05)
    await eventually(lambda: provider.names() == set())


async def test_gc_with_a_stalled_cache_spares_what_a_replacement_created(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """Through the controller: the informer cache stalls, a spec edit replaces the VM (the reconciler
    reads fresh), then GC runs on the stale cache, which still names the old VM and old spec."""
    cache = LaggingStore(kube)
    c = make_controller({"kvm-home": provider}, store=cache, gc_grace_period=0.0)
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    old = kube.status(KEY)["instance"]["name"]
    cache.freeze()
    spec["placement"]["machineType"] = "large"
    kube.set_spec(KEY, spec)
    await eventually(lambda: phase(kube) == "Ready" and kube.status(KEY)["instance"]["name"] != old
                     and "previousInstance" not in kube.status(KEY))
    new = kube.status(KEY)["instance"]["name"]
    assert await c.collect_garbage() == []
    assert provider.names() == {new}
