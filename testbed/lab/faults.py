"""A lab host set up wrong on purpose, for tests of what preflight (and the provider) say about it.

Each knob is a context manager that leaves the host as it found it: a second sshd beside the lab's own
(on another port, with stream-local forwarding off, letting in another user, or giving sessions a PATH
without `ip`), an SSH user outside the
`libvirt` group, and the name of a link on the host that is not a bridge (its uplink, as `eno1` is on a
homelab box). A missing pool needs no knob: name a pool the host does not have.
"""

from __future__ import annotations

import contextlib
import grp
import pwd
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.lab import host as host_mod
from testbed.lab.info import LabInfo
from testbed.lab.layout import SSH_USER, LabLayout
from testbed.lab.lifecycle import _host_layout
from testbed.lab.procs import read_pid, run, stop, wait_for


@dataclass(frozen=True)
class ExtraSshd:
    address: str  # "ip:port", as a providers file's host address
    known_hosts_line: str  # `[ip]:port keytype key`: the host key under this port's name


def uplink(info: LabInfo, host_name: str) -> str:
    """The host's link to the outside: an existing interface that is not a bridge."""
    return str(_host_layout(info, host_name).veth_host)


@contextlib.contextmanager
def extra_sshd(info: LabInfo, host_name: str, *, port: int, stream_local: bool = True,
               user: str = SSH_USER, session_path: str = host_mod.SESSION_PATH) -> Iterator[ExtraSshd]:
    """A second sshd on the host (same host key and namespaces) with its own forwarding and user rules,
    and the PATH its sessions get (one without `ip` stands for a host where a non-login shell lacks it)."""
    host = _host_layout(info, host_name)
    config = host.dir / f"sshd-{port}.conf"
    pidfile = host.dir / f"sshd-{port}.pid"
    text = host.sshd_config.read_text()
    replacements = {
        f"ListenAddress {host.ip}:22": f"ListenAddress {host.ip}:{port}",
        f"PidFile {host.pidfile('sshd')}": f"PidFile {pidfile}",
        f"AllowUsers {SSH_USER}": f"AllowUsers {user}",
        "AllowStreamLocalForwarding yes": f"AllowStreamLocalForwarding {'yes' if stream_local else 'no'}",
        f"SetEnv PATH={host_mod.SESSION_PATH}": f"SetEnv PATH={session_path}",
    }
    for old, new in replacements.items():
        if old not in text:
            raise AssertionError(f"lab sshd config no longer has {old!r}: update testbed/lab/faults.py")
        text = text.replace(old, new)
    config.write_text(text)
    log = host.dir / f"sshd-{port}.log"
    run(host_mod.host_argv(host, ["/usr/sbin/sshd", "-f", str(config), "-E", str(log)]))
    try:
        wait_for(lambda: read_pid(pidfile) is not None, timeout=10, what=f"sshd on port {port}")
        wait_for(lambda: host_mod._tcp_open(host.ip, port), timeout=10, what=f"sshd on {host.ip}:{port}")
        keytype, key = host.host_key.with_suffix(".pub").read_text().split()[:2]
        yield ExtraSshd(address=f"{host.ip}:{port}",
                        known_hosts_line=f"[{host.ip}]:{port} {keytype} {key}\n")
    finally:
        pid = read_pid(pidfile)
        if pid is not None:
            stop([pid])
        pidfile.unlink(missing_ok=True)
        config.unlink(missing_ok=True)


@contextlib.contextmanager
def user_outside_libvirt_group(info: LabInfo) -> Iterator[str]:
    """An SSH user the lab's key logs in as, who is NOT in `libvirt` (so libvirt's socket is shut to it).
    Accounts are machine-wide, so the name carries the lab index; the account is removed afterwards."""
    name = f"virtnolv{info.index}"
    lab = LabLayout.make(index=info.index, hosts=len(info.hosts), state_dir=info.state_dir,
                         simulated=info.simulated)
    with contextlib.suppress(KeyError):
        pwd.getpwnam(name)
        run(["userdel", "-r", name], check=False)  # an earlier run's
    run(["useradd", "-m", "-s", "/bin/bash", name])
    try:
        run(["usermod", "-p", "*", name])  # unlocked: sshd with UsePAM no refuses a `!` password
        assert name not in grp.getgrnam("libvirt").gr_mem
        user = pwd.getpwnam(name)
        ssh_dir = Path(user.pw_dir) / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        keys = ssh_dir / lab.authorized_keys_name
        keys.write_text(Path(info.ssh_key).with_suffix(".pub").read_text())
        for path in (ssh_dir, keys):
            shutil.chown(path, user.pw_uid, user.pw_gid)
        keys.chmod(0o600)
        yield name
    finally:
        run(["userdel", "-r", name], check=False)
