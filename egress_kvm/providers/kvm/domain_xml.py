"""The domain and volume XML the provider sends to libvirt, built with lxml (never by string pasting).

The domain is the spec's "What lands on the host" paragraph: q35, the configured CPU (host-passthrough
by default; `maximum` under software emulation, where libvirt rejects host-passthrough), the overlay on
virtio, the seed on a SATA cdrom (or virtio-scsi for kernels without AHCI), one virtio NIC on the bridge
with the deterministic MAC (under libvirt's `clean-traffic` nwfilter unless the providers file turns it
off), a serial console, the guest-agent channel, a virtio RNG, no graphics, and
the operator's metadata element. Disks reference pool volumes by name (`type='volume'`), so the XML
needs no host paths and works for any pool type.
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

from egress_kvm.config.models import CpuConfig, TrafficFilter

from . import metadata

GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0"
# libvirt learns (and from then on pins) the NIC's IPv4 by snooping the DHCP exchange, so the address is
# the one the bridge's DHCP server handed out, not whichever the guest sends first (the default, "any").
# Works with libvirt 9.0 without a live domain update; the learned address survives a libvirtd restart.
IP_LEARNING = "dhcp"


@dataclass(frozen=True)
class DomainSpec:
    name: str
    domain_type: str  # "kvm" | "qemu"
    vcpus: int
    memory_mib: int
    cpu: CpuConfig
    pool: str
    overlay_volume: str
    seed_volume: str
    seed_bus: str  # "sata" | "scsi"
    bridge: str
    mac: str
    meta: metadata.InstanceMetadata
    traffic_filter: TrafficFilter = TrafficFilter.CLEAN_TRAFFIC
    # The static address the operator allocated (no DHCP on the bridge): the filter pins the NIC to it.
    ip: str | None = None


def _sub(parent: etree._Element, tag: str, text: str | None = None, **attrs: str) -> etree._Element:
    el = etree.SubElement(parent, tag, {k.rstrip("_"): v for k, v in attrs.items()})
    if text is not None:
        el.text = text
    return el


def domain_xml(spec: DomainSpec) -> str:
    dom = etree.Element("domain", type=spec.domain_type)
    _sub(dom, "name", spec.name)
    _sub(dom, "memory", str(spec.memory_mib), unit="MiB")
    _sub(dom, "vcpu", str(spec.vcpus))
    meta = _sub(dom, "metadata")
    meta.append(metadata.build_element(spec.meta))

    os_ = _sub(dom, "os")
    _sub(os_, "type", "hvm", arch="x86_64", machine="q35")
    _sub(os_, "boot", dev="hd")
    features = _sub(dom, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    cpu = _sub(dom, "cpu", mode=spec.cpu.mode, check="none")
    for feature in spec.cpu.disabled_features:
        _sub(cpu, "feature", policy="disable", name=feature)
    _sub(dom, "clock", offset="utc")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")

    dev = _sub(dom, "devices")
    disk = _sub(dev, "disk", type="volume", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2", discard="unmap")
    _sub(disk, "source", pool=spec.pool, volume=spec.overlay_volume)
    _sub(disk, "target", dev="vda", bus="virtio")

    cdrom = _sub(dev, "disk", type="volume", device="cdrom")
    _sub(cdrom, "driver", name="qemu", type="raw")
    _sub(cdrom, "source", pool=spec.pool, volume=spec.seed_volume)
    _sub(cdrom, "target", dev="sda", bus=spec.seed_bus)
    _sub(cdrom, "readonly")
    if spec.seed_bus == "scsi":
        _sub(dev, "controller", type="scsi", index="0", model="virtio-scsi")

    nic = _sub(dev, "interface", type="bridge")
    _sub(nic, "mac", address=spec.mac)
    _sub(nic, "source", bridge=spec.bridge)
    _sub(nic, "model", type="virtio")
    if spec.traffic_filter is not TrafficFilter.NONE:
        ref = _sub(nic, "filterref", filter=spec.traffic_filter.value)
        if spec.ip is not None:  # no DHCP to learn from: the allocated address is the only one allowed
            _sub(ref, "parameter", name="IP", value=spec.ip)
        else:
            _sub(ref, "parameter", name="CTRL_IP_LEARNING", value=IP_LEARNING)

    serial = _sub(dev, "serial", type="pty")
    _sub(serial, "target", port="0")
    console = _sub(dev, "console", type="pty")
    _sub(console, "target", type="serial", port="0")
    channel = _sub(dev, "channel", type="unix")
    _sub(channel, "target", type="virtio", name=GUEST_AGENT_CHANNEL)
    rng = _sub(dev, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")
    _sub(dev, "memballoon", model="virtio")
    # No <graphics>/<video>: a proxy VM is reached over the network and `virsh console`.
    return str(etree.tostring(dom, encoding="unicode", pretty_print=True))


def without_uuid(xml: str) -> str:
    """A domain's XML as libvirt dumps it, minus `<uuid>`: defined again, it gets a new UUID (and with
    it a fresh nwfilter DHCP-snooping state; provider.readdress)."""
    root = etree.fromstring(xml.encode())
    for el in root.findall("uuid"):
        root.remove(el)
    return str(etree.tostring(root, encoding="unicode"))


def has_traffic_filter(xml: str) -> bool:
    """Whether a NIC of this domain XML carries an nwfilter (`filterref`): only then can libvirt's DHCP
    snooping pin a stale address, so only then is a stranded VM worth a readdress."""
    return etree.fromstring(xml.encode()).find("devices/interface/filterref") is not None


def volume_xml(*, name: str, capacity: int, fmt: str, backing_path: str | None = None,
               backing_format: str | None = None) -> str:
    """A storage volume. The overlay states its backing format: qemu must never probe a base image."""
    vol = etree.Element("volume")
    _sub(vol, "name", name)
    _sub(vol, "capacity", str(capacity), unit="bytes")
    _sub(vol, "allocation", "0", unit="bytes")
    target = _sub(vol, "target")
    _sub(target, "format", type=fmt)
    if backing_path is not None:
        if backing_format is None:
            raise ValueError("an overlay must state its backing format")
        backing = _sub(vol, "backingStore")
        _sub(backing, "path", backing_path)
        _sub(backing, "format", type=backing_format)
    return str(etree.tostring(vol, encoding="unicode"))
