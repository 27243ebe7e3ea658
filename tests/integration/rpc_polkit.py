"""A libvirtd that authenticates with polkit, for the AUTH_POLKIT test: its own system D-Bus, polkitd and
libvirtd (auth_unix_rw = "polkit", socket 0777 as on a stock host), in a private mount + network
namespace so nothing touches the machine's /run, /etc/libvirt or network. Every process stays in one
process group (nothing daemonizes), so teardown is one killpg plus a wait.

A client must connect as a non-root user (libvirtd skips polkit for uid 0), and polkit looks the peer up
by PID while it decides, so `peer_socket` connects from a short-lived helper process running as that user
(stdlib Python only) that passes the connected socket back and stays alive until told to exit.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TOOLS = ("unshare", "dbus-daemon", "libvirtd", "runuser")
POLKITD = "/usr/lib/polkit-1/polkitd"
LIBVIRT_RULES = "/usr/share/polkit-1/rules.d/60-libvirt.rules"

_SCRIPT = """
set -eu
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/dbus /run/libvirt
for d in /etc/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt; do
  mkdir -p "$d"; mount -t tmpfs -o mode=755 tmpfs "$d"
done
ip link set lo up
dbus-daemon --system --nofork --nopidfile &
for i in $(seq 100); do [ -S /run/dbus/system_bus_socket ] && break; sleep 0.05; done
{polkitd} --no-debug > {dir}/polkitd.log 2>&1 &
libvirtd -f {dir}/libvirtd.conf > {dir}/libvirtd.out 2>&1 &
wait
"""

_CONF = """unix_sock_dir = "{dir}/sock"
unix_sock_ro_perms = "0777"
unix_sock_rw_perms = "0777"
unix_sock_admin_perms = "0700"
auth_unix_rw = "polkit"
auth_unix_ro = "none"
log_outputs = "3:file:{dir}/libvirtd.log"
"""

# Runs as the unprivileged user under /usr/bin/python3: connect, hand the socket to the test over the
# inherited fd argv[2], then stay alive (polkit inspects this PID) until the test closes its end.
_PEER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
chan = socket.socket(fileno=int(sys.argv[2]))
socket.send_fds(chan, [b"x"], [s.fileno()])
chan.recv(1)
"""


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (namespaces, daemons)"
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not Path(POLKITD).exists():
        return f"needs polkitd ({POLKITD})"
    if not Path(LIBVIRT_RULES).exists():
        return f"needs libvirt's polkit rule ({LIBVIRT_RULES})"
    for user in ("virt", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"needs user {user}"
    return None


@dataclass
class PolkitDaemon:
    dir: Path
    socket: str
    pid: int


@contextlib.contextmanager
def polkit_libvirtd(timeout: float = 60.0) -> Iterator[PolkitDaemon]:
    work = Path(tempfile.mkdtemp(prefix="rpc-polkit-", dir="/var/tmp"))
    work.chmod(0o755)  # the unprivileged peer must reach the socket
    (work / "sock").mkdir(mode=0o755)
    (work / "libvirtd.conf").write_text(_CONF.format(dir=work))
    (work / "env.sh").write_text(_SCRIPT.format(dir=work, polkitd=POLKITD))
    proc = subprocess.Popen(
        ["unshare", "--mount", "--net", "--fork", "--propagation", "private", "--kill-child",
         "bash", str(work / "env.sh")],
        stdout=(work / "env.out").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    sock = str(work / "sock" / "libvirt-sock")
    try:
        end = time.monotonic() + timeout
        while not Path(sock).is_socket():
            if proc.poll() is not None or time.monotonic() > end:
                logs = "".join(
                    f"\n--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in work.glob("*.out")
                )
                raise AssertionError(f"polkit libvirtd did not come up{logs}")
            time.sleep(0.1)
        yield PolkitDaemon(dir=work, socket=sock, pid=proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        _wait_group_gone(proc.pid)
        shutil.rmtree(work, ignore_errors=True)


def _wait_group_gone(pgid: int, timeout: float = 10.0) -> None:
    """Every process of the group has exited (zombies count as gone: PID 1 reaps them)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                alive.append(int(entry.name))
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    raise AssertionError(f"processes of group {pgid} still running")


@contextlib.contextmanager
def peer_socket(path: str, user: str) -> Iterator[socket.socket]:
    """A socket connected to `path` by a process running as `user` (with its groups), kept alive meanwhile."""
    pw = pwd.getpwnam(user)
    groups = [g.gr_gid for g in grp.getgrall() if user in g.gr_mem]
    ours, theirs = socket.socketpair()
    helper = subprocess.Popen(
        ["/usr/bin/python3", "-c", _PEER, path, str(theirs.fileno())],
        user=pw.pw_uid,
        group=pw.pw_gid,
        extra_groups=groups,
        pass_fds=[theirs.fileno()],
    )
    theirs.close()
    try:
        ours.settimeout(30)
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
        if not fds:
            raise AssertionError(f"the {user} helper could not connect to {path}")
        conn = socket.socket(fileno=fds[0])
        conn.setblocking(False)
        yield conn
    finally:
        ours.close()  # the helper's recv returns: it exits
        try:
            helper.wait(10)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait(10)
