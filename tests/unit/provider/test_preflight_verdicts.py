"""Preflight's decisions as tables: facts in, status and the message that says what to do out."""

from __future__ import annotations

import socket
from typing import Any

import asyncssh
import pytest

import rpc
from egress_kvm.preflight import verdicts as v
from egress_kvm.preflight.verdicts import PoolNeeds, SocketFacts, SshFailure, Status
from rpc.constants import StoragePoolState

GIB = 1024**3

# Entries of `ip -j -d link show dev X` (iproute2 6.1), trimmed to the fields the verdict reads; lo and
# eth0 are this machine's own, the others as iproute2 prints a bridge, an OVS bridge, a bridge port.
LINKS: dict[str, dict[str, Any]] = {
    "lo": {"ifname": "lo", "link_type": "loopback", "operstate": "UNKNOWN"},
    "eth0": {"ifname": "eth0", "link_type": "ether", "operstate": "UP"},
    "eno1": {"ifname": "eno1", "link_type": "ether", "operstate": "UP", "master": "br0",
             "linkinfo": {"info_slave_kind": "bridge"}},
    "br0": {"ifname": "br0", "link_type": "ether", "operstate": "UP", "linkinfo": {"info_kind": "bridge"}},
    "ovsbr": {"ifname": "ovsbr", "link_type": "ether", "operstate": "UNKNOWN",
              "linkinfo": {"info_kind": "openvswitch"}},
    "veth0": {"ifname": "veth0", "link_type": "ether", "operstate": "UP", "linkinfo": {"info_kind": "veth"}},
}


@pytest.mark.parametrize(("name", "status", "needle"), [
    ("br0", Status.PASS, "'br0' is a Linux bridge (state UP)"),
    ("ovsbr", Status.WARN, "'ovsbr' is an Open vSwitch bridge"),
    ("lo", Status.FAIL, "'lo' is the loopback device, not a bridge"),
    ("eth0", Status.FAIL, "'eth0' exists but is a network interface (a NIC), not a bridge: VMs attach to a "
                          "Linux bridge; create one with eth0 as its port"),
    ("eno1", Status.FAIL, "'eno1' is a port of bridge 'br0', not a bridge itself: set bridge: br0"),
    ("veth0", Status.FAIL, "'veth0' exists but is a veth device, not a bridge"),
])
def test_link_verdict(name: str, status: Status, needle: str) -> None:
    got = v.link_verdict(name, LINKS[name])
    assert got.status is status and needle in got.detail


@pytest.mark.parametrize(("address", "port", "line"), [
    ("nas1.home.lan", 22, "ssh-keyscan nas1.home.lan >> /k/known_hosts"),
    ("10.0.0.5", 2222, "ssh-keyscan -p 2222 10.0.0.5 >> /k/known_hosts"),
])
def test_keyscan_line_has_the_port_only_when_it_is_not_22(address: str, port: int, line: str) -> None:
    assert v.keyscan_line(address, port, "/k/known_hosts") == line


def _wrapped(cause: BaseException) -> rpc.ConnectFailed:
    try:
        raise rpc.ConnectFailed("ssh://virt@h:22: wrapped") from cause
    except rpc.ConnectFailed as exc:
        return exc


@pytest.mark.parametrize(("exc", "kind"), [
    (rpc.HostKeyRejected("ssh://virt@h:22: host key not accepted"), SshFailure.HOST_KEY),
    (_wrapped(asyncssh.PermissionDenied("no")), SshFailure.AUTH),
    (_wrapped(socket.gaierror(-2, "Name or service not known")), SshFailure.DNS),
    (_wrapped(ConnectionRefusedError(111, "Connection refused")), SshFailure.REFUSED),
    (rpc.ConnectFailed("ssh://virt@h:22: no SSH connection within 15 s"), SshFailure.TIMEOUT),
    (_wrapped(OSError(113, "No route to host")), SshFailure.UNREACHABLE),
    (_wrapped(asyncssh.ProtocolError("bad")), SshFailure.OTHER),
])
def test_classify_ssh_error(exc: BaseException, kind: SshFailure) -> None:
    assert v.classify_ssh_error(exc) is kind


