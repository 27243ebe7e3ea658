"""One hypervisor host: bring it up inside its own network namespace, check it, take it down.

The host is a network namespace joined to the root namespace by a veth pair, with a bridge (the VM LAN)
and dnsmasq handing out leases on it. Its daemons (virtlogd, libvirtd, sshd, dnsmasq) all run in ONE new
mount namespace inside it, so they see private /etc/libvirt, /var/lib/libvirt, /var/log/libvirt and
/run/libvirt (bind-mounted from the host's state dir): each lab's libvirtd coexists with any other on the
machine, and SSH sessions and QEMU inherit the same view, so the libvirt socket path is the standard one.
The host routes between its veth and its bridge; there is no NAT, no uplink and no default route.

A simulated host (docs/lab.md, "Simulated hosts") is the same namespace, sshd and bridge with
testbed/sim's daemon on the libvirt socket in place of virtlogd + libvirtd (and no dnsmasq: nothing
asks for leases). Its guest LAN is made local in the namespace (an AnyIP route), so the simulator can
serve each guest's proxy on the guest's own address and the operator reaches it over the veth.

A lab brought up without DHCP (`lab up --no-dhcp`) runs no dnsmasq: its VMs take the static addresses
the operator writes into their seeds (the providers file's `staticAddresses`).
"""

from __future__ import annotations

import grp
import pwd
import re
import shlex
import shutil
import socket
import sys
from pathlib import Path

from testbed.lab.layout import (
    BRIDGE,
    POOL,
    POOL_PATH,
    SSH_PORT,
    SSH_USER,
    HostLayout,
    LabLayout,
    cache_root,
)
from testbed.lab.procs import (
    LabError,
    alive,
    in_netns,
    netns_inode,
    pids_in_netns,
    read_pid,
    run,
    stop,
    wait_for,
)

DAEMONS = ("virtlogd", "libvirtd", "sshd", "dnsmasq")
SIM_DAEMONS = ("libvirt-sim", "sshd")
REPO_ROOT = Path(__file__).resolve().parents[2]  # where `python -m testbed.sim` imports from


def daemons(host: HostLayout) -> tuple[str, ...]:
    if host.simulated:
        return SIM_DAEMONS
    return DAEMONS if host.dhcp else tuple(d for d in DAEMONS if d != "dnsmasq")
# sshd without PAM gives sessions a PATH without the sbin dirs; the provider runs `ip neigh` over SSH.
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIBVIRTD_CONF_EXTRA = """
# egress-kvm lab: no polkit here, so the socket is guarded by group membership alone
unix_sock_group = "libvirt"
unix_sock_ro_perms = "0777"
unix_sock_rw_perms = "0770"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
"""


def conf_int(text: str, name: str) -> int | None:
    """An integer setting of a libvirt daemon's .conf text (`name = 12`); None when it is only commented
    or absent (the daemon's built-in default applies). Set twice is refused: which one wins is the
    parser's business, and nothing here writes a setting twice."""
    found = re.findall(rf"^[ \t]*{re.escape(name)}[ \t]*=[ \t]*(-?\d+)[ \t]*(?:#.*)?$", text, re.MULTILINE)
    if len(found) > 1:
        raise ValueError(f"{name} is set {len(found)} times")
    return int(found[0]) if found else None


def ensure_virt_user() -> pwd.struct_passwd:
    """The SSH user: member of `libvirt`, unlocked (sshd with UsePAM no refuses a `!` password)."""
    try:
        grp.getgrnam("libvirt")
    except KeyError:
        run(["groupadd", "-r", "libvirt"])
    try:
        pwd.getpwnam(SSH_USER)
    except KeyError:
        run(["useradd", "-m", "-s", "/bin/bash", "-G", "libvirt", SSH_USER])
    if SSH_USER not in grp.getgrnam("libvirt").gr_mem:
        run(["usermod", "-aG", "libvirt", SSH_USER])
    run(["usermod", "-p", "*", SSH_USER])
    user = pwd.getpwnam(SSH_USER)
    ssh_dir = Path(user.pw_dir) / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.chown(ssh_dir, user.pw_uid, user.pw_gid)
    ssh_dir.chmod(0o700)
    return user


def authorized_keys_path(lab: LabLayout) -> Path:
    try:
        home = Path(pwd.getpwnam(SSH_USER).pw_dir)
    except KeyError:
        home = Path("/home") / SSH_USER
    return home / ".ssh" / lab.authorized_keys_name


def install_authorized_key(lab: LabLayout, public_key: str) -> None:
    user = ensure_virt_user()
    path = authorized_keys_path(lab)
    path.write_text(public_key.strip() + "\n")
    shutil.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(0o600)


def host_argv(host: HostLayout, argv: list[str]) -> list[str]:
    """argv run "on the host": inside the mount + network namespace its daemons share."""
    pid = read_pid(host.pidfile(host.hypervisor))
    if not alive(pid):
        raise LabError(f"{host.name}: {host.hypervisor} is not running (no live pid in "
                       f"{host.pidfile(host.hypervisor)})")
    return ["nsenter", "-t", str(pid), "-m", "-n", "--", *argv]


