"""The provider's pure pieces: names, MAC, domain and volume XML, metadata, seed ISO, qcow2 header checks."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fakes import kvm_config, qcow2_image
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from egress_kvm.config.models import CpuConfig, TrafficFilter, parse_host_port
from egress_kvm.policy.policies import url_image_policy
from egress_kvm.providers.base import PermanentError, Placement
from egress_kvm.providers.kvm import addresses, metadata, naming, placement, qcow2, seed
from egress_kvm.providers.kvm.domain_xml import (
    DomainSpec,
    domain_xml,
    has_traffic_filter,
    volume_xml,
    without_uuid,
)

META = metadata.InstanceMetadata(cluster_id="c1", owner_uid="uid-1", created_at=datetime(2026, 1, 2, 3, 4, 5,
                                 tzinfo=UTC), owner_namespace="ns", owner_name="px", zone="h0",
                                 machine_type="small", image="debian-12")


def spec(**over: object) -> DomainSpec:
    base = dict(name="proxy-abc", domain_type="kvm", vcpus=2, memory_mib=1024,
                cpu=CpuConfig(mode="host-passthrough"), pool="default", overlay_volume="proxy-abc.qcow2",
                seed_volume="proxy-abc-seed.iso", seed_bus="sata", bridge="br0", mac="52:54:00:aa:bb:cc",
                meta=META)
    base.update(over)
    return DomainSpec(**base)  # type: ignore[arg-type]


def test_names_follow_the_spec_table() -> None:
    tag = naming.volume_tag(cluster_id="c1", namespace="ns1", name="proxy-abc")
    owner = {"cluster_id": "c1", "namespace": "ns1"}
    assert naming.overlay_volume("proxy-abc", **owner) == f"proxy-abc.ns1.{tag}.qcow2"
    assert naming.seed_volume("proxy-abc", **owner) == f"proxy-abc.ns1.{tag}-seed.iso"
    assert naming.legacy_volumes("proxy-abc") == ("proxy-abc.qcow2", "proxy-abc-seed.iso")
    sha = "ab" * 32
    url = "https://example.test/a.qcow2"
    # Content-addressed: a pinned image by its sha256, an unpinned one by its URL (naming.image_digest).
    assert naming.base_volume(key="debian-13", url=url, sha256=sha) == "base-debian-13-abababababababab.qcow2"
    assert naming.base_volume(key="debian-13", url=url + "?v2", sha256=sha) == \
        "base-debian-13-abababababababab.qcow2"  # same bytes, same base
    assert naming.base_volume(key="debian-13", url=url) == f"base-debian-13-{naming.url_hash(url)}.qcow2"
    assert naming.base_volume(key="debian-13", url=url + "?v2") != \
        naming.base_volume(key="debian-13", url=url)
    assert naming.legacy_base_volume("debian-13") == "base-debian-13.qcow2"
    assert naming.marker_volume("base-debian-13.qcow2") == "base-debian-13.qcow2.sha256"
    by_url = naming.base_volume(url=url)
    assert by_url.startswith("base-") and by_url.endswith(".qcow2") and len(by_url) == len("base-.qcow2") + 16
    assert by_url != naming.base_volume(url="https://example.test/b.qcow2")


def test_mac_is_deterministic_and_locally_administered() -> None:
    mac = naming.mac_address("proxy-abc")
    assert mac == naming.mac_address("proxy-abc")
    assert mac != naming.mac_address("proxy-abd")
    assert mac.startswith("52:54:00:") and len(mac.split(":")) == 6


def test_domain_xml_has_every_element_of_the_spec() -> None:
    root = etree.fromstring(domain_xml(spec()).encode())
    assert root.get("type") == "kvm"
    assert root.findtext("name") == "proxy-abc"
    assert root.find("memory").get("unit") == "MiB" and root.findtext("memory") == "1024"
    assert root.findtext("vcpu") == "2"
    assert root.find("os/type").get("machine") == "q35"
    assert root.find("cpu").get("mode") == "host-passthrough"
    disks = root.findall("devices/disk")
    disk = next(d for d in disks if d.get("device") == "disk")
    assert disk.find("target").get("bus") == "virtio"
    assert disk.find("source").attrib == {"pool": "default", "volume": "proxy-abc.qcow2"}
    assert disk.find("driver").get("type") == "qcow2"
    cdrom = next(d for d in disks if d.get("device") == "cdrom")
    assert cdrom.find("target").get("bus") == "sata"
    assert cdrom.find("source").get("volume") == "proxy-abc-seed.iso"
    assert cdrom.find("readonly") is not None
    assert root.find("devices/controller[@type='scsi']") is None
    nics = root.findall("devices/interface")
    assert len(nics) == 1 and nics[0].get("type") == "bridge"
    assert nics[0].find("source").get("bridge") == "br0"
    assert nics[0].find("model").get("type") == "virtio"
    assert nics[0].find("mac").get("address") == "52:54:00:aa:bb:cc"
    assert root.find("devices/serial") is not None and root.find("devices/console") is not None
    assert root.find("devices/channel/target").get("name") == "org.qemu.guest_agent.0"
    assert root.find("devices/rng").get("model") == "virtio"
    assert root.find("devices/graphics") is None
    md = root.find("metadata")[0]
    assert metadata.parse(etree.tostring(md, encoding="unicode")) == META


def test_domain_xml_qemu_scsi_and_disabled_cpu_features() -> None:
    cpu = CpuConfig(mode="maximum", disabledFeatures=["arch-capabilities"])
    xml = domain_xml(spec(domain_type="qemu", cpu=cpu, seed_bus="scsi"))
    root = etree.fromstring(xml.encode())
    assert root.get("type") == "qemu"
    assert root.find("cpu").get("mode") == "maximum"
    assert [(f.get("policy"), f.get("name")) for f in root.findall("cpu/feature")] == [
        ("disable", "arch-capabilities")]
    cdrom = root.find("devices/disk[@device='cdrom']")
    assert cdrom.find("target").get("bus") == "scsi"
    assert root.find("devices/controller[@type='scsi']").get("model") == "virtio-scsi"


def test_overlay_volume_states_backing_format() -> None:
    vol = etree.fromstring(volume_xml(name="p.qcow2", capacity=10, fmt="qcow2", backing_path="/p/base.qcow2",
                                      backing_format="qcow2").encode())
    assert vol.find("target/format").get("type") == "qcow2"
    assert vol.findtext("backingStore/path") == "/p/base.qcow2"
    assert vol.find("backingStore/format").get("type") == "qcow2"
    with pytest.raises(ValueError, match="backing format"):
        volume_xml(name="p", capacity=1, fmt="qcow2", backing_path="/x")


def test_metadata_round_trip_and_rejections() -> None:
    xml = metadata.to_xml(META)
    assert metadata.NAMESPACE in xml and "egress:" in xml
    assert metadata.parse(xml) == META
    plain = xml.replace("egress:", "").replace(f' xmlns:egress="{metadata.NAMESPACE}"', "")
    assert plain.startswith("<instance><managed>")  # how libvirt's GET_METADATA returns it
    assert metadata.parse(plain) == META
    with pytest.raises(metadata.MetadataError):
        metadata.parse("<instance xmlns='urn:other'/>")
    with pytest.raises(metadata.MetadataError):
        metadata.parse("<other xmlns='urn:x'/>")
    with pytest.raises(metadata.MetadataError):
        metadata.parse("not xml")
    for _twice in range(2):  # parse() keeps what it read (a bounded cache), never a failure
        with pytest.raises(metadata.MetadataError, match="created"):
            metadata.parse(xml.replace("2026-01-02T03:04:05Z", "yesterday"))
    assert metadata.parse(xml) == metadata.parse(plain) == META  # read again: answered the same


def test_seed_iso_contents() -> None:
    iso = seed.build_seed_iso(name="proxy-abc", user_data=b"#cloud-config\nfoo: 1\n",
                              vendor_data="#cloud-config\n")
    got = seed.read_seed_iso(iso)
    assert got.label == "cidata"
    assert got.files["user-data"] == b"#cloud-config\nfoo: 1\n"
    assert got.files["meta-data"] == b"instance-id: proxy-abc\nlocal-hostname: proxy-abc\n"
    assert got.files["vendor-data"] == b"#cloud-config\n"
    none = seed.read_seed_iso(seed.build_seed_iso(name="p", user_data=b"x", vendor_data=""))
    assert "vendor-data" not in none.files


@pytest.mark.skipif(shutil.which("blkid") is None or shutil.which("isoinfo") is None,
                    reason="needs blkid and isoinfo")
def test_seed_iso_read_by_real_tools(tmp_path: Path) -> None:
    """cloud-init finds the seed by label and reads Rock Ridge/Joliet names: checked with real tools."""
    path = tmp_path / "seed.iso"
    path.write_bytes(seed.build_seed_iso(name="proxy-abc", user_data=b"#cloud-config\n", vendor_data="v"))
    out = subprocess.run(["blkid", "-o", "export", str(path)], capture_output=True, text=True,
                         check=True).stdout
    assert "LABEL=cidata" in out and "TYPE=iso9660" in out
    listing = subprocess.run(["isoinfo", "-R", "-f", "-i", str(path)], capture_output=True, text=True,
                             check=True).stdout.split()
    assert sorted(listing) == ["/meta-data", "/user-data", "/vendor-data"]
    meta = subprocess.run(["isoinfo", "-R", "-x", "/meta-data", "-i", str(path)], capture_output=True,
                          check=True).stdout
    assert meta == b"instance-id: proxy-abc\nlocal-hostname: proxy-abc\n"


def test_qcow2_header_checks() -> None:
    qcow2.check_header(qcow2_image(), fmt="qcow2")
    qcow2.check_header(qcow2_image(version=2), fmt="qcow2")
    qcow2.check_header(b"anything at all", fmt="raw")
    with pytest.raises(qcow2.UnsafeImageError, match="backing file"):
        qcow2.check_header(qcow2_image(backing=True), fmt="qcow2")
    with pytest.raises(qcow2.UnsafeImageError, match="external data file"):
        qcow2.check_header(qcow2_image(data_file=True), fmt="qcow2")
    with pytest.raises(qcow2.UnsafeImageError, match="not a qcow2"):
        qcow2.check_header(b"\0" * 512, fmt="qcow2")
    with pytest.raises(qcow2.UnsafeImageError, match="truncated"):
        qcow2.check_header(qcow2_image()[:40], fmt="qcow2")


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-img")
def test_qcow2_header_checks_on_real_images(tmp_path: Path) -> None:
    plain, overlay, data = tmp_path / "a.qcow2", tmp_path / "b.qcow2", tmp_path / "c.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(plain), "1M"], check=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(plain), "-F", "qcow2", str(overlay)],
                   check=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", f"data_file={tmp_path / 'c.raw'}",
                    str(data), "1M"], check=True)
    qcow2.check_header(plain.read_bytes()[:4096], fmt="qcow2")
    with pytest.raises(qcow2.UnsafeImageError, match="backing file"):
        qcow2.check_header(overlay.read_bytes()[:4096], fmt="qcow2")
    with pytest.raises(qcow2.UnsafeImageError, match="external data file"):
        qcow2.check_header(data.read_bytes()[:4096], fmt="qcow2")


def test_placement_rules() -> None:
    one = kvm_config(hosts=["h0"]).kvm
    two = kvm_config(hosts=["h0", "h1"], images={"a": {"url": "http://x/a"}, "b": {"url": "http://x/b"}},
                     machine_types={"small": {"vcpus": 1, "memoryMiB": 512},
                                    "big": {"vcpus": 4, "memoryMiB": 4096}},
                     urlImages=["example.test"]).kvm
    r = placement.resolve(Placement(), one, provider="p")
    assert (r.zone, r.machine_type, r.image) == ("h0", "small", "debian-12")
    r = placement.resolve(Placement(zone="h1", machine_type="big", image="b", region="ignored"), two,
                          provider="p")
    assert (r.zone, r.machine_type, r.image) == ("h1", "big", "b")
    url = "https://example.test/img.qcow2"
    policy = url_image_policy(None, two.url_images)
    resolved = placement.resolve(Placement(zone="h0", machine_type="big", image=url), two, provider="p",
                                 url_policy=policy)
    assert resolved.image == url
    with pytest.raises(PermanentError, match="URL images are off"):  # `one` has no urlImages
        placement.resolve(Placement(image=url), one, provider="p")
    with pytest.raises(PermanentError, match="not in the allowlist"):
        placement.resolve(Placement(zone="h0", machine_type="big", image="https://other.test/i.qcow2"), two,
                          provider="p", url_policy=policy)
    cases = [
        (Placement(machine_type="big", image="a"), "placement.zone is required"),
        (Placement(zone="h9", machine_type="big", image="a"), "unknown placement.zone 'h9'"),
        (Placement(zone="h0", machine_type="huge", image="a"), "unknown placement.machineType 'huge'"),
        (Placement(zone="h0", machine_type="big", image="ubuntu"), "unknown placement.image 'ubuntu'"),
        (Placement(zone="h0", machine_type="big", image="ftp://x/y"), "unknown placement.image 'ftp://x/y'"),
        (Placement(zone="h0", machine_type="big", image="https://"), "placement.image 'https://'"),
        (Placement(zone="h0", image="a"), "placement.machineType is required"),
    ]
    for p, msg in cases:
        with pytest.raises(PermanentError, match=msg.replace(".", r"\.")):
            placement.resolve(p, two, provider="p", url_policy=policy)
    src = placement.image_source(two, url)
    assert src.base_volume == naming.base_volume(url=url) and src.format == "qcow2" and src.sha256 is None


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(["dst", "lladdr", "state", "x"]), c,
                                                       max_size=4), max_leaves=12).map(json.dumps)))
def test_neighbour_parsing_never_raises(text: str) -> None:
    """Whatever `ip -j neigh` (or a hostile host) prints, the table holds only usable addresses."""
    table = addresses.host_table(text, "52:54:00:aa:bb:cc")
    assert all(addresses.usable_ipv4(ip) for ip in table.mapped)
    assert all(addresses.usable_ipv4(ip) for ip in table.failed)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_host_port_parsing_accepts_or_explains(value: str) -> None:
    try:
        host, port = parse_host_port(value)
    except ValueError as exc:
        assert str(exc)
    else:
        assert host and 1 <= port <= 65535


@pytest.mark.parametrize(("agent", "host", "verdict", "ip"), [
    ([], [], addresses.Verdict.NONE, None),
    (["192.0.2.5"], [], addresses.Verdict.UNCONFIRMED, None),  # the guest's word alone is not enough
    ([], ["192.0.2.5"], addresses.Verdict.HOST_ONLY, "192.0.2.5"),
    (["192.0.2.5"], ["192.0.2.5"], addresses.Verdict.CONFIRMED, "192.0.2.5"),
    (["192.0.2.9"], ["192.0.2.5"], addresses.Verdict.OVERRULED, "192.0.2.5"),  # claims another's address
    (["192.0.2.9", "192.0.2.5"], ["192.0.2.7", "192.0.2.5"], addresses.Verdict.CONFIRMED, "192.0.2.5"),
])
def test_the_endpoint_decision(agent: list[str], host: list[str], verdict: addresses.Verdict,
                               ip: str | None) -> None:
    assert addresses.decide(agent=agent, host=host) == addresses.Decision(verdict, ip)


NEIGH = json.dumps([
    {"dst": "192.0.2.5", "dev": "br0", "lladdr": "52:54:00:aa:bb:cc", "state": ["STALE"]},
    {"dst": "192.0.2.9", "dev": "br0", "state": ["FAILED"]},
    {"dst": "192.0.2.8", "dev": "br0", "state": "INCOMPLETE"},
    {"dst": "169.254.1.1", "dev": "br0", "state": ["FAILED"]},
    {"dst": "192.0.2.7", "dev": "br0", "lladdr": "52:54:00:00:00:07", "state": ["REACHABLE"]},
])


def test_the_host_table_for_one_vm() -> None:
    """Mapped: the MAC's usable entries; failed: every usable address nobody answered for (no lladdr)."""
    table = addresses.host_table(NEIGH, "52:54:00:AA:BB:CC")
    assert table == addresses.HostTable(("192.0.2.5",), frozenset({"192.0.2.9", "192.0.2.8"}))
    assert addresses.host_table("not json", "52:54:00:aa:bb:cc") == addresses.HostTable(read=False)
    not_a_list = '{"dst": "192.0.2.5"}'
    assert addresses.host_table(not_a_list, "52:54:00:aa:bb:cc") == addresses.HostTable(read=False)
    assert addresses.host_table("", "52:54:00:aa:bb:cc") == addresses.HostTable()  # read: no entries


