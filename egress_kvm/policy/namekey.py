"""Where the instance-name key comes from (docs/security.md, "Instance names").

The key must be secret (else the keyed digest confirms guesses as well as a plain one), the same on
every replica and across restarts (else every name changes and every VM is replaced), and per cluster.
So it is read from a file, mounted from a Secret the admin creates once
(`egress-kvm-instance-name-key`, key `key`, e.g. 32 random bytes), and bound to the cluster id.
Without the file the key is derived from the cluster id alone and the operator says so at start-up:
names are then keyed but the key is not secret, which is no worse than before the key existed.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

DEFAULT_PATH = "/etc/proxy-operator/instance-name-key/key"
_CONTEXT = b"egress-kvm instance names v1\x00"


@dataclass(frozen=True)
class NameKey:
    key: bytes
    from_file: bool


def derive(*, secret: bytes | None, cluster_id: str) -> NameKey:
    """The key: HMAC(secret, context + cluster id) with a secret, else sha256(context + cluster id)."""
    msg = _CONTEXT + cluster_id.encode()
    if secret:
        return NameKey(hmac.new(secret, msg, hashlib.sha256).digest(), from_file=True)
    return NameKey(hashlib.sha256(msg).digest(), from_file=False)


def load(path: str, *, cluster_id: str) -> NameKey:
    """Read the key file (missing or empty: the cluster-id fallback); other read errors raise OSError."""
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except FileNotFoundError:
        secret = None
    return derive(secret=secret, cluster_id=cluster_id)