def virsh_argv(host: HostLayout, *args: str) -> list[str]:
    return host_argv(host, ["virsh", "-q", "-c", "qemu:///system", *args])


def _write_sshd_config(lab: LabLayout, host: HostLayout) -> None:
    host.sshd_config.write_text(
        f"""# egress-kvm lab {lab.index} {host.name}
ListenAddress {host.ip}:{SSH_PORT}
HostKey {host.host_key}
PidFile {host.pidfile("sshd")}
AuthorizedKeysFile .ssh/{lab.authorized_keys_name}
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AllowUsers {SSH_USER}
AllowStreamLocalForwarding yes
# not `no`: OpenSSH's `AllowTcpForwarding no` also denies direct-streamlocal (the libvirt socket
# forward rpc.connect_ssh uses): "request to connect to path ... was denied"
AllowTcpForwarding local
X11Forwarding no
SetEnv PATH={SESSION_PATH}
LogLevel VERBOSE
"""
    )


def _prepare_libvirt_dirs(host: HostLayout, caps_cache: Path) -> None:
    (host.pool_dir).mkdir(parents=True, exist_ok=True)
    (host.var_log_libvirt / "qemu").mkdir(parents=True, exist_ok=True)
    caps_cache.mkdir(parents=True, exist_ok=True)
    host.var_lib_libvirt.chmod(0o755)
    host.pool_dir.chmod(0o711)
    # the distro's libvirt config minus its NAT network 'default' (it would want an uplink), plus group auth
    if host.etc_libvirt.exists():
        shutil.rmtree(host.etc_libvirt)
    shutil.copytree("/etc/libvirt", host.etc_libvirt, symlinks=True)
    for pattern in ("qemu/networks/*.xml", "qemu/networks/autostart/*.xml"):
        for f in host.etc_libvirt.glob(pattern):
            f.unlink()
    with (host.etc_libvirt / "libvirtd.conf").open("a") as f:
        f.write(LIBVIRTD_CONF_EXTRA)


