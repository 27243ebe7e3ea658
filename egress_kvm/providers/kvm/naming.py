"""Names of everything the provider puts on a host, and the VM's deterministic MAC address.

All of it derives from the instance name (or the image key/URL) and nothing else, so a reconcile after a
crash finds what an earlier one left, Delete can remove volumes by name with no domain to consult, and a
LAN admin can make DHCP reservations for a VM before it exists.
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


def base_volume(*, key: str | None = None, url: str | None = None) -> str:
    """`base-<key>.qcow2` for a configured image, `base-<url-hash>.qcow2` for a URL used directly."""
    if key is not None:
        return f"base-{key}.qcow2"
    if url is None:
        raise ValueError("base_volume needs a key or a url")
    return f"base-{url_hash(url)}.qcow2"


def marker_volume(base: str) -> str:
    return f"{base}.sha256"


def mac_address(name: str) -> str:
    """52:54:00 (QEMU's locally administered prefix) + the first three bytes of sha256(name)."""
    digest = hashlib.sha256(name.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])