@pytest.mark.parametrize(("kind", "port", "expected"), [
    (SshFailure.HOST_KEY, 2222, "the host key of nas1:2222 is not in /k/kh (an unknown host, or its key "
                                "changed); check the key, then: ssh-keyscan -p 2222 nas1 >> /k/kh"),
    (SshFailure.HOST_KEY, 22, "check the key, then: ssh-keyscan nas1 >> /k/kh"),
    (SshFailure.DNS, 22, "the name 'nas1' did not resolve (DNS)"),
    (SshFailure.AUTH, 22, "virt@nas1:22 did not accept the key /k/id: add /k/id.pub to "
                          "~virt/.ssh/authorized_keys"),
    (SshFailure.REFUSED, 2222, "nothing listens on nas1:2222"),
])
def test_ssh_verdict_says_what_to_do_once(kind: SshFailure, port: int, expected: str) -> None:
    got = v.ssh_verdict(kind, address="nas1", port=port, user="virt", key_file="/k/id", known_hosts="/k/kh",
                        reason="Unknown error -2 (Name or service not known)")
    assert got.status is Status.FAIL and expected in got.detail
    assert "Unknown error" not in got.detail and got.detail.count("nas1") == 1 + ("keyscan" in got.detail)


def _facts(owner: str, group: str, mode: int, groups: set[str]) -> SocketFacts:
    return SocketFacts("/s", True, owner, group, mode, "virt", frozenset(groups))


# OpenSSH answers "open failed" both when forwarding is off and when its connect(2) fails: the socket's
# owner, group and mode say which.
@pytest.mark.parametrize(("facts", "forwarding", "libvirt", "needle"), [
    (_facts("root", "libvirt", 0o770, {"virt"}), Status.SKIP, Status.FAIL,
     "virt is not in group 'libvirt', which owns /s (mode 0770): sudo usermod -aG libvirt virt"),
    (_facts("root", "libvirt", 0o770, {"virt", "libvirt"}), Status.FAIL, Status.SKIP,
     "sshd refused to forward to /s, which virt may open (mode 0770, group libvirt): set "
     "AllowStreamLocalForwarding yes for user virt"),
    (_facts("root", "root", 0o777, {"virt"}), Status.FAIL, Status.SKIP, "AllowStreamLocalForwarding yes"),
    (_facts("virt", "virt", 0o700, {"virt"}), Status.FAIL, Status.SKIP, "AllowStreamLocalForwarding yes"),
    (_facts("root", "root", 0o700, {"virt"}), Status.SKIP, Status.FAIL,
     "may not connect to /s (owner root, group root, mode 0700): check libvirtd.conf's unix_sock_group"),
    (SocketFacts("/s", False, user="virt"), Status.SKIP, Status.FAIL, "libvirt's socket /s does not exist"),
    (None, Status.FAIL, Status.SKIP, "AllowStreamLocalForwarding is off for virt, or virt may not open"),
])
def test_open_failed_verdicts(facts: SocketFacts | None, forwarding: Status, libvirt: Status,
                              needle: str) -> None:
    fwd, lib = v.open_failed_verdicts(facts, user="virt", path="/s", reason="open failed")
    assert (fwd.status, lib.status) == (forwarding, libvirt)
    failing = fwd if fwd.status is Status.FAIL else lib
    assert needle in failing.detail


@pytest.mark.parametrize(("stdout", "facts"), [
    ("sock root libvirt 770\ngroups virt kvm libvirt\n",
     SocketFacts("/s", True, "root", "libvirt", 0o770, "virt", frozenset({"virt", "kvm", "libvirt"}))),
    ("groups virt a b\n", SocketFacts("/s", False, user="virt", user_groups=frozenset({"virt", "a", "b"}))),
    ("", SocketFacts("/s", False, user="virt")),
])
def test_parse_socket_facts(stdout: str, facts: SocketFacts) -> None:
    assert v.parse_socket_facts(stdout, path="/s", user="virt") == facts


@pytest.mark.parametrize(("domain_type", "has_kvm", "status", "needle"), [
    ("kvm", True, Status.PASS, "/dev/kvm present"),
    ("kvm", False, Status.FAIL, "/dev/kvm is missing, and domainType kvm needs it"),
    ("qemu", True, Status.WARN, "set domainType: kvm"),
    ("qemu", False, Status.WARN, "no /dev/kvm: domainType qemu emulates the CPU"),
])
def test_kvm_verdict(domain_type: str, has_kvm: bool, status: Status, needle: str) -> None:
    got = v.kvm_verdict(domain_type=domain_type, has_kvm=has_kvm)
    assert got.status is status and needle in got.detail


