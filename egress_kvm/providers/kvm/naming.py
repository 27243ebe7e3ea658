"""Names of everything the provider puts on a host, and the VM's deterministic MAC address.

All of it derives from the instance name (or the image key, URL and sha256) and nothing else, so a
reconcile after a crash finds what an earlier one left, Delete can remove volumes by name with no domain
to consult, and a LAN admin can make DHCP reservations for a VM before it exists.

An instance's volumes also carry who made them, since a volume has no metadata element to say so: the
owner's namespace and a tag keyed by the cluster id (`<instance>.<namespace>.<tag>.qcow2`,
`<instance>.<namespace>.<tag>-seed.iso`, tag = HMAC-SHA256(cluster id, namespace and instance name), 16
hex digits). Orphan-volume GC collects only volumes whose tag it can recompute with its own cluster id,
so two clusters sharing a pool never collect each other's (docs/kvm-provider.md, "Orphan volumes").
Names, namespaces and tags contain no `.`, so the name parses back unambiguously. Volumes made before
the tag existed (`<instance>.qcow2`, `<instance>-seed.iso`) are still found and deleted with their
instance, but GC, which cannot prove whose they are, leaves them alone.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
from dataclasses import dataclass

_URL_HASH_LEN = 16
# What libvirt (and our own names) accept as a domain name here: the operator's `proxy-<hash>` fits.
_INSTANCE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def check_instance_name(name: str) -> str:
    if not _INSTANCE_NAME.fullmatch(name):
        raise ValueError(f"instance name {name!r} must be 1-63 lowercase letters, digits or '-'")
    return name


_VOLUME_CONTEXT = b"egress-kvm instance volumes v1\x00"
VOLUME_TAG_CHARS = 16  # 64 bits: another cluster's tag matching ours by chance is not a practical concern
_DNS_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_INSTANCE_VOLUME = re.compile(rf"^(?P<instance>{_DNS_LABEL})\.(?P<namespace>(?:{_DNS_LABEL})?)"
                              rf"\.(?P<tag>[0-9a-f]{{{VOLUME_TAG_CHARS}}})(?P<kind>\.qcow2|-seed\.iso)$")


class VolumeKind(enum.Enum):
    OVERLAY = ".qcow2"
    SEED = "-seed.iso"


@dataclass(frozen=True)
class InstanceVolumeName:
    """A volume name parsed back: which instance, whose namespace, which of its volumes."""

    instance: str
    namespace: str
    kind: VolumeKind


def volume_tag(*, cluster_id: str, namespace: str, name: str) -> str:
    msg = _VOLUME_CONTEXT + namespace.encode() + b"\x00" + name.encode()
    return hmac.new(cluster_id.encode(), msg, hashlib.sha256).hexdigest()[:VOLUME_TAG_CHARS]


def instance_volume(name: str, kind: VolumeKind, *, cluster_id: str, namespace: str) -> str:
    tag = volume_tag(cluster_id=cluster_id, namespace=namespace, name=name)
    return f"{name}.{namespace}.{tag}{kind.value}"


def overlay_volume(name: str, *, cluster_id: str, namespace: str) -> str:
    return instance_volume(name, VolumeKind.OVERLAY, cluster_id=cluster_id, namespace=namespace)


def seed_volume(name: str, *, cluster_id: str, namespace: str) -> str:
    return instance_volume(name, VolumeKind.SEED, cluster_id=cluster_id, namespace=namespace)


def legacy_volumes(name: str) -> tuple[str, str]:
    """The overlay and seed names volumes had before they carried the cluster tag."""
    return f"{name}.qcow2", f"{name}-seed.iso"


def parse_instance_volume(volume: str, *, cluster_id: str) -> InstanceVolumeName | None:
    """The instance volume `volume` names if this cluster made it (its tag recomputes with `cluster_id`);
    None for anything else: another cluster's, a legacy name, a base image, a stranger's file."""
    m = _INSTANCE_VOLUME.fullmatch(volume)
    if m is None:
        return None
    instance, namespace = m["instance"], m["namespace"]
    expected = volume_tag(cluster_id=cluster_id, namespace=namespace, name=instance)
    if not hmac.compare_digest(m["tag"], expected):
        return None
    return InstanceVolumeName(instance=instance, namespace=namespace, kind=VolumeKind(m["kind"]))


def url_hash(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:_URL_HASH_LEN]


def image_digest(*, url: str, sha256: str | None) -> str:
    """What tells one content of a configured image from another, in its base's name: the pinned sha256
    (so the name is the content's), else the hash of the URL (an unpinned image's bytes are known only
    once fetched, and libvirt cannot rename a volume: the name must exist before the bytes do)."""
    return sha256[:_URL_HASH_LEN] if sha256 else url_hash(url)


def base_volume(*, key: str | None = None, url: str | None = None, sha256: str | None = None) -> str:
    """`base-<key>-<digest>.qcow2` for a configured image (see image_digest), `base-<url-hash>.qcow2`
    for a URL used directly. A changed url or sha256 is a new name: the new base is imported beside the
    old one, which the overlays of running VMs keep backing onto (eviction.py deletes it later)."""
    if url is None:
        raise ValueError("base_volume needs the image's url")
    if key is not None:
        return f"base-{key}-{image_digest(url=url, sha256=sha256)}.qcow2"
    return f"base-{url_hash(url)}.qcow2"


def legacy_base_volume(key: str) -> str:
    """The name bases of configured images had before they were content-addressed: `base-<key>.qcow2`.
    Never created any more; such a base stays while an overlay backs onto it (eviction.py)."""
    return f"base-{key}.qcow2"


def marker_volume(base: str) -> str:
    return f"{base}.sha256"


def mac_address(name: str) -> str:
    """52:54:00 (QEMU's locally administered prefix) + the first three bytes of sha256(name)."""
    digest = hashlib.sha256(name.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])
