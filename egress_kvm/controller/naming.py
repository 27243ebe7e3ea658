"""Deterministic instance names: `proxy-<hash>` of the Proxy's UID and its resolved provisioning inputs.

The name is the instance's identity: the provider's create is idempotent by name, GC recognises what a
Proxy should own by name, and a spec fix that changes what would be provisioned (provider, host, machine
type, image, user-data) changes the name, which is what triggers a replacement. Only *resolved* inputs
count, so writing the default zone explicitly does not replace a VM, and `placement.region` (ignored by
kvm) never does. The user-data enters as a keyed digest (HMAC-SHA256 with the cluster's instance-name
key, see egress_kvm/policy/namekey.py), so the name reveals nothing of it: with a plain hash, the owner of
a Proxy whose user-data comes from a Secret could confirm guesses of that Secret against the name.

Names made before the key existed (plain sha256) stay valid for the instance that carries one
(`desired.py` keeps a legacy name status already records), so an upgrade replaces no VM; the next change
of the Proxy's inputs gives it a keyed name, as any change does.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from egress_kvm.providers.base import ResolvedPlacement

PREFIX = "proxy-"
HASH_CHARS = 20  # 80 bits: collisions across one cluster's Proxies are not a practical concern
MAX_LEN = 63  # a DNS label, and short enough for every libvirt object name derived from it


_key = b""  # the process sets the cluster's key at start-up (set_name_key); tests run with this one


def set_name_key(key: bytes) -> None:
    """Key every user-data digest from now on (the operator process calls this once, at start-up)."""
    global _key
    _key = key


def user_data_digest(user_data: bytes, *, key: bytes | None = None) -> str:
    return hmac.new(_key if key is None else key, user_data, hashlib.sha256).hexdigest()


def legacy_user_data_digest(user_data: bytes) -> str:
    """The unkeyed digest names had before; used only to recognise such a name, never to make one."""
    return hashlib.sha256(user_data).hexdigest()


def instance_name(*, uid: str, provider: str, placement: ResolvedPlacement, user_data_sha256: str) -> str:
    if not uid:
        raise ValueError("instance_name: the Proxy has no metadata.uid")
    inputs = {
        "uid": uid,
        "provider": provider,
        "zone": placement.zone,
        "machineType": placement.machine_type,
        "image": placement.image,
        "userData": user_data_sha256,
    }
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    name = PREFIX + hashlib.sha256(canonical).hexdigest()[:HASH_CHARS]
    assert len(name) <= MAX_LEN
    return name
