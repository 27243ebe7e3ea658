"""The lab's SSH material: the operator's client key and a known_hosts holding every host's key."""

from __future__ import annotations

from testbed.lab.layout import SSH_PORT, LabLayout
from testbed.lab.procs import run


def ensure_client_key(lab: LabLayout) -> str:
    """The ed25519 key the operator (and tests) log in with; returns the public key line."""
    if not lab.ssh_key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"egress-kvm-lab{lab.index}",
             "-f", str(lab.ssh_key)])
    return lab.ssh_key.with_suffix(".pub").read_text().strip()


def write_known_hosts(lab: LabLayout) -> None:
    lines = []
    for host in lab.all_hosts:
        keytype, key = host.host_key.with_suffix(".pub").read_text().split()[:2]
        name = host.ip if SSH_PORT == 22 else f"[{host.ip}]:{SSH_PORT}"
        lines.append(f"{name} {keytype} {key}\n")
    lab.known_hosts.write_text("".join(lines))