def test_one_host_output_answers_every_vm_on_it() -> None:
    """The output is read once per host (addresses._table) and then answers each VM by its MAC; what a
    caller gets is immutable (nothing it does changes the answer for the next VM)."""
    assert addresses.host_table(NEIGH, "52:54:00:aa:bb:cc").mapped == ("192.0.2.5",)
    assert addresses.host_table(NEIGH, "52:54:00:AA:BB:CC").mapped == ("192.0.2.5",)
    assert addresses.host_table(NEIGH, "52:54:00:00:00:07").mapped == ("192.0.2.7",)
    assert addresses.host_table(NEIGH, "52:54:00:00:00:99") == \
        addresses.HostTable((), frozenset({"192.0.2.9", "192.0.2.8"}))
    mac = "52:54:00:aa:bb:cc"
    assert addresses.host_table(NEIGH, mac) == addresses.host_table(NEIGH, mac)


FAILED_9 = frozenset({"192.0.2.9"})


@pytest.mark.parametrize(("agent", "mapped", "failed", "lost", "silent", "read"), [
    ([], (), FAILED_9, (), False, True),  # no claim (no agent yet): nothing to go on
    (["192.0.2.9"], (), FAILED_9, ("192.0.2.9",), True, True),  # changed; the host tried it: no answer
    (["192.0.2.9"], (), frozenset(), ("192.0.2.9",), False, True),  # not tried by the host (yet)
    (["192.0.2.9", "192.0.2.4"], (), FAILED_9, ("192.0.2.9", "192.0.2.4"), False, True),  # one never tried
    (["192.0.2.9"], ("192.0.2.5",), FAILED_9, ("192.0.2.9",), True, True),  # the old one still mapped
    (["192.0.2.5"], ("192.0.2.5",), frozenset(), (), False, True),  # confirmed
    (["192.0.2.9"], (), FAILED_9, (), False, False),  # no table (exec refused, no ARP): no evidence
])
def test_the_stranded_decision(agent: list[str], mapped: tuple[str, ...], failed: frozenset[str],
                               lost: tuple[str, ...], silent: bool, read: bool) -> None:
    table = addresses.HostTable(mapped, failed, read)
    assert addresses.stranded(agent=agent, table=table) == lost
    assert addresses.unanswered(lost, table) is silent


