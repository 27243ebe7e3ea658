"""Preflight's failure branches against an in-process SSH server (asyncssh) and a scripted libvirtd.

The SSH server is real SSH on loopback: key login, stream-local forwarding (which it can refuse as
"administratively prohibited", or answer with OpenSSH's bare "open failed", which OpenSSH gives both under
`AllowStreamLocalForwarding no` and for a socket it cannot open), and exec of the commands preflight
sends: `ip`, `test -c /dev/kvm`, `stat`/`id` (exec it can refuse, or answer as a host without `ip`,
without /dev/kvm, or with a non-bridge device). Forwarded connections reach a unix socket served by the
rpc tests' FakeServer, which speaks libvirt's wire protocol and can stay silent (a daemon that stopped
answering).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import socket
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from egress_kvm.config import parse_providers
from egress_kvm.preflight import CHECKS, CheckResult, check_host, run_preflight
from egress_kvm.preflight.verdicts import PoolNeeds, Status
from rpc.constants import ErrorCode, StoragePoolState
from rpc.types import StoragePool, StoragePoolGetInfoRet, StorageVol

GIB = 1024**3


def _load_fake_server() -> Any:
    # tests/unit/rpc is not a package on sys.path (its folder name would shadow the rpc package).
    path = Path(__file__).parents[1] / "rpc" / "rpc_fake_server.py"
    spec = importlib.util.spec_from_file_location("rpc_fake_server_for_preflight", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fake_rpc = _load_fake_server()


@dataclass
class Host:
    """What the in-process host does; tests change these before running preflight."""

    socket_path: str
    forwarding: bool = True
    exec_allowed: bool = True
    libvirt_answers: bool = True
    pool_state: int = StoragePoolState.RUNNING
    pool_available: int = 40 * GIB
    link_kind: str | None = "bridge"  # `ip -d` linkinfo kind; None: the device does not exist
    has_ip: bool = True
    has_kvm: bool = True
    socket_open: bool = True  # False: sshd's connect to the socket fails (missing, or shut to the user)
    socket_stat: str = "root libvirt 770"  # `stat -c '%U %G %a'`; "" when the socket does not exist
    user_groups: str = "virt"
    volumes: set[str] = field(default_factory=set)  # the pool's volume names
    # `virsh nwfilter-list`; None: libvirtd has no nwfilter driver (the call is unsupported)
    nwfilters: tuple[str, ...] | None = ("allow-dhcp", "clean-traffic", "no-ip-spoofing")
    port: int = 0
    servers: list[Any] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)

    def run(self, command: str) -> tuple[int, str, str]:
        """What a shell on the host answers to the commands preflight sends (and only those)."""
        self.commands.append(command)
        argv = command.split()
        if argv[:3] == ["test", "-c", "/dev/kvm"]:
            return (0 if self.has_kvm else 1), "", ""
        if argv[:1] == ["stat"]:
            out = f"sock {self.socket_stat}\n" if self.socket_stat else ""
            return 0, out + f"groups {self.user_groups}\n", ""
        if argv[:1] != ["ip"] or not self.has_ip:
            return 127, "", f"sh: 1: {argv[0]}: not found\n"
        dev = argv[-1]
        if self.link_kind is None:
            return 1, "", f'Device "{dev}" does not exist.\n'
        if argv[:3] == ["ip", "-j", "neigh"]:
            return 0, "[]", ""
        info = {"ifname": dev, "operstate": "UP", "linkinfo": {"info_kind": self.link_kind}}
        return 0, json.dumps([info]), ""


class _SshServer(asyncssh.SSHServer):
    def __init__(self, host: Host, client_key: asyncssh.SSHKey) -> None:
        self._host = host
        self._key = client_key.export_public_key()

    def begin_auth(self, username: str) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return key.export_public_key() == self._key

    def unix_connection_requested(self, dest_path: str) -> bool:
        if not self._host.forwarding:  # an sshd that says "administratively prohibited" outright
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                                            "open failed: administratively prohibited")
        # OpenSSH's answer both when its connect(2) to the socket fails and under
        # AllowStreamLocalForwarding no (seen on the lab's sshd, tests/integration/test_kvm_preflight.py)
        if not self._host.socket_open:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, "open failed")
        return True  # asyncssh connects the channel to dest_path on this machine

    def session_requested(self) -> Any:
        if not self._host.exec_allowed:
            return False
        return self._exec

    async def _exec(self, stdin: Any, stdout: Any, stderr: Any) -> None:
        status, out, err = self._host.run(stdout.channel.get_command() or "")
        stdout.write(out)
        stderr.write(err)
        stdout.channel.exit(status)


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[tuple[Host, Path, Path]]:
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = tmp_path / "id"
    key_path.write_bytes(client_key.export_private_key())
    h = Host(socket_path=str(tmp_path / "libvirt-sock"))

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(h.socket_path)
    listener.listen(8)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()

    def volume_lookup(pool: StoragePool, name: str) -> StorageVol:
        if name not in h.volumes:
            raise fake_rpc.FakeError(ErrorCode.NO_STORAGE_VOL, f"Storage volume not found: {name}")
        return StorageVol(pool.name, name, f"/pool/{name}")

    def list_nwfilters(maxnames: int) -> tuple[str, ...]:
        if h.nwfilters is None:
            raise fake_rpc.FakeError(ErrorCode.NO_SUPPORT, "this function is not supported by the "
                                                           "connection driver: virConnectListNWFilters")
        return h.nwfilters

    def handlers() -> dict[int, Callable[..., Any]]:
        silent = fake_rpc.NO_REPLY
        return {
            157: lambda: 9_000_000 if h.libvirt_answers else silent,  # connect_get_lib_version
            4: lambda: 7_002_000,  # connect_get_version
            84: lambda name: StoragePool(name, bytes(16)),  # storage_pool_lookup_by_name
            87: lambda pool: StoragePoolGetInfoRet(h.pool_state, 50 * GIB, 50 * GIB - h.pool_available,
                                                   h.pool_available),
            95: volume_lookup,  # storage_vol_lookup_by_name
            179: list_nwfilters,  # connect_list_nwfilters
        }

    async def accept_loop() -> None:
        while True:
            conn, _ = await loop.sock_accept(listener)
            server = fake_rpc.FakeServer(sock=conn, handlers=handlers())
            h.servers.append(server)
            await server.start()

    acceptor = loop.create_task(accept_loop())
    ssh = await asyncssh.create_server(lambda: _SshServer(h, client_key), "127.0.0.1", 0,
                                       server_host_keys=[host_key])
    h.port = ssh.sockets[0].getsockname()[1]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{h.port} " + host_key.export_public_key().decode())
    try:
        yield h, key_path, known_hosts
    finally:
        ssh.close()
        await ssh.wait_closed()
        acceptor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acceptor
        for server in h.servers:
            await server.stop()
        listener.close()


def config_for(h: Host, key: Path, known_hosts: Path, *, hosts: int = 1, domain_type: str = "kvm",
               traffic_filter: str = "clean-traffic") -> Any:
    return parse_providers([{"name": "kvm-t", "type": "kvm", "kvm": {
        "trafficFilter": traffic_filter,
        "sshKeyFile": str(key), "knownHostsFile": str(known_hosts),
        "images": {"d": {"url": "http://127.0.0.1:1/d.qcow2"}},
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 512}},
        "hosts": [{"name": f"h{i}", "address": f"127.0.0.1:{h.port}", "user": "virt", "bridge": "br0",
                   "socket": h.socket_path, "domainType": domain_type} for i in range(hosts)]}}])


async def preflight(h: Host, key: Path, known_hosts: Path, *, time_limit: float = 5.0,
                    traffic_filter: str = "clean-traffic") -> dict[str, CheckResult]:
    entry = config_for(h, key, known_hosts, traffic_filter=traffic_filter).providers[0]
    results = await check_host(entry.name, entry.kvm, entry.kvm.hosts[0], time_limit=time_limit)
    assert [r.check for r in results] == list(CHECKS)
    return {r.check: r for r in results}


def status(results: dict[str, CheckResult]) -> dict[str, bool | None]:
    return {name: r.ok for name, r in results.items()}


async def test_all_checks_pass_on_a_good_host(host: tuple[Host, Path, Path]) -> None:
    r = await preflight(*host)
    assert status(r) == dict.fromkeys(CHECKS, True)
    assert "libvirt 9.0.0" in r["libvirt"].detail and "40.0 GiB free" in r["pool"].detail


async def test_refused_stream_local_forwarding_fails_and_says_what_to_set(
        host: tuple[Host, Path, Path]) -> None:
    h = host[0]
    h.forwarding = False
    r = await preflight(*host)
    assert status(r) == {"ssh": True, "forwarding": False, "libvirt": None, "pool": None, "filter": None,
                         "commands": True, "kvm": True, "bridge": True}  # exec checks still run
    assert "refuses stream-local forwarding" in r["forwarding"].detail
    assert "AllowStreamLocalForwarding yes for user virt" in r["forwarding"].detail
    assert r["libvirt"].detail == "skipped: forwarding failed"


async def test_a_libvirtd_that_stops_answering_is_a_fail_not_a_traceback(
        host: tuple[Host, Path, Path]) -> None:
    h = host[0]
    h.libvirt_answers = False
    r = await preflight(*host, time_limit=0.5)
    assert status(r) == {"ssh": True, "forwarding": True, "libvirt": False, "pool": None, "filter": None,
                         "commands": True, "kvm": True, "bridge": True}
    assert "did not answer" in r["libvirt"].detail and "connect_get_lib_version" in r["libvirt"].detail


async def test_one_host_failing_mid_check_does_not_stop_the_others(host: tuple[Host, Path, Path]) -> None:
    h, key, known_hosts = host
    h.libvirt_answers = False
    config = config_for(h, key, known_hosts, hosts=2)
    seen: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("egress_kvm.preflight.check_host", _with_time_limit(check_host, 0.5))
        results = await run_preflight(config, emit=lambda res: seen.append(res.line()))
    assert {r.host for r in results} == {None, "h0", "h1"}  # None: the image check, once per provider
    host_lines = [ln.split()[0] for ln in seen if ln.split()[1] != "kvm-t"]
    assert host_lines == ["PASS", "PASS", "FAIL", "SKIP", "SKIP", "PASS", "PASS", "PASS"] * 2


def _with_time_limit(fn: Any, limit: float) -> Any:
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs, time_limit=limit)
    return wrapped


async def test_run_preflight_reports_an_unforeseen_error_per_host_and_goes_on(
        host: tuple[Host, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    h, key, known_hosts = host
    calls: list[str] = []

    async def flaky(provider: str, kvm: Any, host_cfg: Any, **kw: Any) -> list[CheckResult]:
        calls.append(host_cfg.name)
        if host_cfg.name == "h0":
            raise RuntimeError("boom")
        return await check_host(provider, kvm, host_cfg, **kw)

    monkeypatch.setattr("egress_kvm.preflight.check_host", flaky)
    results = await run_preflight(config_for(h, key, known_hosts, hosts=2))
    assert calls == ["h0", "h1"]
    per_host = [r for r in results if r.host is not None]
    assert per_host[0].line() == "FAIL kvm-t/h0 checks: preflight could not finish: RuntimeError: boom"
    assert [r.ok for r in per_host[1:]] == [True] * len(CHECKS)


@pytest.mark.parametrize(("state", "available", "needle"), [
    (StoragePoolState.INACTIVE, 40 * GIB, "is inactive, not active (virsh pool-start default)"),
    (StoragePoolState.RUNNING, 0, "has no free space (capacity 50.0 GiB)"),
])
async def test_pool_inactive_or_full_fails(host: tuple[Host, Path, Path], state: int, available: int,
                                           needle: str) -> None:
    h = host[0]
    h.pool_state, h.pool_available = state, available
    r = await preflight(*host)
    assert status(r) == {**dict.fromkeys(CHECKS, True), "pool": False}
    assert needle in r["pool"].detail


@pytest.mark.parametrize(("nwfilters", "traffic_filter", "ok", "needle"), [
    (("allow-dhcp", "clean-traffic"), "clean-traffic", True, "libvirt has nwfilter 'clean-traffic'"),
    (("allow-dhcp",), "clean-traffic", False, "libvirt has no nwfilter 'clean-traffic', so VMs cannot start"),
    (None, "clean-traffic", False, "cannot look up nwfilter 'clean-traffic' (this function is not supported"),
    (None, "none", True, "trafficFilter: none: VM NICs get no nwfilter"),  # a WARN: nothing to look up
])
async def test_the_traffic_filter_must_be_one_libvirt_has(host: tuple[Host, Path, Path],
                                                          nwfilters: tuple[str, ...] | None,
                                                          traffic_filter: str, ok: bool, needle: str) -> None:
    host[0].nwfilters = nwfilters
    r = await preflight(*host, traffic_filter=traffic_filter)
    assert status(r) == {**dict.fromkeys(CHECKS, True), "filter": ok}
    assert needle in r["filter"].detail
    if not ok:
        assert "libvirt-daemon-driver-nwfilter" in r["filter"].detail and "trafficFilter: none" in r[
            "filter"].detail


@pytest.mark.parametrize(("setup", "failing", "needle"), [
    (lambda h: setattr(h, "link_kind", "dummy"), {"bridge": False},
     "'br0' exists but is a dummy device, not a bridge"),
    (lambda h: setattr(h, "link_kind", None), {"bridge": False}, "bridge 'br0' not found on the host"),
    (lambda h: setattr(h, "has_ip", False), {"commands": False, "bridge": None},
     "`ip` is not on virt's PATH on the host"),
    (lambda h: setattr(h, "exec_allowed", False), {"commands": False, "kvm": None, "bridge": None},
     "the host refuses command execution"),
])
async def test_exec_and_bridge_check_failures(host: tuple[Host, Path, Path], setup: Callable[[Host], None],
                                              failing: dict[str, bool | None], needle: str) -> None:
    setup(host[0])
    r = await preflight(*host)
    assert status(r) == {**dict.fromkeys(CHECKS, True), **failing}
    problems = [x.detail for x in r.values() if x.ok is False]
    assert len(problems) == 1 and needle in problems[0]  # said once, by the first check it breaks


@pytest.mark.parametrize(("socket_stat", "groups", "failing", "needle"), [
    ("root libvirt 770", "virt users", {"forwarding": None, "libvirt": False},
     "virt is not in group 'libvirt', which owns"),
    ("root libvirt 770", "virt libvirt", {"forwarding": False, "libvirt": None},
     "sshd refused to forward to"),
    ("", "virt libvirt", {"forwarding": None, "libvirt": False},
     "does not exist on the host: is libvirtd (or virtqemud) running"),
])
async def test_open_failed_is_told_apart_by_the_socket_s_group_and_mode(
        host: tuple[Host, Path, Path], socket_stat: str, groups: str, failing: dict[str, bool | None],
        needle: str) -> None:
    """OpenSSH answers a refused forward and a failed connect(2) alike; `stat` + `id` over exec decide."""
    h = host[0]
    h.socket_open, h.socket_stat, h.user_groups = False, socket_stat, groups
    r = await preflight(*host)
    assert status(r) == {**dict.fromkeys(CHECKS, True), **failing, "pool": None, "filter": None}
    problems = [x.detail for x in r.values() if x.ok is False]
    assert len(problems) == 1 and needle in problems[0]
    if "not in group" in needle:
        assert problems[0].endswith("sudo usermod -aG libvirt virt")


@pytest.mark.parametrize(("domain_type", "has_kvm", "expected"), [
    ("kvm", True, Status.PASS), ("kvm", False, Status.FAIL), ("qemu", True, Status.WARN),
    ("qemu", False, Status.WARN),
])
async def test_dev_kvm_against_the_domain_type(host: tuple[Host, Path, Path], domain_type: str,
                                               has_kvm: bool, expected: Status) -> None:
    h, key, known_hosts = host
    h.has_kvm = has_kvm
    entry = config_for(h, key, known_hosts, domain_type=domain_type).providers[0]
    results = {x.check: x for x in await check_host(entry.name, entry.kvm, entry.kvm.hosts[0], time_limit=5)}
    assert results["kvm"].status is expected
    assert "test -c /dev/kvm" in h.commands


async def test_the_pool_must_hold_a_base_and_n_overlays(host: tuple[Host, Path, Path]) -> None:
    h, key, known_hosts = host
    entry = config_for(h, key, known_hosts).providers[0]  # diskSizeGb 10 (the default)
    h.pool_available = 41 * GIB
    for vms, ok in ((3, True), (4, False)):
        needs = PoolNeeds(base_bytes=5 * GIB, base_label="d", vms=vms, disk_size_gb=10,
                          base_volume="base-d-0123456789abcdef.qcow2")
        got = {x.check: x for x in await check_host(entry.name, entry.kvm, entry.kvm.hosts[0], time_limit=5,
                                                       needs=needs)}
        assert got["pool"].ok is ok, got["pool"].detail
    assert "base 'd' (5.0 GiB) + 4 VM(s) at diskSizeGb 10" in got["pool"].detail
    assert "need 45.0 GiB" in got["pool"].detail
    h.volumes.add("base-d-0123456789abcdef.qcow2")  # the base is imported already: only overlays need room
    got = {x.check: x for x in await check_host(entry.name, entry.kvm, entry.kvm.hosts[0], time_limit=5,
                                                   needs=needs)}
    assert got["pool"].ok, got["pool"].detail
    assert "base 'd' (already in the pool) + 4 VM(s)" in got["pool"].detail
