"""Names of everything the provider puts on a host, and the VM's deterministic MAC address.

All of it derives from the instance name (or the image key, URL and sha256) and nothing else, so a
reconcile after a crash finds what an earlier one left, Delete can remove volumes by name with no domain
to consult, and a LAN admin can make DHCP reservations for a VM before it exists.
"""

from __future__ import annotations

import hashlib
import re

_URL_HASH_LEN = 16
# What libvirt (and our own names) accept as a domain name here: the operator's `proxy-<hash>` fits.
_INSTANCE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def check_instance_name(name: str) -> str:
    if not _INSTANCE_NAME.fullmatch(name):
        raise ValueError(f"instance name {name!r} must be 1-63 lowercase letters, digits or '-'")
    return name


def overlay_volume(name: str) -> str:
    return f"{name}.qcow2"


def seed_volume(name: str) -> str:
    return f"{name}-seed.iso"


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
