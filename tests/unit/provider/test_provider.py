"""KvmProvider over the fake libvirt: create, get, start, delete, list_managed and their error kinds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakes import DEFAULT_BASE, DEFAULT_MARKER, FakeLibvirtClient, fake_kvm_provider, overlay_of, seed_of
from fakes.libvirt import lv_error
from lxml import etree
from provider_helpers import SECRET, LogCapture, request

from egress_kvm.providers.base import (
    PermanentError,
    Placement,
    PowerState,
    Provider,
    QuotaError,
    TransientError,
)
from egress_kvm.providers.kvm import metadata, naming, seed
from egress_kvm.providers.kvm.domain_xml import has_traffic_filter
from rpc.constants import DomainState, ErrorCode
from rpc.errors import ConnectionLost

OVERLAY, SEED = overlay_of("proxy-abc"), seed_of("proxy-abc")  # naming.py: namespace ns1, cluster-tagged

NAME = "proxy-abc"


async def test_create_lands_every_object_of_the_spec_table() -> None:
    provider, hv = fake_kvm_provider(hosts=["host0"], cluster_id="c1")
    assert isinstance(provider, Provider)
    try:
        inst = await provider.create(request())
        h = hv["host0"]
        assert inst.name == NAME and inst.zone == "host0" and inst.power_state == PowerState.RUNNING
        assert inst.owner_uid == "uid-1" and inst.created_at is not None and inst.ip is None
        assert h.volume_names() == {DEFAULT_BASE, DEFAULT_MARKER,
                                    overlay_of(NAME, cluster_id="c1"), seed_of(NAME, cluster_id="c1")}
        overlay = h.volumes[overlay_of(NAME, cluster_id="c1")]
        assert overlay.format == "qcow2"
        assert overlay.backing_path == h.volumes[DEFAULT_BASE].path
        assert overlay.backing_format == "qcow2"
        assert overlay.capacity == 10 * 1024**3
        iso = seed.read_seed_iso(bytes(h.volumes[seed_of(NAME, cluster_id="c1")].data))
        assert iso.label == "cidata"
        assert iso.files["user-data"] == SECRET
        assert iso.files["meta-data"] == b"instance-id: proxy-abc\nlocal-hostname: proxy-abc\n"
        assert b"qemu-guest-agent" in iso.files["vendor-data"]
        dom = h.domains[NAME]
        assert dom.state == DomainState.RUNNING and dom.id != -1
        assert dom.mac == naming.mac_address(NAME)
        meta = metadata.parse(dom.metadata[metadata.NAMESPACE])
        assert (meta.cluster_id, meta.owner_uid, meta.owner_namespace, meta.owner_name) == ("c1", "uid-1",
                                                                                         "ns1", "px1")
        assert (meta.zone, meta.machine_type, meta.image) == ("host0", "small", "debian-12")
        root = etree.fromstring(dom.xml.encode())
        assert root.get("type") == "kvm" and root.find("cpu").get("mode") == "host-passthrough"
        assert root.findtext("memory") == "512"
    finally:
        await provider.close()


async def test_create_uses_host_domain_type_cpu_and_seed_bus() -> None:
    hosts = [{"name": "host0", "address": "h:22", "user": "virt", "bridge": "br9", "domainType": "qemu",
              "seedBus": "scsi", "pool": "fast"}]
    provider, hv = fake_kvm_provider(hosts=["host0"], host_entries=hosts, host_kwargs={"pool": "fast",
                                                                                        "bridges": ["br9"]})
    try:
        await provider.create(request())
        root = etree.fromstring(hv["host0"].domains[NAME].xml.encode())
        assert root.get("type") == "qemu"
        assert root.find("cpu").get("mode") == "maximum"
        assert root.find("devices/disk[@device='cdrom']/target").get("bus") == "scsi"
        assert root.find("devices/controller[@model='virtio-scsi']") is not None
        assert root.find("devices/interface/source").get("bridge") == "br9"
        assert root.find("devices/disk/source").get("pool") == "fast"
    finally:
        await provider.close()


async def test_empty_vendor_data_sends_none() -> None:
    provider, hv = fake_kvm_provider(vendorData="")
    try:
        await provider.create(request())
        files = seed.read_seed_iso(bytes(hv["host0"].volumes[SEED].data)).files
        assert set(files) == {"user-data", "meta-data"}
    finally:
        await provider.close()


async def test_create_is_idempotent_and_restarts_a_stopped_vm() -> None:
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        first = await provider.create(request())
        uuid = h.domains[NAME].uuid
        again = await provider.create(request())
        assert h.domains[NAME].uuid == uuid
        assert again.created_at is not None and first.created_at is not None
        assert again.created_at.replace(microsecond=0) == first.created_at.replace(microsecond=0)
        h.shut_off(NAME)
        got = await provider.get(NAME, "host0")
        assert got is not None and got.power_state == PowerState.STOPPED
        h.calls.clear()
        restarted = await provider.create(request())
        assert restarted.power_state == PowerState.RUNNING
        assert h.domains[NAME].state == DomainState.RUNNING
        assert "domain_define_xml" not in h.calls and "domain_create_with_flags" in h.calls
    finally:
        await provider.close()


async def test_start_starts_a_stopped_vm_and_leaves_a_running_one() -> None:
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        h.calls.clear()
        await provider.start(NAME, "host0")
        assert "domain_create_with_flags" not in h.calls
        h.shut_off(NAME)
        await provider.start(NAME, "host0")
        assert h.domains[NAME].state == DomainState.RUNNING
        with pytest.raises(TransientError, match="does not exist"):
            await provider.start("proxy-gone", "host0")
    finally:
        await provider.close()


async def test_leftover_volumes_of_an_interrupted_create_are_replaced() -> None:
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        h.put_volume(OVERLAY, b"stale overlay", fmt="qcow2")
        h.put_volume(SEED, b"stale seed")
        await provider.create(request())
        assert h.volumes[OVERLAY].backing_path is not None
        assert seed.read_seed_iso(bytes(h.volumes[SEED].data)).files["user-data"] == SECRET
    finally:
        await provider.close()


async def test_concurrent_creates_of_one_name_define_one_domain() -> None:
    provider, hv = fake_kvm_provider()
    try:
        creates = (provider.create(request()) for _ in range(3))
        results = await asyncio.gather(*creates, return_exceptions=True)
        assert len(hv["host0"].domains) == 1
        assert all(not isinstance(r, BaseException) for r in results), results
        assert hv["host0"].calls.count("domain_define_xml") == 1
        assert hv["host0"].calls.count("storage_vol_create_xml") == 2  # overlay and seed, once each
        assert provider.host("host0").locks == {}
    finally:
        await provider.close()


async def test_get_ip_from_agent_then_arp_then_neighbour_table(logs: LogCapture) -> None:
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip is None  # agent not up, nothing in ARP yet: not an error
        assert any(r.get("source") == "agent" and r.get("libvirtCodeName") == "AGENT_UNRESPONSIVE"
                   for r in logs.lines("address source gave nothing"))

        h.set_vm_ip(NAME, "192.0.2.10", agent=False)  # only the host's ARP table knows it
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip == "192.0.2.10"

        h.arp_broken = True  # libvirt's ARP source fails ("wrong nlmsg len"): read `ip neigh` over SSH
        h.exec_log.clear()
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip == "192.0.2.10"
        assert h.exec_log == [["ip", "-j", "neigh", "show", "dev", "br0"]]

        h.exec_allowed = False  # the SSH user may not exec: fallback skipped, still no failure
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip is None

        h.set_vm_ip(NAME, "192.0.2.11")  # agent up, but no host table to confirm its claim: no endpoint
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip is None
        # ...and no table is no evidence against the claim either: not stranded (no readdress of a
        # healthy VM because the host's SSH refused an exec and libvirt's ARP source failed)
        assert (inst.stranded, inst.unanswered) == ((), False)
        h.exec_allowed = True
        inst = await provider.get(NAME, "host0")  # the table read again maps 192.0.2.11
        assert inst is not None and (inst.ip, inst.stranded) == ("192.0.2.11", ())
        h.exec_allowed = True  # the neighbour table maps it to the VM's MAC: the agent's address counts
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip == "192.0.2.11"
    finally:
        await provider.close()


async def test_an_agent_address_the_host_does_not_confirm_never_becomes_the_endpoint(
        logs: LogCapture) -> None:
    """The guest agent is the tenant's: its claim counts only where the host maps it to the VM's MAC."""
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    mac = naming.mac_address(NAME)
    try:
        await provider.create(request())
        h.agent_ips[NAME] = "192.0.2.99"  # another tenant's address, claimed; the host has not seen the VM
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip is None
        assert logs.lines("guest agent address not confirmed by the host's neighbour table")[-1][
            "verdict"] == "unconfirmed"
        h.neighbours["br0"] = [{"dst": "192.0.2.99", "lladdr": "52:54:00:00:00:01", "state": ["REACHABLE"]},
                               {"dst": "192.0.2.20", "lladdr": mac, "state": ["REACHABLE"]}]
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip == "192.0.2.20"  # the host's address for this MAC wins
        assert logs.lines("guest agent address not confirmed by the host's neighbour table")[-1][
            "verdict"] == "overruled"
        h.exec_allowed = False  # no `ip` for the SSH user: libvirt's ARP source is the host table
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip == "192.0.2.20"
    finally:
        await provider.close()


async def test_a_vm_whose_address_changed_under_the_filter_is_stranded_then_readdressed(
        logs: LogCapture) -> None:
    """The guest took another DHCP address; the host's filter still allows only the first one, so the host
    maps nothing to the MAC: `stranded` names the guest's addresses, `unanswered` says the host tried them
    all without an answer (FAILED, no lladdr). `readdress` defines the VM afresh from its own XML: a new
    UUID (libvirt's DHCP snooping state is keyed by it), the same name, MAC, disks and metadata, running."""
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        h.set_vm_ip(NAME, "192.0.2.10")
        inst = await provider.get(NAME, "host0")
        assert inst is not None and (inst.ip, inst.stranded) == ("192.0.2.10", ())
        old = h.domains[NAME]
        h.agent_ips[NAME] = "192.0.2.99"
        h.neighbours["br0"] = [{"dst": "192.0.2.10", "dev": "br0", "state": ["FAILED"]}]
        inst = await provider.get(NAME, "host0")
        assert inst is not None
        assert (inst.ip, inst.stranded, inst.unanswered) == (None, ("192.0.2.99",), False)
        h.neighbours["br0"].append({"dst": "192.0.2.99", "dev": "br0", "state": ["FAILED"]})
        inst = await provider.get(NAME, "host0")
        assert inst is not None
        assert (inst.ip, inst.stranded, inst.unanswered) == (None, ("192.0.2.99",), True)
        assert logs.lines("guest agent address not confirmed by the host's neighbour table")[-1][
            "unanswered"] is True

        await provider.readdress(NAME, "host0")
        new = h.domains[NAME]
        assert new.uuid != old.uuid and new.id not in (-1, old.id) and new.state == DomainState.RUNNING
        assert (new.mac, new.metadata) == (old.mac, old.metadata)
        old_xml, new_xml = etree.fromstring(old.xml.encode()), etree.fromstring(new.xml.encode())
        assert new_xml.find("uuid") is None  # defined without one: libvirt gave it a new UUID
        for el in old_xml.findall("uuid"):
            old_xml.remove(el)
        assert etree.tostring(new_xml) == etree.tostring(old_xml)
        steps = ("domain_undefine_flags", "domain_destroy_flags", "domain_define_xml",
                 "domain_create_with_flags")
        assert [c for c in h.calls if c in steps][-4:] == list(steps)
        assert logs.lines("KVM instance defined afresh and started (readdress)")
        with pytest.raises(TransientError, match="does not exist"):
            await provider.readdress("proxy-missing", "host0")
    finally:
        await provider.close()


@pytest.mark.parametrize(("failing", "left"), [
    ("domain_get_xml_desc", "running"),  # nothing touched yet
    ("domain_undefine_flags", "running"),  # still persistent, same UUID
    ("domain_destroy_flags", "transient"),  # undefined, still running: readdressed again later
    ("domain_define_xml", "gone"),  # volumes only: the controller creates it again
])
async def test_a_readdress_cut_short_never_leaves_the_vm_shut_off_under_its_old_uuid(failing: str,
                                                                                     left: str) -> None:
    """A shut-off domain under its old UUID is what the next reconcile would start as it is, restoring the
    stale snooped leases (the restart that crashed libvirtd 9.0 on the lab). Wherever a readdress stops
    (the host fails a call; an operator restart is the same cut), the VM is running under its old UUID,
    or gone; and a readdress after it completes the job."""
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        old = h.domains[NAME].uuid
        h.fail[failing] = lv_error(ErrorCode.INTERNAL_ERROR, "internal error: the host gave up")
        with pytest.raises(TransientError):
            await provider.readdress(NAME, "host0")
        dom = h.domains.get(NAME)
        state = "gone" if dom is None else ("transient" if not dom.persistent else "running")
        assert state == left
        if dom is not None:
            assert (dom.uuid, dom.state) == (old, DomainState.RUNNING)
            await provider.readdress(NAME, "host0")
            new = h.domains[NAME]
            assert (new.persistent, new.state) == (True, DomainState.RUNNING) and new.uuid != old
        else:
            assert OVERLAY in h.volumes and SEED in h.volumes  # the disks stay for the re-create
    finally:
        await provider.close()


async def test_a_vm_without_a_traffic_filter_is_never_stranded() -> None:
    """trafficFilter: none: nothing pins the old address, so a guest that moved is waited for (the host
    learns its new address from its traffic), not rebooted by a readdress."""
    provider, hv = fake_kvm_provider(trafficFilter="none")
    h = hv["host0"]
    try:
        await provider.create(request())
        assert not has_traffic_filter(h.domains[NAME].xml)
        h.set_vm_ip(NAME, "192.0.2.10")
        h.agent_ips[NAME] = "192.0.2.99"
        h.neighbours["br0"] = [{"dst": ip, "dev": "br0", "state": ["FAILED"]} for ip in ("192.0.2.10",
                                                                                          "192.0.2.99")]
        inst = await provider.get(NAME, "host0")
        assert inst is not None and (inst.ip, inst.stranded, inst.unanswered) == (None, (), False)
    finally:
        await provider.close()


async def test_neighbour_entries_of_other_macs_or_failed_are_ignored() -> None:
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        h.arp_broken = True
        h.neighbours["br0"] = [
            {"dst": "192.0.2.50", "lladdr": "52:54:00:00:00:01", "state": ["REACHABLE"]},
            {"dst": "192.0.2.51", "lladdr": naming.mac_address(NAME), "state": ["FAILED"]},
            {"dst": "169.254.0.9", "lladdr": naming.mac_address(NAME), "state": ["STALE"]},
            {"dst": "fe80::1", "lladdr": naming.mac_address(NAME), "state": ["STALE"]},
        ]
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip is None
        h.neighbours["br0"].append({"dst": "192.0.2.52", "lladdr": naming.mac_address(NAME).upper(),
                                    "state": ["STALE"]})
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.ip == "192.0.2.52"
    finally:
        await provider.close()


async def test_get_missing_is_none_and_unreachable_is_transient() -> None:
    provider, hv = fake_kvm_provider(hosts=["host0", "host1"])
    try:
        assert await provider.get("proxy-nothere", "host0") is None
        hv.set_unreachable("host1")
        with pytest.raises(TransientError, match="host1"):
            await provider.get("proxy-nothere", "host1")
        with pytest.raises(PermanentError, match="unknown zone 'host9'"):
            await provider.get("proxy-nothere", "host9")
    finally:
        await provider.close()


async def test_dropped_connection_is_transient_then_redialled_after_backoff(logs: LogCapture) -> None:
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        assert hv.dials == ["host0"]
        assert await provider.get(NAME, "host0") is not None
        assert hv.dials == ["host0"]  # one SSH connection, shared by every call
        h.fail["domain_get_state"] = ConnectionLost("connection reset by peer")  # the link dies mid-call
        with pytest.raises(TransientError, match="connection reset by peer"):
            await provider.get(NAME, "host0")
        dropped = logs.lines("libvirt connection dropped")
        assert [(r["reason"], r["host"]) for r in dropped] == [("connection reset by peer", "host0")]
        assert await provider.get(NAME, "host0") is not None  # re-dialled
        assert hv.dials == ["host0", "host0"]
        assert len(logs.lines("libvirt host connected")) == 2
        h.drop_connections("keepalive timeout")  # dies while idle: logged at once, next call re-dials
        assert logs.lines("libvirt connection dropped")[-1]["reason"] == "keepalive timeout"
        assert await provider.get(NAME, "host0") is not None
        assert len(logs.lines("libvirt connection dropped")) == 2
        assert hv.dials == ["host0", "host0", "host0"]

        hv.set_unreachable("host0")
        with pytest.raises(TransientError, match="unreachable"):
            await provider.get(NAME, "host0")
        with pytest.raises(TransientError, match="re-dialling with backoff"):
            await provider.get(NAME, "host0")  # within the backoff: no new dial
        assert hv.dials.count("host0") == 4
        assert logs.lines("libvirt host dial failed")[0]["error"].endswith("connection refused")
    finally:
        await provider.close()


async def test_placement_failures_are_permanent_and_name_the_value() -> None:
    provider, hv = fake_kvm_provider(hosts=["host0", "host1"])
    try:
        for placement, needle in [
            (Placement(), "placement.zone is required"),
            (Placement(zone="nas9"), "unknown placement.zone 'nas9'"),
            (Placement(zone="host0", machine_type="xl"), "unknown placement.machineType 'xl'"),
            (Placement(zone="host0", image="centos"), "unknown placement.image 'centos'"),
        ]:
            req = request()
            req = type(req)(name=req.name, owner_uid="u", placement=placement, user_data=b"")
            with pytest.raises(PermanentError, match=needle):
                await provider.create(req)
        with pytest.raises(PermanentError, match="instance name"):
            await provider.create(request(name="Bad_Name"))
        assert hv.dials == []  # decided without touching a host
    finally:
        await provider.close()


async def test_delete_removes_domain_overlay_and_seed_but_keeps_the_base(logs: LogCapture) -> None:
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        await provider.delete(NAME, "host0")
        assert NAME not in h.domains
        assert h.volume_names() == {DEFAULT_BASE, DEFAULT_MARKER}
        await provider.delete(NAME, "host0")  # already gone: success, quietly
        assert [r["removed"] for r in logs.lines("KVM instance deleted")] == [
            ["domain", OVERLAY, SEED]]
        assert logs.lines("KVM instance already gone")
        h.put_volume(OVERLAY, b"orphan", fmt="qcow2")  # crash before define left volumes
        h.put_volume(SEED, b"orphan")
        await provider.delete(NAME, "host0")
        assert h.volume_names() == {DEFAULT_BASE, DEFAULT_MARKER}
        await provider.create(request())
        h.shut_off(NAME)  # a stopped domain is undefined without a destroy
        h.calls.clear()
        await provider.delete(NAME, "host0")
        assert NAME not in h.domains
        assert "domain_destroy_flags" not in h.calls and "domain_undefine_flags" in h.calls
    finally:
        await provider.close()


async def test_foreign_domains_are_never_touched() -> None:
    mine, hv = fake_kvm_provider(cluster_id="cluster-a")
    theirs = type(mine)(name=mine.name, config=mine.config, cluster_id="cluster-b", dial=hv.dial)
    try:
        await theirs.create(request(name="proxy-theirs"))
        await mine.create(request(name="proxy-mine"))
        assert [i.name for i in await mine.list_managed()] == ["proxy-mine"]
        assert [i.name for i in await theirs.list_managed()] == ["proxy-theirs"]
        for action in (mine.delete("proxy-theirs", "host0"), mine.create(request(name="proxy-theirs"))):
            with pytest.raises(PermanentError, match="belongs to cluster 'cluster-b'"):
                await action
        assert "proxy-theirs" in hv["host0"].domains
        assert overlay_of("proxy-theirs", cluster_id="cluster-b") in hv["host0"].volumes
        # A domain without our metadata (someone's hand-made VM) is not ours either.
        hv["host0"].domains["proxy-theirs"].metadata.clear()
        with pytest.raises(PermanentError, match="not made by this operator"):
            await mine.delete("proxy-theirs", "host0")
        # Its listing keeps the element as first read (the operator never rewrites one, so GC reads each
        # domain's once), but nothing acts on that alone: a delete reads the element afresh and refuses.
        with pytest.raises(PermanentError, match="not made by this operator"):
            await theirs.delete("proxy-theirs", "host0")
        assert "proxy-theirs" in hv["host0"].domains
        # A new provider (a restart) reads it again.
        fresh = type(mine)(name=mine.name, config=mine.config, cluster_id="cluster-b", dial=hv.dial)
        try:
            assert [i.name for i in await fresh.list_managed()] == []
        finally:
            await fresh.close()
    finally:
        await mine.close()
        await theirs.close()


async def test_a_foreign_domain_defined_in_the_race_before_ours_is_not_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another cluster's operator defines the name between our lookup and our define: we must not start
    (or otherwise reuse) its domain; the define race branch checks the owner like every other path."""
    mine, hv = fake_kvm_provider(cluster_id="cluster-a")
    theirs = type(mine)(name=mine.name, config=mine.config, cluster_id="cluster-b", dial=hv.dial)
    h = hv["host0"]
    define = FakeLibvirtClient.domain_define_xml
    try:
        await theirs.create(request(name="proxy-race"))
        h.shut_off("proxy-race")
        foreign = h.domains.pop("proxy-race")  # not there yet when we look the name up ...

        async def raced(self: FakeLibvirtClient, xml: str) -> Any:
            h.domains.setdefault("proxy-race", foreign)  # ... but defined just before our define
            return await define(self, xml)

        monkeypatch.setattr(FakeLibvirtClient, "domain_define_xml", raced)
        with pytest.raises(PermanentError,
                           match="belongs to cluster 'cluster-b', not 'cluster-a'; refusing to reuse"):
            await mine.create(request(name="proxy-race"))
        assert h.domains["proxy-race"] is foreign
        assert foreign.state == DomainState.SHUTOFF  # not started by us
        ours = len(h.calls) - h.calls[::-1].index("domain_define_xml")
        assert "domain_create_with_flags" not in h.calls[ours:]
    finally:
        await mine.close()
        await theirs.close()


async def test_list_managed_across_hosts_and_a_failing_host() -> None:
    provider, hv = fake_kvm_provider(hosts=["host0", "host1"])
    try:
        await provider.create(request(name="proxy-a", zone="host0"))
        await provider.create(request(name="proxy-b", zone="host1"))
        hv["host1"].shut_off("proxy-b")
        got = {(i.name, i.zone, i.power_state, i.owner_uid) for i in await provider.list_managed()}
        assert got == {("proxy-a", "host0", PowerState.RUNNING, "uid-1"),
                       ("proxy-b", "host1", PowerState.STOPPED, "uid-1")}
        assert [i.name for i in await provider.list_managed("host1")] == ["proxy-b"]
        hv.set_unreachable("host1")
        with pytest.raises(TransientError):
            await provider.list_managed()
    finally:
        await provider.close()


async def test_quota_pool_space_for_overlay_and_seed() -> None:
    provider, hv = fake_kvm_provider(diskSizeGb=20, host_kwargs={"pool_capacity": 15 * 1024**3})
    try:
        with pytest.raises(QuotaError) as info:
            await provider.create(request())
        msg = str(info.value)
        assert "host 'host0'" in msg and "pool 'default'" in msg and "15.0 GiB" in msg and "20.0 GiB" in msg
        assert NAME not in hv["host0"].domains
    finally:
        await provider.close()


async def test_quota_host_memory() -> None:
    provider, hv = fake_kvm_provider(host_kwargs={"memory": 256 * 1024**2})
    try:
        with pytest.raises(QuotaError, match=r"host 'host0' has 256\.0 MiB free memory.*512 MiB"):
            await provider.create(request())
        assert NAME not in hv["host0"].domains
        # Checked before any volume: no overlay or user-data seed waits on the host for memory.
        assert not {v for v in hv["host0"].volume_names() if v.startswith(NAME)}
        assert "storage_vol_create_xml" not in hv["host0"].calls
        hv["host0"].exec_allowed = False  # MemAvailable unreadable: libvirt's figure decides
        with pytest.raises(QuotaError, match="free memory"):
            await provider.create(request())
        assert not {v for v in hv["host0"].volume_names() if v.startswith(NAME)}
    finally:
        await provider.close()


async def test_page_cache_is_not_a_memory_shortage() -> None:
    """libvirt reports MemFree; a host whose memory is mostly page cache can still start the VM."""
    provider, hv = fake_kvm_provider(host_kwargs={"memory": 4 * 1024**3})
    hv["host0"].page_cache = 4 * 1024**3 - 100 * 1024**2  # 100 MiB "free", the rest reclaimable
    try:
        await provider.create(request())
        assert hv["host0"].domains[NAME].state == DomainState.RUNNING
        assert ["cat", "/proc/meminfo"] in hv["host0"].exec_log
    finally:
        await provider.close()


async def test_many_creates_at_once_on_a_page_cache_host_share_one_meminfo_read() -> None:
    """The reconcile workers (hundreds) may create on one host at once; each create short of MemFree
    reads MemAvailable over SSH exec. sshd allows 10 session channels per connection (MaxSessions): an exec
    per create would have the 11th refused and its create fail with a false QuotaError (which, during a
    replacement, deletes the serving instance first: planner quota_fallback). The read is host-wide state:
    shared."""
    provider, hv = fake_kvm_provider(host_kwargs={"memory": 64 * 1024**3})
    h = hv["host0"]
    h.page_cache = 64 * 1024**3 - 100 * 1024**2  # 100 MiB "free", the rest reclaimable
    try:
        names = [f"proxy-m{i:02d}" for i in range(24)]
        results = await asyncio.gather(*(provider.create(request(n, uid=f"uid-{n}")) for n in names),
                                       return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
        assert all(h.domains[n].state == DomainState.RUNNING for n in names)
        assert 1 <= h.exec_log.count(["cat", "/proc/meminfo"]) < len(names)
    finally:
        await provider.close()


async def test_quota_no_space_from_libvirt_and_io_error_pause() -> None:
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        h.fail["storage_vol_create_xml"] = lv_error(
            ErrorCode.SYSTEM_ERROR, "cannot create volume: No space left on device", domain=18)
        with pytest.raises(QuotaError, match=r"pool 'default' is out of space.*No space left on device"):
            await provider.create(request())
        h.upload_fail_after = 1000
        with pytest.raises(QuotaError, match="No space left on device"):
            await provider.create(request())
        h.upload_fail_after = None
        await provider.create(request())
        h.pause_on_io_error(NAME)
        with pytest.raises(QuotaError, match=r"paused on an I/O error.*pool 'default'.*available"):
            await provider.get(NAME, "host0")
        with pytest.raises(QuotaError, match="paused on an I/O error"):
            await provider.create(request())
    finally:
        await provider.close()


async def test_other_libvirt_errors_are_transient_with_the_code() -> None:
    provider, hv = fake_kvm_provider()
    try:
        hv["host0"].fail["domain_define_xml"] = lv_error(ErrorCode.INTERNAL_ERROR, "internal error: boom")
        with pytest.raises(TransientError, match=r"internal error: boom \(libvirt INTERNAL_ERROR\)"):
            await provider.create(request())
        hv["host0"].pool_name = "elsewhere"
        with pytest.raises(TransientError, match="has no storage pool 'default'"):
            await provider.create(request())
    finally:
        await provider.close()


async def test_rpc_counts_for_create_and_get() -> None:
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        create_calls = list(h.calls)
        h.set_vm_ip(NAME, "192.0.2.7")
        h.calls.clear()
        await provider.get(NAME, "host0")
        assert h.calls == ["domain_lookup_by_name", "domain_get_metadata", "domain_get_state",
                           "domain_interface_addresses"]
        # No sha256 configured: the marker's size is read; the pool is refreshed before its space counts.
        assert len(create_calls) == 14, create_calls
        assert create_calls.index("storage_pool_refresh") < create_calls.index("storage_pool_get_info")
        h.calls.clear()
        # Already there and running: a Get's worth of calls after the lookup, and the room reads sent
        # with it on the pool handle kept from the first create (answers dropped: a rare path).
        await provider.create(request())
        assert h.calls[0] == "domain_lookup_by_name" and "storage_pool_lookup_by_name" not in h.calls
        assert h.calls[-3:] == ["domain_get_metadata", "domain_get_state", "domain_interface_addresses"]
        assert sorted(h.calls[1:-3]) == sorted(create_calls[2:9]), h.calls  # the room reads, nothing written
    finally:
        await provider.close()


async def test_libvirt_call_lines_and_no_secrets(logs: LogCapture) -> None:
    provider, hv = fake_kvm_provider()
    try:
        await provider.create(request())
        hv["host0"].fail["domain_get_state"] = lv_error(ErrorCode.INTERNAL_ERROR, "internal error: x")
        with pytest.raises(TransientError):
            await provider.get(NAME, "host0")
        calls = logs.lines("libvirt call")
        assert calls and all(r["logger"] == "kvm.libvirt" and r["level"] == "debug" for r in calls)
        assert all(r["provider"] == "kvm-test" and r["host"] == "host0" for r in calls)
        assert all(r.get("name") == NAME for r in calls)
        upload = next(r for r in calls if r["method"] == "storage_vol_upload")
        assert upload["volume"] == SEED and upload["length"] > 0 and "duration" in upload
        failed = next(r for r in calls if r["method"] == "domain_get_state")
        assert failed["libvirtCode"] == 1 and failed["libvirtCodeName"] == "INTERNAL_ERROR"
        assert failed["libvirtMessage"] == "internal error: x" and "error" in failed
        assert not any("xml" in r or "metadata" in r for r in calls)  # V(2) only
        ops = [r["msg"] for r in logs.lines() if r["logger"] == "kvm"]
        assert "domain defined" in ops and "KVM domain ensured running" in ops
        assert all(r.get("name") == NAME and "provider" in r and "host" in r
                   for r in logs.lines() if r["logger"] == "kvm")
        assert "hunter2" not in logs.text
    finally:
        await provider.close()


@pytest.mark.parametrize("logs", ["2"], indirect=True)
async def test_verbose_lines_carry_xml_metadata_addresses_but_never_cloud_init(logs: LogCapture) -> None:
    provider, hv = fake_kvm_provider()
    try:
        await provider.create(request())
        hv["host0"].set_vm_ip(NAME, "192.0.2.7")
        await provider.get(NAME, "host0")
        await provider.list_managed()
        calls = logs.lines("libvirt call")
        define = next(r for r in calls if r["method"] == "domain_define_xml")
        assert "<domain" in define["xml"]
        assert any(r["method"] == "storage_vol_create_xml" and "<volume" in r["xml"] for r in calls)
        assert any(r["method"] == "domain_get_metadata" and "<cluster>test-cluster</cluster>" in r["metadata"]
                   for r in calls)
        addrs = next(r for r in calls if r["method"] == "domain_interface_addresses")
        assert any("192.0.2.7/24" in i["addrs"] for i in addrs["addresses"])
        assert next(r for r in calls if r["method"] == "connect_list_all_domains")["names"] == [NAME]
        assert "hunter2" not in logs.text
    finally:
        await provider.close()


async def test_close_releases_sessions_and_leaves_no_task() -> None:
    before = asyncio.all_tasks()
    provider, hv = fake_kvm_provider()
    await provider.create(request())
    hv["host0"].drop_connections("gone")  # schedules the dropped session's close
    await provider.get(NAME, "host0")
    session = hv["host0"].sessions[-1]
    await provider.close()
    assert session.closed_reason is not None
    assert all(s.closed_reason is not None for s in hv["host0"].sessions)
    assert asyncio.all_tasks() == before


async def test_a_domain_vanishing_between_calls_is_gone_not_foreign() -> None:
    provider, hv = fake_kvm_provider()
    try:
        await provider.create(request())
        hv["host0"].fail["domain_get_metadata"] = lv_error(ErrorCode.NO_DOMAIN, "Domain not found")
        assert await provider.get(NAME, "host0") is None
        hv["host0"].fail["domain_get_metadata"] = lv_error(ErrorCode.NO_DOMAIN, "Domain not found")
        assert await provider.list_managed() == []
        hv["host0"].fail["domain_get_metadata"] = lv_error(ErrorCode.NO_DOMAIN, "Domain not found")
        await provider.delete(NAME, "host0")  # looked up again: still there, so deleted as usual
        assert NAME not in hv["host0"].domains
        assert not {v for v in hv["host0"].volume_names() if v.startswith(NAME)}
    finally:
        await provider.close()


async def test_delete_of_a_domain_undefined_between_lookup_and_metadata_succeeds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleting something already gone succeeds, also when it goes between two of delete's own calls."""
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    get_metadata = FakeLibvirtClient.domain_get_metadata

    async def undefined_meanwhile(self: FakeLibvirtClient, dom: Any, *args: Any) -> str:
        h.domains.pop(dom.name, None)  # someone undefined it just now; its volumes are still there
        return await get_metadata(self, dom, *args)

    try:
        await provider.create(request())
        monkeypatch.setattr(FakeLibvirtClient, "domain_get_metadata", undefined_meanwhile)
        await provider.delete(NAME, "host0")
        assert not {v for v in h.volume_names() if v.startswith(NAME)}
        assert NAME not in h.domains
    finally:
        await provider.close()
