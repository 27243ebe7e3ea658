"""A lab host set up wrong on purpose, for tests of what preflight (and the provider) say about it.

Each knob is a context manager that leaves the host as it found it: a second sshd beside the lab's own
(on another port, with stream-local forwarding off, letting in another user, or giving sessions a PATH
without `ip`), an SSH user outside the
`libvirt` group, and the name of a link on the host that is not a bridge (its uplink, as `eno1` is on a
homelab box). A missing pool needs no knob: name a pool the host does not have.

Below those, faults for a host that is running VMs (the fault campaign): its SSH sessions dropped, its
libvirtd SIGKILLed and restarted, its link taken down, its pool on a small tmpfs, the image server slowed
and then held; and a host's bridge without DHCP (its dnsmasq stopped), for the static-address tests on
the shared lab.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.lab import host as host_mod
from testbed.lab.info import LabInfo
from testbed.lab.layout import SSH_USER, LabLayout
from testbed.lab.lifecycle import _host_layout
from testbed.lab.procs import read_pid, run, state, stop, wait_for
from testbed.lab.web import IMAGE_SERVER


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


# --- faults on a running host, for the fault campaign (tests/e2e/test_fault_campaign.py) ---------------

def ssh_session_pids(info: LabInfo, host_name: str) -> set[int]:
    """The host's per-connection sshd processes (`sshd: virt...`): killing them drops every SSH link."""
    host = _host_layout(info, host_name)
    out = run(["ip", "netns", "pids", host.netns], check=False).stdout
    pids = set()
    for pid in out.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmdline.startswith(f"sshd: {SSH_USER}"):
            pids.add(int(pid))
    return pids


def drop_ssh(info: LabInfo, host_name: str) -> int:
    """Kill every SSH session on the host (the listener stays): how many were dropped."""
    pids = ssh_session_pids(info, host_name)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def restart_libvirtd(info: LabInfo, host_name: str) -> None:
    """SIGKILL the host's libvirtd and start it again in the same namespaces (QEMU processes live on, as
    they do across a real daemon restart); returns once the new daemon answers."""
    host = _host_layout(info, host_name)
    old = read_pid(host.pidfile("libvirtd"))
    anchor = read_pid(host.pidfile("sshd"))  # a daemon still in the host's mount + network namespace
    if old is None or anchor is None:
        raise AssertionError(f"{host_name}: no libvirtd/sshd pid to restart from")
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{old}").exists() or _zombie(old), timeout=10,
             what=f"{host_name}: old libvirtd gone")
    host.pidfile("libvirtd").unlink(missing_ok=True)
    run(["nsenter", "-t", str(anchor), "-m", "-n", "--", "libvirtd", "-d", "-p",
         str(host.pidfile("libvirtd"))], timeout=60)
    wait_for(lambda: host_mod._socket_ready(host) and run(host_mod.virsh_argv(host, "pool-info", "default"),
                                                            check=False).returncode == 0,
             timeout=60, what=f"{host_name}: libvirtd back")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@contextlib.contextmanager
def link_down(info: LabInfo, host_name: str) -> Iterator[None]:
    """The host unreachable: its veth taken down on our side (packets are dropped, nothing is refused),
    brought back up (with its route) on exit."""
    host = _host_layout(info, host_name)
    run(["ip", "link", "set", host.veth_root, "down"])
    try:
        yield
    finally:
        run(["ip", "link", "set", host.veth_root, "up"])
        run(["ip", "route", "replace", host.lan_cidr, "via", host.ip, "dev", host.veth_root], check=False)


@contextlib.contextmanager
def without_dhcp(info: LabInfo, host_name: str) -> Iterator[dict[str, str]]:
    """The host's bridge with no DHCP server: its dnsmasq stopped, and started again afterwards as the lab
    starts it (a lab brought up with `--no-dhcp`, or a simulated one, has none to stop). Yields the
    host's `staticAddresses` entry for a providers file: the DHCP range, which nobody hands out now."""
    host = _host_layout(info, host_name)
    pid = read_pid(host.pidfile("dnsmasq"))
    if host.simulated or not host.dhcp or pid is None:
        yield host.static_addresses
        return
    stop([pid])
    try:
        yield host.static_addresses
    finally:
        run(host_mod.host_argv(host, ["sh", "-c", host_mod.dnsmasq_command(host)]), timeout=30)
        wait_for(lambda: read_pid(host.pidfile("dnsmasq")) not in (None, pid), timeout=10,
                 what=f"{host_name}'s dnsmasq to start again")


class ImageServer:
    """The lab's image server (host0), running a share of the time (`image_server_slowed`); `hold`
    stops it for good until the context ends."""

    def __init__(self, pid: int, *, running_share: float, period: float) -> None:
        self.pid = pid
        self._running_share = running_share
        self._period = period
        self._quit = threading.Event()  # hold or close: the toggling ends at once, whichever half it is in
        self._thread = threading.Thread(target=self._toggle, name="image-server-throttle", daemon=True)

    def _toggle(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # the server gone: nothing left to slow
            while True:
                os.kill(self.pid, signal.SIGCONT)
                if self._quit.wait(self._period * self._running_share):
                    return
                os.kill(self.pid, signal.SIGSTOP)
                if self._quit.wait(self._period * (1 - self._running_share)):
                    return

    def start(self) -> None:
        self._thread.start()

    def hold(self) -> None:
        """Stopped from now on: a download in progress can get no further until the context ends. Returns
        once the kernel shows it stopped (a SIGSTOP takes effect when the process next runs, not at once)."""
        self._quit.set()
        self._thread.join()
        os.kill(self.pid, signal.SIGSTOP)
        wait_for(self._stopped, timeout=10, what=f"image server {self.pid}: every thread stopped")

    def _stopped(self) -> bool:
        try:
            threads = os.listdir(f"/proc/{self.pid}/task")
        except FileNotFoundError:
            return True  # gone: it sends nothing either
        return all(state(int(t)) in ("T", None) for t in threads)

    def close(self) -> None:
        """Running again, for good (a server that died meanwhile needs nothing: the with block's own error,
        if any, is the one raised)."""
        self._quit.set()
        if self._thread.is_alive():
            self._thread.join()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)


@contextlib.contextmanager
def image_server_slowed(info: LabInfo, *, running_share: float = 0.05,
                        period: float = 0.1) -> Iterator[ImageServer]:
    """The image server SIGSTOPped except `running_share` of every `period` (an import of the test image
    that takes under a second here takes ~20x as long), so a test can act mid-download whatever the
    machine's speed; running again on exit. Only a real lab serves the image."""
    pid = read_pid(_host_layout(info, "host0").pidfile(IMAGE_SERVER))
    if pid is None:
        raise AssertionError("host0 serves no image (a lab brought up without --image, or simulated)")
    server = ImageServer(pid, running_share=running_share, period=period)
    server.start()
    try:
        yield server
    finally:
        server.close()
