"""Preflight's decisions: facts gathered from a host in, a status and a message that says what to do out.

Pure functions (no I/O), tested as tables in tests/unit/provider/test_preflight_verdicts.py. Each message
names the thing that is wrong once and ends with the command or setting that fixes it.
"""

from __future__ import annotations

import enum
import errno
import shlex
import socket
from dataclasses import dataclass
from typing import Any

from egress_kvm.config.models import TrafficFilter
from egress_kvm.providers.kvm.capacity import GIB, MIB, fmt_bytes
from rpc.constants import StoragePoolState

# What one VM's seed ISO takes beside its overlay (the provider counts the ISO's real size; it is a few
# hundred KiB of cloud-init text and padding).
SEED_ALLOWANCE = 1 * MIB
# The path the in-pod Secret is mounted at: a local run with a cluster's providers file has no such file.
IN_POD_KEY_DIR = "/etc/proxy-operator/"


class Status(enum.Enum):
    PASS = "pass"
    WARN = "warn"  # works, but not as well as it could (emulated CPU, an Open vSwitch bridge)
    FAIL = "fail"
    SKIP = "skip"  # could not run: a check it depends on failed


@dataclass(frozen=True)
class Verdict:
    status: Status
    detail: str


def passed(detail: str) -> Verdict:
    return Verdict(Status.PASS, detail)


def warned(detail: str) -> Verdict:
    return Verdict(Status.WARN, detail)


def failed(detail: str) -> Verdict:
    return Verdict(Status.FAIL, detail)


# --- SSH ---------------------------------------------------------------------------------------------


class SshFailure(enum.Enum):
    HOST_KEY = "host key"
    AUTH = "auth"
    DNS = "dns"
    REFUSED = "refused"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    OTHER = "other"


def keyscan_line(address: str, port: int, known_hosts: str) -> str:
    """The exact command that records a host's key, with `-p` when sshd is not on 22."""
    port_arg = f"-p {port} " if port != 22 else ""
    return f"ssh-keyscan {port_arg}{shlex.quote(address)} >> {shlex.quote(known_hosts)}"


def classify_ssh_error(exc: BaseException) -> SshFailure:
    """Which SSH failure an exception from rpc.open_ssh is: by the cause's type and errno (rpc raises its
    timeout without a cause, so that one is known by its text)."""
    from asyncssh import HostKeyNotVerifiable, PermissionDenied

    import rpc

    if isinstance(exc, rpc.HostKeyRejected) or isinstance(exc.__cause__, HostKeyNotVerifiable):
        return SshFailure.HOST_KEY
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if isinstance(cause, PermissionDenied):
        return SshFailure.AUTH
    if isinstance(cause, socket.gaierror):
        return SshFailure.DNS
    if isinstance(cause, ConnectionRefusedError):
        return SshFailure.REFUSED
    if isinstance(cause, TimeoutError) or "no SSH connection within" in str(exc):
        return SshFailure.TIMEOUT
    if isinstance(cause, OSError) and cause.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return SshFailure.UNREACHABLE
    return SshFailure.OTHER


def ssh_verdict(kind: SshFailure, *, address: str, port: int, user: str, key_file: str,
                known_hosts: str | None, reason: str) -> Verdict:
    where = f"{address}:{port}"
    match kind:
        case SshFailure.HOST_KEY:
            kh = known_hosts or "known_hosts"
            return failed(f"the host key of {where} is not in {kh} (an unknown host, or its key changed); "
                          f"check the key, then: {keyscan_line(address, port, kh)}")
        case SshFailure.AUTH:
            return failed(f"{user}@{where} did not accept the key {key_file}: add {key_file}.pub to "
                          f"~{user}/.ssh/authorized_keys on the host")
        case SshFailure.DNS:
            return failed(f"the name {address!r} did not resolve (DNS): use the host's IP address or "
                          f"a name this machine resolves")
        case SshFailure.REFUSED:
            return failed(f"nothing listens on {where}: is sshd running, and on port {port}?")
        case SshFailure.TIMEOUT:
            return failed(f"no SSH answer from {where} in time: a wrong address, or a firewall drops "
                          f"port {port}")
        case SshFailure.UNREACHABLE:
            return failed(f"{where} is unreachable from here (no route): check the address")
    return failed(f"SSH to {user}@{where} failed: {reason}")


# --- libvirt's socket --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SocketFacts:
    """What `stat` and `id` said on the host about libvirt's socket and the SSH user."""

    path: str
    exists: bool
    owner: str = ""
    group: str = ""
    mode: int = 0
    user: str = ""
    user_groups: frozenset[str] = frozenset()