@pytest.mark.parametrize(("exit_status", "stderr", "status", "needle"), [
    (0, "", Status.PASS, "virt can run `ip -j neigh show dev br0`"),
    (127, "sh: ip: not found", Status.FAIL, "`ip` is not on virt's PATH"),
    (1, 'Cannot find device "br0"', Status.PASS, "the bridge is checked below"),
    (255, "RTNETLINK answers: Operation not permitted", Status.FAIL, "exit status 255: RTNETLINK"),
])
def test_commands_verdict(exit_status: int, stderr: str, status: Status, needle: str) -> None:
    got = v.commands_verdict(exit_status=exit_status, stderr=stderr, user="virt",
                             command="ip -j neigh show dev br0")
    assert got.status is status and needle in got.detail


@pytest.mark.parametrize(("available", "base", "cached", "status", "needle"), [
    (25 * GIB, 2 * GIB, False, Status.PASS, "room for base 'deb' (2.0 GiB) + 2 VM(s) at diskSizeGb 10"),
    (21 * GIB, 2 * GIB, False, Status.FAIL, "has 21.0 GiB free of 100.0 GiB, base 'deb' (2.0 GiB) + 2 VM(s)"),
    (21 * GIB, None, False, Status.PASS, "base 'deb' (size unknown, not counted) + 2 VM(s)"),
    (21 * GIB, 2 * GIB, True, Status.PASS, "base 'deb' (already in the pool) + 2 VM(s)"),
])
def test_pool_room_verdict(available: int, base: int | None, cached: bool, status: Status,
                           needle: str) -> None:
    needs = PoolNeeds(base_bytes=base, base_label="deb", vms=2, disk_size_gb=10, base_cached=cached)
    got = v.pool_room_verdict("default", capacity=100 * GIB, available=available, needs=needs)
    assert got.status is status and needle in got.detail


@pytest.mark.parametrize(("state", "available", "needle"), [
    (StoragePoolState.INACTIVE, 40 * GIB, "'p' is inactive, not active (virsh pool-start p)"),
    (StoragePoolState.BUILDING, 40 * GIB, "'p' is building, not active"),
    (17, 40 * GIB, "'p' is 17, not active"),
    (StoragePoolState.RUNNING, 0, "'p' has no free space (capacity 50.0 GiB)"),
    (StoragePoolState.RUNNING, 40 * GIB, "'p' active, 40.0 GiB free of 50.0 GiB; room for"),
])
def test_pool_verdict(state: int, available: int, needle: str) -> None:
    needs = PoolNeeds(base_bytes=None, base_label="", vms=1, disk_size_gb=10)
    got = v.pool_verdict("p", state=state, capacity=50 * GIB, available=available, needs=needs)
    assert got.status is (Status.PASS if "room for" in needle else Status.FAIL) and needle in got.detail


def test_a_missing_pool_gets_the_commands_that_make_it() -> None:
    got = v.pool_missing_verdict("p")
    assert got.detail.endswith("virsh pool-define-as p dir --target /var/lib/libvirt/images && "
                               "virsh pool-start p && virsh pool-autostart p")


@pytest.mark.parametrize(("header", "total"), [
    ("bytes 0-0/245366784", 245366784), ("bytes 0-0/*", None), (None, None), ("garbage", None),
])
def test_content_range_total(header: str | None, total: int | None) -> None:
    assert v.content_range_total(header) == total


@pytest.mark.parametrize(("path", "hint"), [
    ("/etc/proxy-operator/kvm/id_ed25519", "pass --ssh-key with a local copy"),
    ("/home/me/.ssh/id", ""),
])
def test_key_file_hint(path: str, hint: str) -> None:
    got = v.key_file_hint(path, flag="--ssh-key")
    assert (hint in got) if hint else got == ""


@pytest.mark.parametrize(("lookup", "static", "status", "needle"), [
    (v.FilterLookup.FOUND, False, Status.PASS, "their IPv4 learned by DHCP"),
    (v.FilterLookup.FOUND, True, Status.PASS, "pinned to the address allocated from staticAddresses"),
    (v.FilterLookup.MISSING, True, Status.FAIL, "VMs cannot start"),
])
def test_filter_verdict_says_how_the_address_is_pinned(lookup: v.FilterLookup, static: bool, status: Status,
                                                       needle: str) -> None:
    from egress_kvm.config.models import TrafficFilter

    verdict = v.filter_verdict(TrafficFilter.CLEAN_TRAFFIC, lookup, static=static)
    assert verdict.status is status and needle in verdict.detail
