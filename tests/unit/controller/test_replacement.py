"""Replacement on a spec fix: a new name, create-before-delete, the old one deleted once the new is Ready."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from egress_kvm.policy.secrets import USABLE
from egress_kvm.providers.base import Instance, PowerState

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, cond, phase, spec_for


async def test_changed_inputs_replace_create_before_delete(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    old = kube.status(KEY)["instance"]["name"]
    old_endpoint = kube.status(KEY)["endpoint"]
    seen: list[dict] = []
    kube.watch(lambda kind, obj: seen.append(dict(obj.get("status") or {})))

    # The replacement comes up on another address where nothing listens yet: it cannot become Ready.
    provider.ip_for = lambda name: "127.0.0.1" if name == old else "127.0.0.2"
    spec["placement"]["machineType"] = "large"
    kube.set_spec(KEY, spec)
    await eventually(lambda: kube.status(KEY).get("previousInstance", {}).get("name") == old)
    new = kube.status(KEY)["instance"]["name"]
    assert new != old
    await eventually(lambda: "waiting for health probes" in kube.status(KEY).get("message", ""),
                     what="the replacement running with its IP, being probed")
    await asyncio.sleep(0.3)  # many probe intervals at test speed: still not Ready, so the old one stays
    assert provider.names() == {old, new}
    assert ("delete", old) not in provider.calls
    # Meanwhile the old instance serves, and status says so: its address, Ready, HEALTHY=True.
    st = kube.status(KEY)
    assert (st["phase"], st["ip"], st["endpoint"], st["healthy"]) == ("Ready", "127.0.0.1", old_endpoint,
                                                                      True)
    assert cond(kube, "Ready")["status"] == "True" and cond(kube, "Healthy")["status"] == "True"
    assert st["message"].startswith(f"serving from {old} (healthy) while replacing it with {new}: "), \
        st["message"]
    assert all(s.get("phase") == "Ready" and s.get("ip") == "127.0.0.1" for s in seen), seen

    second = MiniProxy("127.0.0.2")
    second.port = proxy_server.port
    await second.start()
    try:
        await eventually(lambda: phase(kube) == "Ready" and "previousInstance" not in kube.status(KEY))
        assert provider.names() == {new}
        assert kube.status(KEY)["ip"] == "127.0.0.2"
        assert kube.status(KEY)["endpoint"] == f"http://127.0.0.2:{proxy_server.port}"
        creates = [i for i, c in enumerate(provider.calls) if c == ("create", new)]
        deletes = [i for i, c in enumerate(provider.calls) if c == ("delete", old)]
        assert creates and deletes and creates[0] < deletes[0]
        reasons = kube.reasons("px1")
        assert "Replacing" in reasons and "Replaced" in reasons
        assert "Unhealthy" not in reasons  # Ready throughout: no flap at the handover either
        assert all(s.get("phase") == "Ready" for s in seen), [s.get("phase") for s in seen]
    finally:
        await second.stop()


async def test_a_replaced_instance_that_stops_serving_shows_the_replacement(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    old = kube.status(KEY)["instance"]["name"]
    provider.ip_for = lambda name: "127.0.0.1" if name == old else "127.0.0.2"
    spec["placement"]["machineType"] = "large"
    kube.set_spec(KEY, spec)
    await eventually(lambda: "waiting for health probes" in kube.status(KEY).get("message", ""))
    assert kube.status(KEY)["ip"] == "127.0.0.1"
    provider.vanish(old)  # the old VM is gone behind our back: nothing serves from it any more
    await eventually(lambda: kube.status(KEY).get("ip") == "127.0.0.2", what="status showing the new VM")
    assert phase(kube) == "Running"
    assert cond(kube, "Ready")["status"] == "False"


async def test_region_and_port_changes_do_not_replace(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    spec["placement"]["region"] = "eu-west"
    del spec["placement"]["zone"]  # the default zone, written or not, is the same input
    kube.set_spec(KEY, spec)
    await eventually(lambda: kube.status(KEY).get("observedGeneration") == 2)
    assert kube.status(KEY)["instance"]["name"] == name
    assert provider.names() == {name}


async def test_a_failed_proxy_fixed_has_nothing_to_keep(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    spec["placement"]["image"] = "nonsense"
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Failed")
    spec["placement"]["image"] = "debian-13"
    previous_seen: list[object] = []
    kube.watch(lambda kind, obj: previous_seen.append((obj.get("status") or {}).get("previousInstance")))
    kube.set_spec(KEY, spec)
    await eventually(lambda: phase(kube) == "Ready")
    assert not any(previous_seen)
    assert len(provider.names()) == 1


async def test_an_old_instance_that_never_worked_is_deleted_at_once(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    provider.ip_for = lambda name: None  # never gets an address
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await eventually(lambda: "waiting for the IP address" in kube.status(KEY).get("message", ""))
    old = kube.status(KEY)["instance"]["name"]
    provider.ip_for = lambda name: "127.0.0.1"
    spec["cloudInit"]["userData"] = "#cloud-config\n# fixed\n"
    kube.set_spec(KEY, spec)
    await eventually(lambda: phase(kube) == "Ready")
    assert old not in provider.names() and len(provider.names()) == 1
    assert "previousInstance" not in kube.status(KEY)


async def test_no_capacity_for_both_deletes_the_old_one_first(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    provider.capacity = 1
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    old = kube.status(KEY)["instance"]["name"]
    spec["placement"]["machineType"] = "large"
    kube.set_spec(KEY, spec)
    await eventually(lambda: phase(kube) == "Ready" and kube.status(KEY)["instance"]["name"] != old)
    assert old not in provider.names() and len(provider.names()) == 1
    assert "ReplacingWithoutOverlap" in kube.reasons("px1")


async def test_no_capacity_on_another_host_keeps_the_serving_one(
        kube: FakeKube, proxy_server: MiniProxy, make_controller) -> None:
    """Moving to a full host: deleting the VM on the old host would free nothing there, so it keeps
    serving while the create is retried on the quota backoff, and the move completes once room frees."""
    provider = FakeProvider(zones=("nas1", "nas2"))
    provider.capacity = 1
    provider.plant(Instance(name="someone-else", zone="nas2", power_state=PowerState.RUNNING, ip=None,
                            owner_uid="x", created_at=datetime.now(UTC)))  # nas2 is full
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    old = kube.status(KEY)["instance"]["name"]
    spec["placement"]["zone"] = "nas2"
    kube.set_spec(KEY, spec)
    await eventually(lambda: kube.reasons("px1").count("QuotaExceeded") >= 1)
    await asyncio.sleep(0.3)  # a few quota retries
    assert old in provider.names()
    assert "ReplacingWithoutOverlap" not in kube.reasons("px1")
    st = kube.status(KEY)
    assert st["phase"] == "Ready" and st["previousInstance"]["name"] == old  # still served by the old VM
    await provider.delete("someone-else", "nas2")  # room on nas2
    await eventually(lambda: phase(kube) == "Ready" and "previousInstance" not in kube.status(KEY))
    assert provider.names() == {kube.status(KEY)["instance"]["name"]}
    assert kube.status(KEY)["instance"]["zone"] == "nas2"


async def test_secret_content_change_is_seen_on_resync_and_replaces(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    kube.put_secret("default", "ci", {"user-data": b"#cloud-config\n# v1\n"}, labels=USABLE)
    c = make_controller({"kvm-home": provider})
    ref = {"secretRef": {"name": "ci", "key": "user-data"}}
    kube.create_proxy("px1", spec_for(proxy_server, cloudInit=ref))
    await eventually(lambda: phase(kube) == "Ready")
    old = kube.status(KEY)["instance"]["name"]
    kube.put_secret("default", "ci", {"user-data": b"#cloud-config\n# v2\n"}, labels=USABLE)
    await c._resync()  # what the periodic resync does
    await eventually(lambda: phase(kube) == "Ready" and kube.status(KEY)["instance"]["name"] != old
                     and "previousInstance" not in kube.status(KEY))
    new = kube.status(KEY)["instance"]["name"]
    assert provider.names() == {new}
    assert provider.user_data[new] == b"#cloud-config\n# v2\n"


async def test_spec_changed_twice_during_a_replacement_keeps_the_one_that_served(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    first = kube.status(KEY)["instance"]["name"]
    provider.ip_for = lambda name: "127.0.0.1" if name == first else None  # replacements never boot
    spec["placement"]["machineType"] = "large"
    kube.set_spec(KEY, spec)
    await eventually(lambda: kube.status(KEY).get("previousInstance", {}).get("name") == first)
    second = kube.status(KEY)["instance"]["name"]
    spec["cloudInit"]["userData"] = "#cloud-config\n# again\n"
    kube.set_spec(KEY, spec)
    await eventually(lambda: kube.status(KEY)["instance"]["name"] not in (first, second))
    st = kube.status(KEY)
    assert st["previousInstance"]["name"] == first
    assert second not in provider.names()  # the intermediate one never served: gone
    assert first in provider.names()
    # and back to the original inputs: the first one is simply current again
    spec["placement"]["machineType"] = "small"
    spec["cloudInit"]["userData"] = spec_for(proxy_server)["cloudInit"]["userData"]
    kube.set_spec(KEY, spec)
    await eventually(lambda: phase(kube) == "Ready" and kube.status(KEY)["instance"]["name"] == first)
    assert "previousInstance" not in kube.status(KEY)
    assert provider.names() == {first}