def forwarding_prohibited(user: str) -> Verdict:
    return failed(f"sshd refuses stream-local forwarding; set AllowStreamLocalForwarding yes for user {user} "
                  f"in sshd_config (and AllowTcpForwarding not `no`, which denies it too), then reload sshd")


def may_open(facts: SocketFacts) -> bool:
    """Whether the socket's owner, group and mode let the user connect (connect(2) needs write)."""
    if facts.user == facts.owner:
        return facts.mode & 0o200 != 0
    if facts.group in facts.user_groups:
        return facts.mode & 0o020 != 0
    return facts.mode & 0o002 != 0


def open_failed_verdicts(facts: SocketFacts | None, *, user: str, path: str,
                         reason: str) -> tuple[Verdict, Verdict]:
    """(forwarding, libvirt) when sshd answered the forward with a plain "open failed".

    OpenSSH gives that one answer both when AllowStreamLocalForwarding is off and when its connect(2) to
    the socket fails, so the socket's owner, group and mode (read over SSH exec) decide which it was.
    """
    unknown = Verdict(Status.SKIP, f"skipped: cannot tell while {user} may not open {path} (see libvirt)")
    if facts is None:
        return (failed(f"sshd could not open {path} for {user} ({reason}): AllowStreamLocalForwarding is "
                       f"off for {user}, or {user} may not open the socket (libvirtd down, or {user} not in "
                       f"its group); preflight cannot look closer without command execution"),
                Verdict(Status.SKIP, "skipped: forwarding failed"))
    if not facts.exists:
        return unknown, failed(f"libvirt's socket {path} does not exist on the host: is libvirtd (or "
                               f"virtqemud) running, and is `socket:` the right path?")
    if may_open(facts):
        return (failed(f"sshd refused to forward to {path}, which {user} may open (mode {facts.mode:04o}, "
                       f"group {facts.group}): set AllowStreamLocalForwarding yes for user {user} in "
                       f"sshd_config (and AllowTcpForwarding not `no`, which denies it too), then reload "
                       f"sshd; if it is set, libvirtd is not listening on {path}"),
                Verdict(Status.SKIP, "skipped: forwarding failed"))
    if facts.mode & 0o060 == 0o060 and facts.group not in facts.user_groups:
        return unknown, failed(f"{user} is not in group {facts.group!r}, which owns {path} "
                               f"(mode {facts.mode:04o}): sudo usermod -aG {facts.group} {user}")
    return unknown, failed(f"{user} may not connect to {path} (owner {facts.owner}, group {facts.group}, "
                           f"mode {facts.mode:04o}): check libvirtd.conf's unix_sock_group and "
                           f"unix_sock_rw_perms")


def parse_socket_facts(stdout: str, *, path: str, user: str) -> SocketFacts:
    """From `stat -L -c 'sock %U %G %a' PATH; echo "groups $(id -nG)"` (no `sock` line: no socket)."""
    sock: list[str] = []
    groups: list[str] = []
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "sock":
            sock = rest.split()
        elif word == "groups":
            groups = rest.split()
    if len(sock) == 3 and all(c in "01234567" for c in sock[2]):
        return SocketFacts(path, True, sock[0], sock[1], int(sock[2], 8), user, frozenset(groups))
    return SocketFacts(path, False, user=user, user_groups=frozenset(groups))


# --- KVM ---------------------------------------------------------------------------------------------


def kvm_verdict(*, domain_type: str, has_kvm: bool) -> Verdict:
    if domain_type == "kvm":
        if has_kvm:
            return passed("/dev/kvm present (domainType kvm: hardware virtualisation)")
        return failed("/dev/kvm is missing, and domainType kvm needs it: enable VT-x/AMD-V in the "
                      "firmware and load kvm_intel or kvm_amd, or set domainType: qemu (emulated, slow)")
    if has_kvm:
        return warned("domainType qemu emulates the CPU although /dev/kvm is present: VMs run many times "
                      "slower; set domainType: kvm unless this host's KVM is unusable")
    return warned("no /dev/kvm: domainType qemu emulates the CPU, so VMs boot and run many times slower")


# --- the bridge --------------------------------------------------------------------------------------


