"""Helpers for the rpc integration tests: how to reach the lab host's libvirtd, and test objects on it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import rpc
from testbed import lab

HOST = "host0"


def host(info: lab.LabInfo) -> lab.HostInfo:
    return info.hosts[0]


def ssh_kwargs(info: lab.LabInfo, **extra: Any) -> dict[str, Any]:
    h = host(info)
    kwargs: dict[str, Any] = {
        "port": h.port,
        "username": h.user,
        "client_keys": [info.ssh_key],
        "known_hosts": info.known_hosts,
        "socket_path": h.socket,
        "timeout": 60,
    }
    kwargs.update(extra)
    return kwargs


async def connect_ssh(info: lab.LabInfo, **extra: Any) -> rpc.Client:
    kwargs = ssh_kwargs(info, **extra)
    return await rpc.connect_ssh(host(info).ip, **kwargs)


def unix_socket_path(info: lab.LabInfo) -> str:
    # /run, not /var/run: the symlink would resolve against our root, not libvirtd's mount namespace.
    return f"/proc/{libvirtd_pid(info)}/root/run/libvirt/libvirt-sock"


def libvirtd_pid(info: lab.LabInfo) -> int:
    from testbed.lab.layout import LabLayout
    from testbed.lab.procs import read_pid

    layout = LabLayout.make(index=info.index, hosts=len(info.hosts), state_dir=info.state_dir)
    pid = read_pid(layout.host(0).pidfile("libvirtd"))
    assert pid, "lab libvirtd has no pid file"
    return pid


def virsh(info: lab.LabInfo, *args: str) -> str:
    return lab.virsh(info, HOST, *args)


def virsh_try(info: lab.LabInfo, *args: str) -> subprocess.CompletedProcess[str]:
    return lab.host_run(info, HOST, ["virsh", "-q", "-c", "qemu:///system", *args], check=False)


def unique(prefix: str) -> str:
    return f"rpctest-{prefix}-{uuid.uuid4().hex[:8]}"


def domain_xml(name: str, *, dom_uuid: str | None = None, agent: bool = False, nic: bool = False) -> str:
    """A diskless `qemu` domain: boots to SeaBIOS's "no bootable device" and stays running, which is all
    define/start/destroy/undefine and events need."""
    devices = ""
    if agent:
        devices += "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>"
    if nic:
        devices += "<interface type='bridge'><source bridge='br0'/><model type='e1000'/></interface>"
    uuid_el = f"<uuid>{dom_uuid}</uuid>" if dom_uuid else ""
    return (
        f"<domain type='qemu'><name>{name}</name>{uuid_el}<memory unit='MiB'>32</memory><vcpu>1</vcpu>"
        "<os><type arch='x86_64'>hvm</type></os><cpu mode='maximum' check='none'/>"
        f"<devices>{devices}</devices></domain>"
    )


def vol_xml(name: str, *, capacity: int, fmt: str = "raw") -> str:
    return (
        f"<volume><name>{name}</name><capacity unit='bytes'>{capacity}</capacity>"
        f"<target><format type='{fmt}'/></target></volume>"
    )


def remove_domain(info: lab.LabInfo, name: str) -> None:
    virsh_try(info, "destroy", name)
    virsh_try(info, "undefine", name, "--nvram")


def remove_volume(info: lab.LabInfo, name: str) -> None:
    virsh_try(info, "vol-delete", "--pool", host(info).pool, name)


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """Freeze a process (SIGSTOP) for the block: a daemon that is alive but silent."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def small_pool(info: lab.LabInfo, name: str, *, mib: int) -> Iterator[None]:
    """A transient dir pool on a `mib`-MiB tmpfs in the host's mount namespace: a pool that fills up."""
    target = f"/var/lib/libvirt/{name}"
    lab.host_run(info, HOST, ["mkdir", "-p", target])
    lab.host_run(info, HOST, ["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", target])
    try:
        virsh(info, "pool-create-as", name, "dir", "--target", target)
        yield
    finally:
        virsh_try(info, "pool-destroy", name)
        lab.host_run(info, HOST, ["umount", target], check=False)
        lab.host_run(info, HOST, ["rmdir", target], check=False)


def keygen(path: Path) -> None:
    """A fresh ed25519 key pair at path / path.pub (a key the lab does not know)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def children(pid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return {int(p) for p in out.split()}


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still running")


def restart_libvirtd(info: lab.LabInfo) -> None:
    """Start the host's libvirtd again in its namespaces (after a test killed it) and wait for its socket."""
    from testbed.lab.layout import LabLayout
    from testbed.lab.procs import read_pid

    layout = LabLayout.make(index=info.index, hosts=len(info.hosts), state_dir=info.state_dir)
    h = layout.host(0)
    anchor = read_pid(h.pidfile("sshd"))  # any daemon still in the host's mount + network namespace
    subprocess.run(
        ["nsenter", "-t", str(anchor), "-m", "-n", "--", "libvirtd", "-d", "-p", str(h.pidfile("libvirtd"))],
        check=True,
        timeout=60,
    )
    end = time.monotonic() + 60
    while time.monotonic() < end:
        pid = read_pid(h.pidfile("libvirtd"))
        if pid and Path(f"/proc/{pid}/root/run/libvirt/libvirt-sock").is_socket():
            try:
                virsh(info, "pool-info", host(info).pool)
            except lab.LabError:
                time.sleep(0.2)
                continue
            host(info).libvirtd_pid = pid  # the session's LabInfo: keep it truthful for later tests
            return
        time.sleep(0.1)
    raise AssertionError("libvirtd did not come back")


def fields(text: str) -> dict[str, str]:
    """virsh's "Key:   value" lines as a dict (keys and values stripped)."""
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def owned_ssh_pids(info: lab.LabInfo) -> set[int]:
    """Every process under the host's sshd now (its per-connection session processes)."""
    from testbed.lab.layout import LabLayout
    from testbed.lab.procs import read_pid

    layout = LabLayout.make(index=info.index, hosts=len(info.hosts), state_dir=info.state_dir)
    sshd = read_pid(layout.host(0).pidfile("sshd"))
    assert sshd, "lab sshd has no pid file"
    return descendants(sshd)
