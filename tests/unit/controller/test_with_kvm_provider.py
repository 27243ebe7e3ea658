"""The controller driving the real KvmProvider over the in-memory fake libvirt (tests/fakes).

Same flows as test_lifecycle, but every create/get/start/delete/list goes through the provider's real
code (domain XML, seed ISO, volumes, metadata, address discovery, error classification), so these prove
the seam between the two: what the provider returns and raises is what the reconciler expects.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from fakes import DEFAULT_BASE, FakeHypervisors, fake_kvm_provider, overlay_of, seed_of
from fakes.libvirt import FakeHypervisor

from egress_kvm.providers.kvm import KvmProvider, addresses
from egress_kvm.providers.kvm.seed import read_seed_iso

from .conftest import eventually
from .fakekube import FakeKube
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, cond, phase

PROVIDER = "kvm-test"


@pytest.fixture
async def kvm(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[KvmProvider, FakeHypervisors]]:
    # The provider rightly skips a guest's loopback addresses; here the "VM" answering probes is the
    # test's proxy on 127.0.0.1 (the only place a test may send traffic), so accept loopback, nothing else.
    real = addresses.usable_ipv4
    monkeypatch.setattr(addresses, "usable_ipv4", lambda a: a.startswith("127.") or real(a))
    provider, hv = fake_kvm_provider(hosts=["host0", "host1"], cluster_id="c1")
    yield provider, hv
    await provider.close()


def kvm_spec(proxy: MiniProxy, **extra: object) -> dict:
    spec: dict = {"mode": "Managed", "provider": PROVIDER,
                  "placement": {"zone": "host0", "machineType": "small", "image": "debian-12"},
                  "port": proxy.port, "cloudInit": {"userData": "#cloud-config\nruncmd: [tinyproxy]\n"},
                  "healthCheck": {"intervalSeconds": 1}}
    spec.update(extra)
    return spec


def instance_volumes(h: FakeHypervisor, name: str) -> set[str]:
    return {v for v in h.volumes if v.startswith(name)}


def volumes_of(name: str, namespace: str = "default") -> set[str]:
    """The overlay and seed the provider names for instance `name` of a Proxy in `namespace`."""
    return {overlay_of(name, namespace=namespace, cluster_id="c1"), seed_of(name, namespace=namespace,
                                                                            cluster_id="c1")}


async def boot(kube: FakeKube, h: FakeHypervisor, ip: str = "127.0.0.1") -> str:
    """Wait for the domain to be defined and running, then let its guest agent report `ip`."""
    await eventually(lambda: (kube.status(KEY).get("instance") or {}).get("name") in h.domains,
                     what="domain defined")
    name = kube.status(KEY)["instance"]["name"]
    h.set_vm_ip(name, ip)
    return name


async def test_lifecycle_to_ready_and_deletion_over_the_kvm_provider(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    provider, hv = kvm
    make_controller({PROVIDER: provider})
    kube.create_proxy("px1", kvm_spec(proxy_server))
    await eventually(lambda: "waiting for the IP address" in kube.status(KEY).get("message", ""))
    assert phase(kube) == "Provisioning"
    name = await boot(kube, hv["host0"])
    await eventually(lambda: phase(kube) == "Ready")
    st = kube.status(KEY)
    assert st["instance"] == {"name": name, "zone": "host0", "provider": PROVIDER}
    assert st["endpoint"] == f"http://127.0.0.1:{proxy_server.port}"
    seed = read_seed_iso(bytes(hv["host0"].volumes[seed_of(name, namespace="default", cluster_id="c1")].data))
    assert seed.files["user-data"] == b"#cloud-config\nruncmd: [tinyproxy]\n"  # not rewritten
    assert instance_volumes(hv["host0"], name) == volumes_of(name)

    kube.delete(KEY)
    await eventually(lambda: KEY not in kube.objects)
    assert name not in hv["host0"].domains
    assert instance_volumes(hv["host0"], name) == set()  # domain and volumes gone before the finalizer
    assert DEFAULT_BASE in hv["host0"].volumes  # the image cache stays


async def test_shut_off_vm_is_started_and_io_error_pause_backs_off_as_quota(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    provider, hv = kvm
    c = make_controller({PROVIDER: provider})
    kube.create_proxy("px1", kvm_spec(proxy_server))
    name = await boot(kube, hv["host0"])
    await eventually(lambda: phase(kube) == "Ready")
    hv["host0"].shut_off(name)
    c.enqueue(KEY)
    await eventually(lambda: "Restarted" in kube.reasons("px1"))
    assert hv["host0"].domains[name].id != -1  # running again, same domain
    hv["host0"].pause_on_io_error(name)
    c.enqueue(KEY)
    await eventually(lambda: cond(kube, "Ready").get("reason") == "QuotaExceeded")
    assert "out of capacity" in kube.status(KEY)["message"]
    assert c.queue.failures(KEY) >= 1


async def test_unreachable_host_never_recreates_over_the_kvm_provider(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    provider, hv = kvm
    c = make_controller({PROVIDER: provider})
    kube.create_proxy("px1", kvm_spec(proxy_server))
    name = await boot(kube, hv["host0"])
    await eventually(lambda: phase(kube) == "Ready")
    defines = hv["host0"].calls.count("domain_define_xml")
    hv.set_unreachable("host0")
    c.enqueue(KEY)
    await eventually(lambda: cond(kube, "HostReachable").get("status") == "False")
    assert "host0" in kube.status(KEY)["message"]
    hv.set_unreachable("host0", False)
    c.enqueue(KEY)
    await eventually(lambda: cond(kube, "HostReachable").get("status") == "True", limit=30)
    assert hv["host0"].calls.count("domain_define_xml") == defines
    assert set(hv["host0"].domains) == {name}


async def test_unknown_zone_fails_naming_it(kube: FakeKube, kvm, proxy_server: MiniProxy,
                                            make_controller) -> None:
    provider, _ = kvm
    make_controller({PROVIDER: provider})
    spec = kvm_spec(proxy_server)
    spec["placement"]["zone"] = "host9"
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Failed")
    assert "'host9'" in kube.status(KEY)["message"] and "spec.placement" in kube.status(KEY)["message"]


async def test_replacement_to_another_host_over_the_kvm_provider(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    provider, hv = kvm
    make_controller({PROVIDER: provider})
    spec = kvm_spec(proxy_server)
    kube.create_proxy("px1", spec)
    old = await boot(kube, hv["host0"])
    await eventually(lambda: phase(kube) == "Ready")
    spec["placement"]["zone"] = "host1"
    kube.set_spec(KEY, spec)
    await eventually(lambda: kube.status(KEY).get("previousInstance", {}).get("name") == old)
    assert old in hv["host0"].domains  # kept while the new one comes up
    new = await boot(kube, hv["host1"])
    await eventually(lambda: phase(kube) == "Ready" and "previousInstance" not in kube.status(KEY))
    assert old not in hv["host0"].domains and instance_volumes(hv["host0"], old) == set()
    assert set(hv["host1"].domains) == {new}


async def test_orphan_gc_over_the_kvm_provider(kube: FakeKube, kvm, proxy_server: MiniProxy,
                                               make_controller) -> None:
    provider, hv = kvm
    c = make_controller({PROVIDER: provider}, gc_grace_period=0.0)
    kube.create_proxy("px1", kvm_spec(proxy_server))
    name = await boot(kube, hv["host0"])
    await eventually(lambda: phase(kube) == "Ready")
    await c.stop(timeout=1)
    kube.force_remove(KEY)  # the Proxy vanished while the operator was down
    hv["host1"].reachable = False  # and one host cannot be listed: it must simply be skipped
    collected = await c.collect_garbage()
    assert [x.name for x in collected] == [name]
    assert name not in hv["host0"].domains and instance_volumes(hv["host0"], name) == set()


async def test_a_static_address_is_status_ip_without_any_discovery_and_probes_decide_ready(
        kube: FakeKube, proxy_server: MiniProxy, make_controller) -> None:
    # The only address a unit test may send to is loopback, so the range is one loopback address: the
    # "VM" answering the probes is the test's proxy on 127.0.0.1. No agent, no neighbour entry is ever set.
    static = {"cidr": "127.0.0.0/24", "gateway": "127.0.0.254", "range": "127.0.0.1-127.0.0.1"}
    provider, hv = fake_kvm_provider(host_entries=[{"name": "host0", "address": "host0.test:22",
                                                    "user": "virt", "bridge": "br0",
                                                    "staticAddresses": static}], cluster_id="c1")
    try:
        make_controller({PROVIDER: provider})
        kube.create_proxy("px1", kvm_spec(proxy_server))
        await eventually(lambda: phase(kube) == "Ready")
        st = kube.status(KEY)
        assert (st["ip"], st["endpoint"]) == ("127.0.0.1", f"http://127.0.0.1:{proxy_server.port}")
        name = st["instance"]["name"]
        assert hv["host0"].agent_ips == {} and hv["host0"].neighbours.get("br0", []) == []
        seed_vol = hv["host0"].volumes[seed_of(name, namespace="default", cluster_id="c1")]
        assert "network-config" in read_seed_iso(bytes(seed_vol.data)).files
        kube.delete(KEY)
        await eventually(lambda: KEY not in kube.objects)
        assert name not in hv["host0"].domains
    finally:
        await provider.close()


async def test_a_vm_stranded_by_an_address_change_is_readdressed_and_status_follows(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    """Issue 9 item 2 over the fake: the guest moved to another address that its host's filter drops (the
    host got no answer from either address and maps none to the MAC). After a few looks the VM is defined
    afresh (new UUID, same name) with a `Readdressed` Warning; the address DHCP gives it at boot is the
    one the host confirms, and status.ip, the endpoint and Ready follow it."""
    provider, hv = kvm
    h = hv["host0"]
    make_controller({PROVIDER: provider})
    kube.create_proxy("px1", kvm_spec(proxy_server))
    name = await boot(kube, h, "127.0.0.1")
    await eventually(lambda: phase(kube) == "Ready")
    uuid = h.domains[name].uuid

    moved = MiniProxy("127.0.0.2")  # the VM's proxy at its new address, same port
    moved.port = proxy_server.port
    await proxy_server.stop()  # nothing answers at the old address any more
    h.agent_ips[name] = "127.0.0.2"
    h.neighbours["br0"] = [{"dst": ip, "dev": "br0", "state": ["FAILED"]}
                           for ip in ("127.0.0.1", "127.0.0.2")]
    await eventually(lambda: "Readdressed" in kube.reasons("px1"), what="readdressed")
    assert h.domains[name].uuid != uuid and h.domains[name].id != -1
    assert kube.reasons("px1").count("Readdressed") == 1
    await moved.start()
    try:
        h.set_vm_ip(name, "127.0.0.2")  # the lease the filter learns at boot
        await eventually(lambda: phase(kube) == "Ready" and kube.status(KEY).get("ip") == "127.0.0.2",
                         what="Ready at the new address")
        st = kube.status(KEY)
        assert st["endpoint"] == f"http://127.0.0.2:{proxy_server.port}" and st["instance"]["name"] == name
        assert kube.reasons("px1").count("Readdressed") == 1  # once: no loop once the host confirms it
    finally:
        await moved.stop()


async def test_a_new_proxy_looks_its_name_up_once_before_the_define(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No look before a first create while the provider holds a live session to the host
    (planner.look_first): the create's own lookup is the only one. The first Proxy on a host not dialled
    yet is looked at first (a host that turns out down then records nothing)."""
    provider, hv = kvm
    h = hv["host0"]
    steps: list[tuple[str, str]] = []  # (get or create, instance name), in order
    for op in ("get", "create"):
        real = getattr(provider, op)

        def record(*args: Any, _op: str = op, _real: Any = real, **kw: Any) -> Any:
            steps.append((_op, args[0] if _op == "get" else args[0].name))
            return _real(*args, **kw)

        monkeypatch.setattr(provider, op, record)
    make_controller({PROVIDER: provider})
    kube.create_proxy("px1", kvm_spec(proxy_server))
    first = await boot(kube, h)
    assert steps[:2] == [("get", first), ("create", first)]  # no session yet: looked at first
    assert provider.connected("host0")
    kube.create_proxy("px2", kvm_spec(proxy_server))
    await eventually(lambda: (kube.status(("default", "px2")).get("instance") or {}).get("name") in h.domains,
                     what="px2 defined")
    second = kube.status(("default", "px2"))["instance"]["name"]
    mine = [op for op, name in steps if name == second]
    assert mine[0] == "create", mine
    await eventually(lambda: "Created" in kube.reasons("px2"), what="Created event")


async def test_a_lost_status_write_finds_the_proxys_own_instance_and_says_found(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    """Status lost the name of the Proxy's instance (a write that never landed): the pass plans a create
    without a look, the provider finds the VM made for this Proxy and keeps it (no second define), the
    Event says Found, not Created, and status names it again."""
    provider, hv = kvm
    h = hv["host0"]
    c = make_controller({PROVIDER: provider})
    kube.create_proxy("px1", kvm_spec(proxy_server))
    name = await boot(kube, h)
    await eventually(lambda: phase(kube) == "Ready")
    defines = h.calls.count("domain_define_xml")
    kube.objects[KEY]["status"] = {}
    c.enqueue(KEY)
    await eventually(lambda: "Found" in kube.reasons("px1"), what="Found event")
    await eventually(lambda: phase(kube) == "Ready")
    assert kube.status(KEY)["instance"]["name"] == name
    assert h.calls.count("domain_define_xml") == defines and kube.reasons("px1").count("Created") == 1