def link_verdict(name: str, link: dict[str, Any]) -> Verdict:
    """From one entry of `ip -j -d link show dev NAME`: a Linux bridge passes; anything else says what
    to do."""
    kind = (link.get("linkinfo") or {}).get("info_kind", "")
    state = link.get("operstate") or "unknown"
    master = link.get("master")
    if kind == "bridge":
        return passed(f"{name!r} is a Linux bridge (state {state})")
    if kind == "openvswitch":
        return warned(f"{name!r} is an Open vSwitch bridge: the operator attaches VMs as a plain bridge "
                      f"port (no <virtualport type='openvswitch'/>); a Linux bridge is what it is tested on")
    if link.get("link_type") == "loopback":
        return failed(f"{name!r} is the loopback device, not a bridge: set bridge: to a Linux bridge on "
                      f"the LAN the VMs should join (`ip -br link show type bridge` lists them)")
    if master:
        return failed(f"{name!r} is a port of bridge {master!r}, not a bridge itself: set bridge: {master}")
    what = f"a {kind} device" if kind else "a network interface (a NIC)"
    return failed(f"{name!r} exists but is {what}, not a bridge: VMs attach to a Linux bridge; create one "
                  f"with {name} as its port (e.g. bridge br0, bridge-ports {name}) and set bridge: br0")


def missing_link_verdict(name: str, stderr: str) -> Verdict:
    said = f" ({stderr.strip()})" if stderr.strip() else ""
    return failed(f"bridge {name!r} not found on the host{said}: `ip -br link show type bridge` lists "
                  f"the bridges there")


# --- the traffic filter ------------------------------------------------------------------------------


class FilterLookup(enum.Enum):
    FOUND = "found"
    MISSING = "missing"  # libvirt answered: no such nwfilter
    ERROR = "error"  # libvirt could not look (no nwfilter driver loaded)
    NOT_NEEDED = "not-needed"  # trafficFilter: none


def filter_verdict(wanted: TrafficFilter, lookup: FilterLookup, *, reason: str = "",
                   static: bool = False) -> Verdict:
    """Whether VMs can start with `trafficFilter`: libvirt refuses to start a domain whose NIC names a
    filter it does not have. `static`: the host declares staticAddresses (the filter is pinned to the
    allocated address instead of learning one from DHCP)."""
    name = wanted.value
    if lookup is FilterLookup.NOT_NEEDED:
        return warned("trafficFilter: none: VM NICs get no nwfilter, so tenants on this bridge can spoof "
                      "MAC, IP and ARP")
    if lookup is FilterLookup.FOUND:
        how = ("pinned to the address allocated from staticAddresses" if static
               else "their IPv4 learned by DHCP")
        return passed(f"libvirt has nwfilter {name!r} (VM NICs get it, {how})")
    fix = (f"install libvirt's nwfilter driver and its stock filters (Debian: "
           f"libvirt-daemon-driver-nwfilter; `virsh nwfilter-list` must show {name!r}), or set "
           f"trafficFilter: none (no tenant isolation on the bridge)")
    if lookup is FilterLookup.MISSING:
        return failed(f"libvirt has no nwfilter {name!r}, so VMs cannot start: {fix}")
    return failed(f"libvirt cannot look up nwfilter {name!r} ({reason or 'no reason given'}): {fix}")


# --- commands over SSH -------------------------------------------------------------------------------


def commands_verdict(*, exit_status: int | None, stderr: str, user: str, command: str) -> Verdict:
    """The provider reads the neighbour table with `ip` when the guest agent has no address yet."""
    if exit_status == 0:
        return passed(f"{user} can run `{command}` (the neighbour-table address fallback)")
    if exit_status == 127:
        return failed(f"`ip` is not on {user}'s PATH on the host: install iproute2 or add /usr/sbin and "
                      f"/sbin to PATH for SSH sessions (sshd's SetEnv, or ~/.ssh/environment)")
    text = stderr.strip()
    if "cannot find device" in text.lower() or "does not exist" in text.lower():
        return passed(f"{user} can run `ip` (the bridge is checked below)")
    return failed(f"`{command}` failed with exit status {exit_status}: {text or 'no message'}")


# --- the pool ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolNeeds:
    """Room for one base image (the largest configured, when its size is known) plus `vms` overlays."""

    base_bytes: int | None
    base_label: str
    vms: int
    disk_size_gb: int
    base_cached: bool = False  # the host's pool already holds that base: nothing to count for it
    base_volume: str = ""  # its volume name as the provider makes it (content-addressed: naming.py)

    @property
    def overlay_bytes(self) -> int:
        return self.disk_size_gb * GIB + SEED_ALLOWANCE

    @property
    def total(self) -> int:
        base = 0 if self.base_cached else (self.base_bytes or 0)
        return base + self.vms * self.overlay_bytes


def pool_missing_verdict(pool: str) -> Verdict:
    return failed(f"storage pool {pool!r} does not exist: virsh pool-define-as {pool} dir --target "
                  f"/var/lib/libvirt/images && virsh pool-start {pool} && virsh pool-autostart {pool}")