def test_without_uuid_keeps_everything_else() -> None:
    xml = ("<domain type='qemu'><name>proxy-a</name><uuid>0f8e2a58-4b8e-4c8e-9a34-0d7c1e6b5f21</uuid>"
           "<devices><interface type='bridge'><mac address='52:54:00:aa:bb:cc'/></interface></devices>"
           "</domain>")
    out = without_uuid(xml)
    assert "uuid" not in out and "<name>proxy-a</name>" in out and "52:54:00:aa:bb:cc" in out


@pytest.mark.parametrize(("switch", "filterref"), [
    (TrafficFilter.CLEAN_TRAFFIC, "clean-traffic"),
    (TrafficFilter.NONE, None),
])
def test_the_nic_carries_the_traffic_filter_with_dhcp_learning(switch: TrafficFilter,
                                                               filterref: str | None) -> None:
    xml = domain_xml(spec(traffic_filter=switch))
    assert has_traffic_filter(xml) is (filterref is not None)
    nic = etree.fromstring(xml.encode()).find("devices/interface")
    ref = nic.find("filterref")
    if filterref is None:
        assert ref is None
    else:
        assert ref.get("filter") == filterref
        assert {p.get("name"): p.get("value") for p in ref.findall("parameter")} == {
            "CTRL_IP_LEARNING": "dhcp"}
