"""The operator's element in each domain's <metadata>: an on-host contract, read across versions.

libvirt has no labels, so this element is how list_managed (and the GC on top of it) recognises its own
domains: `managed` says an operator made it, `cluster` says which cluster's operator, so two clusters
sharing one hypervisor never collect each other's VMs. The namespace URI carries the version; a future
incompatible layout gets a new URI and old domains stay readable by the old parser.

    <egress:instance xmlns:egress="https://egressproxies.io/kvm/v1">
      <egress:managed>true</egress:managed>
      <egress:cluster>3f1c...</egress:cluster>
      <egress:owner uid="..." namespace="default" name="proxy-sample"/>
      <egress:created>2026-11-30T01:02:03Z</egress:created>
      <egress:placement zone="nas1" machineType="small" image="debian-13"/>
      <egress:address ip="192.168.10.100"/>
    </egress:instance>

`address` is there only on a host with `staticAddresses` (static_ip.py): the address the operator gave
the VM, which is how the addresses in use are known after a restart. Older elements simply lack it.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime

from lxml import etree

NAMESPACE = "https://egressproxies.io/kvm/v1"
PREFIX = "egress"
ROOT = "instance"
_NS = f"{{{NAMESPACE}}}"
# parse() answers from memory for an element it has read (one per domain: a domain's element changes
# only when it is redefined); bounded above the fleet's domains per operator.
PARSED_CACHE_SIZE = 2048


@dataclass(frozen=True)
class InstanceMetadata:
    cluster_id: str
    owner_uid: str
    created_at: datetime
    owner_namespace: str = ""
    owner_name: str = ""
    zone: str = ""
    machine_type: str = ""
    image: str = ""
    managed: bool = True
    address: str = ""  # the static IPv4 the operator allocated; "" on a DHCP bridge


class MetadataError(ValueError):
    """The element is there but not in a shape this version understands."""


def format_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_element(meta: InstanceMetadata) -> etree._Element:
    root = etree.Element(_NS + ROOT, nsmap={PREFIX: NAMESPACE})
    etree.SubElement(root, _NS + "managed").text = "true" if meta.managed else "false"
    etree.SubElement(root, _NS + "cluster").text = meta.cluster_id
    owner = etree.SubElement(root, _NS + "owner")
    owner.set("uid", meta.owner_uid)
    owner.set("namespace", meta.owner_namespace)
    owner.set("name", meta.owner_name)
    etree.SubElement(root, _NS + "created").text = format_time(meta.created_at)
    placement = etree.SubElement(root, _NS + "placement")
    placement.set("zone", meta.zone)
    placement.set("machineType", meta.machine_type)
    placement.set("image", meta.image)
    if meta.address:
        etree.SubElement(root, _NS + "address").set("ip", meta.address)
    return root


def to_xml(meta: InstanceMetadata) -> str:
    return str(etree.tostring(build_element(meta), encoding="unicode"))


def parse(xml: str) -> InstanceMetadata:
    """Parse what DOMAIN_GET_METADATA returns for our namespace (see _parse).

    Every Get and every GC pass reads each domain's element again, and the result is a frozen value of
    the text alone: the same text is parsed once (an error is not kept, it is raised again)."""
    return _parse(xml)


@functools.lru_cache(maxsize=PARSED_CACHE_SIZE)
def _parse(xml: str) -> InstanceMetadata:
    """Parse what DOMAIN_GET_METADATA returns for our namespace.

    libvirt hands the element back with its namespace stripped (`<instance><managed>...`), since the
    caller named the namespace in the request; the domain XML carries it qualified. Both are accepted:
    elements match by local name under either our namespace or none.
    """
    try:
        root = etree.fromstring(xml.encode(), parser=etree.XMLParser(resolve_entities=False, no_network=True))
    except etree.XMLSyntaxError as exc:
        raise MetadataError(f"metadata element is not XML: {exc}") from None
    ns = etree.QName(root).namespace
    if etree.QName(root).localname != ROOT or ns not in (None, NAMESPACE):
        raise MetadataError(f"metadata root is {root.tag!r}, expected {ROOT!r} in {NAMESPACE}")
    prefix = _NS if ns else ""

    def child(tag: str) -> etree._Element | None:
        return root.find(prefix + tag)

    def text(tag: str) -> str:
        el = child(tag)
        return (el.text or "").strip() if el is not None else ""

    created_text = text("created")
    try:
        created = datetime.strptime(created_text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise MetadataError(f"metadata created {created_text!r} is not an RFC 3339 UTC time") from None
    owner = child("owner")
    placement = child("placement")
    address = child("address")
    return InstanceMetadata(
        cluster_id=text("cluster"),
        owner_uid=owner.get("uid", "") if owner is not None else "",
        owner_namespace=owner.get("namespace", "") if owner is not None else "",
        owner_name=owner.get("name", "") if owner is not None else "",
        created_at=created,
        zone=placement.get("zone", "") if placement is not None else "",
        machine_type=placement.get("machineType", "") if placement is not None else "",
        image=placement.get("image", "") if placement is not None else "",
        managed=text("managed") == "true",
        address=_address(address.get("ip")) if address is not None else "",
    )


def _address(value: str | None) -> str:
    """The recorded static address, exactly as build_element writes it (a dotted IPv4): anything else is
    a MetadataError like any other malformed field, so a damaged element never becomes an endpoint nor
    silently stops holding its address."""
    try:
        ip = str(ipaddress.IPv4Address(value or ""))
    except ValueError:
        ip = ""
    if not ip or ip != value:
        raise MetadataError(f"metadata address {value!r} is not an IPv4 address")
    return ip