def _network_up(host: HostLayout) -> None:
    ns = host.netns
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host.veth_root, "type", "veth", "peer", "name", host.veth_host, "netns", ns],
        ["ip", "addr", "add", f"{host.root_ip}/24", "dev", host.veth_root],
        ["ip", "link", "set", host.veth_root, "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "addr", "add", f"{host.ip}/24", "dev", host.veth_host],
        ["ip", "-n", ns, "link", "set", host.veth_host, "up"],
        ["ip", "-n", ns, "link", "add", BRIDGE, "type", "bridge", "forward_delay", "0", "stp_state", "0"],
        ["ip", "-n", ns, "addr", "add", f"{host.gateway}/24", "dev", BRIDGE],
        ["ip", "-n", ns, "link", "set", BRIDGE, "up"],
        ["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
        ["ip", "route", "add", host.lan_cidr, "via", host.ip, "dev", host.veth_root],
    ]
    for argv in steps:
        run(argv)


def _sim_command(host: HostLayout) -> str:
    """The simulator's daemon, detached (stdio to its log, so the starting shell does not wait on it)."""
    q = shlex.quote
    argv = [sys.executable, "-m", "testbed.sim", "--name", host.name, "--socket", "/run/libvirt/libvirt-sock",
            "--control", str(host.sim_control), "--pool-path", POOL_PATH, "--guest-network", host.lan_cidr,
            "--pidfile", str(host.pidfile(host.hypervisor)), "--leases", str(host.leases),
            "--bridge", BRIDGE]
    if host.sim_knobs.exists():
        argv += ["--knobs", str(host.sim_knobs)]
    return (f"PYTHONPATH={q(str(REPO_ROOT))} setsid {' '.join(q(a) for a in argv)} "
            f"</dev/null >>{q(str(host.dir / 'sim.log'))} 2>&1 &")


def dnsmasq_command(host: HostLayout) -> str:
    """The bridge's DHCP server (no DNS: --port=0), as a shell line run in the host's namespaces."""
    lo, hi = host.dhcp_range
    q = shlex.quote
    return f"""dnsmasq --conf-file=/dev/null --port=0 --interface={BRIDGE} --bind-interfaces \\
  --except-interface=lo --dhcp-range={lo},{hi},255.255.255.0,1h --dhcp-authoritative \\
  --dhcp-leasefile={q(str(host.leases))} --pid-file={q(str(host.pidfile("dnsmasq")))} \\
  --log-dhcp --log-facility={q(str(host.dir / "dnsmasq.log"))}"""


def _start_daemons(host: HostLayout, caps_cache: Path) -> None:
    q = shlex.quote
    if host.simulated:
        hypervisor = _sim_command(host)
        dhcp = ""
    else:
        hypervisor = (f"virtlogd -d -p {q(str(host.pidfile('virtlogd')))}\n"
                      f"libvirtd -d -p {q(str(host.pidfile('libvirtd')))}")
        dhcp = dnsmasq_command(host) if host.dhcp else ""
    script = f"""
mkdir -p /etc/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt /run/libvirt
mount --bind {q(str(host.etc_libvirt))} /etc/libvirt
mount --bind {q(str(host.var_lib_libvirt))} /var/lib/libvirt
mount --bind {q(str(caps_cache))} /var/cache/libvirt
mount --bind {q(str(host.var_log_libvirt))} /var/log/libvirt
mount -t tmpfs -o mode=755 tmpfs /run/libvirt
{hypervisor}
/usr/sbin/sshd -f {q(str(host.sshd_config))} -E {q(str(host.dir / "sshd.log"))}
{dhcp}
"""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    run(["ip", "netns", "exec", host.netns, "unshare", "--mount", "--propagation", "private",
         "bash", "-euc", script], timeout=60)


def _socket_ready(host: HostLayout) -> bool:
    pid = read_pid(host.pidfile(host.hypervisor))
    # /run, not SOCKET's /var/run: that symlink would resolve against OUR root, not libvirtd's
    return alive(pid) and Path(f"/proc/{pid}/root/run/libvirt/libvirt-sock").is_socket()


def _tcp_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


def host_up(lab: LabLayout, host: HostLayout) -> None:
    """Create the host from nothing (the caller has cleaned any leftovers of this index first)."""
    caps_cache = cache_root() / "libvirt-cache"
    host.dir.mkdir(parents=True, exist_ok=True)
    _prepare_libvirt_dirs(host, caps_cache)
    if not host.host_key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"egress-kvm-lab{lab.index}-{host.name}",
             "-f", str(host.host_key)])
    _write_sshd_config(lab, host)
    host.leases.write_text("")
    run(["chgrp", "kvm", "/dev/kvm"], check=False)  # what udev would do: qemu runs as libvirt-qemu:kvm
    run(["chmod", "0660", "/dev/kvm"], check=False)
    _network_up(host)
    if host.simulated:  # every guest address is local here: the simulator serves the guests' proxies
        run(["ip", "-n", host.netns, "route", "add", "local", host.lan_cidr, "dev", "lo", "table", "local"])
    _start_daemons(host, caps_cache)
    wait_for(lambda: _socket_ready(host), timeout=30, what=f"{host.name}: libvirt socket")
    for daemon in daemons(host):
        wait_for(lambda d=daemon: alive(read_pid(host.pidfile(d))), timeout=10,
                 what=f"{host.name}: {daemon} pid file")
    wait_for(lambda: _tcp_open(host.ip, SSH_PORT), timeout=10, what=f"{host.name}: sshd on {host.ip}")
    if host.simulated:
        return  # the simulator's pool `default` exists from its start
    # first use probes QEMU's capabilities (~8 s cold; the shared cache dir makes later hosts fast)
    run(virsh_argv(host, "pool-define-as", POOL, "dir", "--target", POOL_PATH), timeout=120)
    run(virsh_argv(host, "pool-start", POOL))
    run(virsh_argv(host, "pool-autostart", POOL))


def host_problems(host: HostLayout) -> list[str]:
    """Why this host is not healthy (empty when it is): every daemon alive in its netns, socket present."""
    inode = netns_inode(host.netns)
    if inode is None:
        return [f"{host.name}: netns {host.netns} missing"]
    problems = []
    for daemon in (*daemons(host), "http-target"):
        pid = read_pid(host.pidfile(daemon))
        if pid is None or not (alive(pid) and in_netns(pid, inode)):
            problems.append(f"{host.name}: {daemon} not running")
    if not problems and not _socket_ready(host):
        problems.append(f"{host.name}: libvirt socket missing")
    return problems


def _ours(pid: int, host: HostLayout, inode: int | None) -> bool:
    """A pid from our pid file is ours if it lives in our netns or names our host dir on its command line
    (a pid file can outlive its process, and the number can be reused by an unrelated one)."""
    if not alive(pid):
        return False
    if inode is not None and in_netns(pid, inode):
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return str(host.dir).encode() in cmdline


def host_down(host: HostLayout) -> None:
    """Remove everything this host slot may have left: VMs, processes, veth, netns. Safe when absent."""
    inode = netns_inode(host.netns)
    if _socket_ready(host) and not host.simulated:
        names = run(virsh_argv(host, "list", "--all", "--name"), check=False, timeout=30).stdout.split()
        for name in names:
            run(virsh_argv(host, "destroy", name), check=False, timeout=60)
            run(virsh_argv(host, "undefine", name, "--nvram"), check=False, timeout=30)
    pids = []
    if host.dir.is_dir():
        for pidfile in host.dir.glob("*.pid"):
            pid = read_pid(pidfile)
            if pid is not None and _ours(pid, host, inode):
                pids.append(pid)
    stop(pids)
    stop(pids_in_netns(host.netns))  # QEMU, SSH sessions: anything else living in the namespace
    run(["ip", "link", "del", host.veth_root], check=False)  # also drops the peer and the route
    if inode is not None:
        run(["ip", "netns", "del", host.netns])
