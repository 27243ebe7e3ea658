"""Deterministic instance names: `proxy-<hash>` of the Proxy's UID and its resolved provisioning inputs.

The name is the instance's identity: the provider's create is idempotent by name, GC recognises what a
Proxy should own by name, and a spec fix that changes what would be provisioned (provider, host, machine
type, image, user-data) changes the name, which is what triggers a replacement. Only *resolved* inputs
count, so writing the default zone explicitly does not replace a VM, and `placement.region` (ignored by
kvm) never does. The user-data enters as a digest, so the name reveals nothing of it.
"""

from __future__ import annotations

import hashlib
import json

from egress_kvm.providers.base import ResolvedPlacement

PREFIX = "proxy-"
HASH_CHARS = 20  # 80 bits: collisions across one cluster's Proxies are not a practical concern
MAX_LEN = 63  # a DNS label, and short enough for every libvirt object name derived from it


def user_data_digest(user_data: bytes) -> str:
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