def pool_verdict(pool: str, *, state: int, capacity: int, available: int, needs: PoolNeeds) -> Verdict:
    """From virStoragePoolGetInfo: active, not full, and with room for what `needs` counts."""
    if state != StoragePoolState.RUNNING:
        known = state in StoragePoolState._value2member_map_
        name = StoragePoolState(state).name.lower() if known else str(state)
        return failed(f"storage pool {pool!r} is {name}, not active (virsh pool-start {pool})")
    if available <= 0:
        return failed(f"storage pool {pool!r} has no free space (capacity {fmt_bytes(capacity)})")
    return pool_room_verdict(pool, capacity=capacity, available=available, needs=needs)


def pool_room_verdict(pool: str, *, capacity: int, available: int, needs: PoolNeeds) -> Verdict:
    overlays = f"{needs.vms} VM(s) at diskSizeGb {needs.disk_size_gb} ({fmt_bytes(needs.overlay_bytes)} each)"
    if not needs.base_label:
        base = ""
    elif needs.base_cached:
        base = f"base {needs.base_label!r} (already in the pool)"
    elif needs.base_bytes is not None:
        base = f"base {needs.base_label!r} ({fmt_bytes(needs.base_bytes)})"
    else:
        base = f"base {needs.base_label!r} (size unknown, not counted)"
    wanted = " + ".join(p for p in (base, overlays) if p)
    if available < needs.total:
        return failed(f"storage pool {pool!r} has {fmt_bytes(available)} free of {fmt_bytes(capacity)}, "
                      f"{wanted} need {fmt_bytes(needs.total)}: free space, grow the pool, or lower "
                      f"diskSizeGb")
    return passed(f"storage pool {pool!r} active, {fmt_bytes(available)} free of {fmt_bytes(capacity)}; "
                  f"room for {wanted}")


# --- image URLs --------------------------------------------------------------------------------------


class HttpFailure(enum.Enum):
    DNS = "dns"
    REFUSED = "refused"
    TIMEOUT = "timeout"
    TLS = "tls"
    OTHER = "other"


def image_verdict(*, label: str, shown_url: str, status: int | None, size: int | None,
                  failure: HttpFailure | None = None, host: str = "", reason: str = "") -> Verdict:
    """Whether the image URL answers (from where preflight runs; the operator fetches from its pod)."""
    if failure is not None:
        match failure:
            case HttpFailure.DNS:
                return failed(f"image {label!r}: the name {host!r} in {shown_url} did not resolve (DNS)")
            case HttpFailure.REFUSED:
                return failed(f"image {label!r}: nothing listens at {shown_url} (connection refused)")
            case HttpFailure.TIMEOUT:
                return failed(f"image {label!r}: {shown_url} did not answer in time")
            case HttpFailure.TLS:
                return failed(f"image {label!r}: TLS to {shown_url} failed ({reason}): is the server's "
                              f"certificate trusted here?")
        return failed(f"image {label!r}: {shown_url} failed: {reason}")
    assert status is not None
    if status >= 400:
        return failed(f"image {label!r}: {shown_url} answered HTTP {status}: check the URL")
    if size is None:
        return warned(f"image {label!r}: {shown_url} answers (HTTP {status}) but gives no size, so the pool "
                      f"check cannot count the base image")
    return passed(f"image {label!r}: {shown_url} answers (HTTP {status}), {fmt_bytes(size)}")


def image_denied_verdict(*, label: str, shown_url: str, why: str) -> Verdict:
    """The operator's egress policy refuses the URL (`why` is the policy's fixed phrase): the download
    would fail on the first Proxy, so preflight fails it now and names the knob."""
    return failed(f"image {label!r}: the operator would refuse to download {shown_url}: {why}; a mirror "
                  f"on such an address needs an egress.allowedCIDRs entry in the providers file (e.g. "
                  f"`10.1.2.3/32:8080`, docs/security.md)")


def content_range_total(header: str | None) -> int | None:
    """The total length from `Content-Range: bytes 0-0/12345` (None for `*` or a malformed header)."""
    if not header or "/" not in header:
        return None
    total = header.rsplit("/", 1)[1].strip()
    return int(total) if total.isdigit() else None


# --- files -------------------------------------------------------------------------------------------


def key_file_hint(path: str, *, flag: str) -> str:
    """A key path from a cluster's providers file is the in-pod mount: say which flag overrides it."""
    if path.startswith(IN_POD_KEY_DIR):
        return f" (that is the path inside the operator's pod; pass {flag} with a local copy)"
    return ""
