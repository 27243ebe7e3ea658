"""Preflight: the spec's "check from the operator's point of view", done by the operator's own code.

Per provider, once: each image URL answers, with its size. Per host: SSH login with the configured key and
host-key verification; that sshd allows stream-local forwarding (the operator reaches libvirt only that
way) and that the user may open libvirt's socket; libvirt answers (its version); the storage pool is
active with room for one base image plus N overlays; the user can run `ip` (the provider's
neighbour-table fallback); /dev/kvm is there for domainType kvm; the bridge is a Linux bridge; libvirt
has the nwfilter `trafficFilter` names (so VMs can start with it). Each check
gives one result (verdicts.py decides what it says); a check that cannot run because one it depends on
failed is skipped, and the others still run, so one run shows every problem of a host.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncssh

import rpc
from egress_kvm.config import ConfigError, ProvidersConfig, check_kvm_files
from egress_kvm.config.models import HostConfig, KvmConfig, TrafficFilter
from egress_kvm.policy.policies import configured_image_policy
from egress_kvm.providers.kvm import naming
from egress_kvm.providers.kvm.session import LIBVIRT_URI

from . import verdicts as v
from .images import probe_images
from .verdicts import PoolNeeds, Status, Verdict

CHECKS = ("ssh", "forwarding", "libvirt", "pool", "filter", "commands", "kvm", "bridge")
IMAGE_CHECK = "image"
FILTER_LIST_MAX = 16384  # REMOTE_NWFILTER_LIST_MAX


@dataclass(frozen=True)
class CheckResult:
    provider: str
    host: str | None  # None: a provider-wide check (an image URL)
    check: str
    status: Status
    detail: str

    @property
    def ok(self) -> bool | None:
        """True for PASS and WARN, False for FAIL, None for SKIP (an earlier check failed)."""
        return None if self.status is Status.SKIP else self.status is not Status.FAIL

    def line(self) -> str:
        where = f"{self.provider}/{self.host}" if self.host is not None else self.provider
        return f"{self.status.name} {where} {self.check}: {self.detail}"

    def as_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "host": self.host, "check": self.check,
                "status": self.status.value, "detail": self.detail}


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _version(n: int) -> str:
    return f"{n // 1_000_000}.{n // 1000 % 1000}.{n % 1000}"


@dataclass(frozen=True)
class _Exec:
    status: int | None
    stdout: str
    stderr: str


class _ExecRefused(Exception):
    """The host refuses command execution over SSH (or the channel failed)."""


async def _run(conn: asyncssh.SSHClientConnection, command: str, *, limit: float) -> _Exec:
    try:
        result = await asyncio.wait_for(conn.run(command, check=False), limit)
    except asyncssh.ChannelOpenError as exc:
        raise _ExecRefused(f"the host refuses command execution ({exc.reason})") from None
    except (TimeoutError, asyncssh.Error, OSError) as exc:
        raise _ExecRefused(f"running a command failed: {_describe(exc)}") from None
    return _Exec(result.exit_status, str(result.stdout or ""), str(result.stderr or ""))


async def check_host(provider: str, kvm: KvmConfig, host: HostConfig, *, time_limit: float = 15.0,
                     needs: PoolNeeds | None = None) -> list[CheckResult]:
    timeout = time_limit
    if needs is None:
        needs = PoolNeeds(base_bytes=None, base_label="", vms=1, disk_size_gb=kvm.disk_size_gb)
    results: dict[str, CheckResult] = {}

    def add(check: str, verdict: Verdict) -> None:
        results[check] = CheckResult(provider, host.name, check, verdict.status, verdict.detail)

    def skip(check: str, because: str) -> None:
        add(check, Verdict(Status.SKIP, f"skipped: {because}"))

    def ordered() -> list[CheckResult]:
        for name in CHECKS:
            if name not in results:
                skip(name, "ssh failed")
        return [results[name] for name in CHECKS]

    address, port = host.host_port
    known_hosts = None if kvm.insecure_ignore_host_key else kvm.known_hosts_file
    try:
        conn = await rpc.open_ssh(address, port, username=host.user, client_keys=[kvm.ssh_key_file],
                                  known_hosts=known_hosts, timeout=timeout, agent_path=None, config=None)
    except (rpc.ConnectFailed, OSError) as exc:
        add("ssh", v.ssh_verdict(v.classify_ssh_error(exc), address=address, port=port, user=host.user,
                                 key_file=kvm.ssh_key_file, known_hosts=known_hosts, reason=_describe(exc)))
        return ordered()
    key_note = "host key NOT verified (insecureIgnoreHostKey)" if known_hosts is None else \
        f"host key verified against {known_hosts}"
    add("ssh", v.passed(f"logged in as {host.user}@{host.address}, {key_note}"))
    try:
        await _check_libvirt(conn, kvm, host, add, skip, needs=needs, limit=timeout)
        await _check_exec(conn, kvm, host, add, skip, limit=timeout)
    finally:
        conn.close()
        with contextlib.suppress(Exception):
            await conn.wait_closed()
    return ordered()


async def _socket_facts(conn: asyncssh.SSHClientConnection, host: HostConfig, *,
                        limit: float) -> v.SocketFacts | None:
    path = host.socket
    try:
        got = await _run(conn, f"stat -L -c 'sock %U %G %a' {shlex.quote(path)} 2>/dev/null; "
                               f"echo \"groups $(id -nG)\"",
                         limit=limit)
    except _ExecRefused:
        return None
    return v.parse_socket_facts(got.stdout, path=path, user=host.user)


async def _check_libvirt(conn: asyncssh.SSHClientConnection, kvm: KvmConfig, host: HostConfig,
                         add: Callable[[str, Verdict], None], skip: Callable[[str, str], None], *,
                         needs: PoolNeeds, limit: float) -> None:
    timeout = limit
    try:
        _reader, writer = await asyncio.wait_for(conn.open_unix_connection(host.socket), timeout)
    except asyncssh.ChannelOpenError as exc:
        if exc.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED:  # an sshd that says so outright
            add("forwarding", v.forwarding_prohibited(host.user))
            skip("libvirt", "forwarding failed")
        else:
            facts = await _socket_facts(conn, host, limit=timeout)
            forwarding, libvirt = v.open_failed_verdicts(facts, user=host.user, path=host.socket,
                                                         reason=exc.reason)
            add("forwarding", forwarding)
            add("libvirt", libvirt)
        skip("pool", "libvirt failed")
        skip("filter", "libvirt failed")
        return
    except (TimeoutError, asyncssh.Error, OSError) as exc:
        add("forwarding", v.failed(f"opening {host.socket} through SSH failed: {_describe(exc)}"))
        skip("libvirt", "forwarding failed")
        skip("pool", "libvirt failed")
        skip("filter", "libvirt failed")
        return
    writer.close()
    add("forwarding", v.passed(f"stream-local forwarding to {host.socket} allowed"))

    try:
        client = await rpc.connect_over(conn, socket_path=host.socket, uri=LIBVIRT_URI, timeout=timeout,
                                        call_timeout=timeout)
    except (rpc.RpcError, OSError) as exc:
        add("libvirt", v.failed(f"libvirt handshake failed: {_describe(exc)}"))
        skip("pool", "libvirt failed")
        skip("filter", "libvirt failed")
        return
    try:
        # A link that dies or a daemon that stops answering mid-check is that check's FAIL (RpcError
        # covers ConnectionLost and DeadlineExceeded, which are not LibvirtError), not a traceback.
        try:
            lib = await client.connect_get_lib_version()
            hv = await client.connect_get_version()
        except (rpc.RpcError, OSError) as exc:
            add("libvirt", v.failed(f"libvirt did not answer its version: {_describe(exc)}"))
            skip("pool", "libvirt failed")
            skip("filter", "libvirt failed")
            return
        add("libvirt", v.passed(f"libvirt {_version(lib)}, hypervisor {_version(hv)} at {LIBVIRT_URI}"))
        add("pool", await _pool_verdict(client, host.pool, needs=needs))
        add("filter", await _filter_verdict(client, kvm.traffic_filter,
                                            static=host.static_addresses is not None))
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def _filter_verdict(client: Any, wanted: TrafficFilter, *, static: bool) -> Verdict:
    if wanted is TrafficFilter.NONE:
        return v.filter_verdict(wanted, v.FilterLookup.NOT_NEEDED)
    try:
        names = await client.connect_list_nwfilters(FILTER_LIST_MAX)
    except rpc.LibvirtError as exc:  # no nwfilter driver: "this function is not supported ..."
        return v.filter_verdict(wanted, v.FilterLookup.ERROR, reason=exc.message)
    except (rpc.RpcError, OSError) as exc:
        return v.failed(f"nwfilter {wanted.value!r}: libvirt did not answer: {_describe(exc)}")
    if wanted.value not in names:
        return v.filter_verdict(wanted, v.FilterLookup.MISSING)
    return v.filter_verdict(wanted, v.FilterLookup.FOUND, static=static)


async def _pool_verdict(client: Any, pool_name: str, *, needs: PoolNeeds) -> Verdict:
    try:
        pool = await client.storage_pool_lookup_by_name(pool_name)
        info = await client.storage_pool_get_info(pool)
    except rpc.NotFoundError:
        return v.pool_missing_verdict(pool_name)
    except rpc.LibvirtError as exc:
        return v.failed(f"storage pool {pool_name!r}: {exc.message}")
    except (rpc.RpcError, OSError) as exc:
        return v.failed(f"storage pool {pool_name!r}: libvirt did not answer: {_describe(exc)}")
    if needs.base_volume:
        # The provider's own name for the base volume; a base already imported takes no more room (any
        # failure to look counts the base: the cautious answer).
        with contextlib.suppress(rpc.RpcError, OSError):
            await client.storage_vol_lookup_by_name(pool, needs.base_volume)
            needs = dataclasses.replace(needs, base_cached=True)
    return v.pool_verdict(pool_name, state=info.state, capacity=info.capacity, available=info.available,
                          needs=needs)


async def _check_exec(conn: asyncssh.SSHClientConnection, kvm: KvmConfig, host: HostConfig,
                      add: Callable[[str, Verdict], None], skip: Callable[[str, str], None], *,
                      limit: float) -> None:
    timeout = limit
    # The provider's own command (addresses.py); the bridge name is validated: [A-Za-z0-9._-]
    neigh = f"ip -j neigh show dev {host.bridge}"
    try:
        got = await _run(conn, neigh, limit=timeout)
    except _ExecRefused as exc:
        add("commands", v.failed(f"{exc}: {host.user} must be able to run `ip` over SSH (the operator reads "
                                 f"the neighbour table while a VM's guest agent has no address yet)"))
        skip("kvm", "commands failed")
        skip("bridge", "commands failed")
        return
    add("commands", v.commands_verdict(exit_status=got.status, stderr=got.stderr, user=host.user,
                                       command=neigh))
    try:
        kvm_dev = await _run(conn, "test -c /dev/kvm", limit=timeout)
        add("kvm", v.kvm_verdict(domain_type=host.domain_type, has_kvm=kvm_dev.status == 0))
    except _ExecRefused as exc:
        add("kvm", v.failed(f"cannot check /dev/kvm: {exc}"))
    if got.status == 127:
        skip("bridge", "commands failed")
        return
    try:
        link = await _run(conn, f"ip -j -d link show dev {host.bridge}", limit=timeout)
    except _ExecRefused as exc:
        add("bridge", v.failed(f"cannot check: {exc}"))
        return
    if link.status != 0:
        add("bridge", v.missing_link_verdict(host.bridge, link.stderr))
        return
    try:
        entry = json.loads(link.stdout)[0]
        if not isinstance(entry, dict):
            raise ValueError(entry)
    except (ValueError, IndexError):
        add("bridge", v.failed(f"cannot read `ip -j -d link show dev {host.bridge}` output"))
        return
    add("bridge", v.link_verdict(host.bridge, entry))


def pool_needs(kvm: KvmConfig, sizes: dict[str, int | None], *, vms: int) -> PoolNeeds:
    """One base (the largest image whose size is known; else the first, uncounted) plus `vms` overlays."""
    known = {label: size for label, size in sizes.items() if size is not None}
    if known:
        label = max(known, key=lambda k: known[k])
        return PoolNeeds(base_bytes=known[label], base_label=label, vms=vms, disk_size_gb=kvm.disk_size_gb,
                         base_volume=_base_volume(kvm, label))
    label = next(iter(kvm.images), "")
    return PoolNeeds(base_bytes=None, base_label=label, vms=vms, disk_size_gb=kvm.disk_size_gb,
                     base_volume=_base_volume(kvm, label))


def _base_volume(kvm: KvmConfig, label: str) -> str:
    image = kvm.images.get(label)
    return naming.base_volume(key=label, url=image.url, sha256=image.sha256) if image is not None else ""


async def run_preflight(config: ProvidersConfig, *, provider: str | None = None, vms: int = 1,
                        emit: Callable[[CheckResult], None] | None = None,
                        time_limit: float = 15.0) -> list[CheckResult]:
    """Check every host of the kvm providers (or of `provider`); ConfigError for bad files or names."""
    entries = [(i, p) for i, p in enumerate(config.providers) if p.type == "kvm" and p.kvm is not None]
    if provider is not None:
        entries = [(i, p) for i, p in entries if p.name == provider]
        if not entries:
            known = ", ".join(p.name for p in config.providers) or "none"
            raise ConfigError(f"--provider {provider!r} is not in the providers config (known: {known})")
    results: list[CheckResult] = []
    image_policy = configured_image_policy(config.egress)  # the operator's, for its downloads

    def record(r: CheckResult) -> None:
        results.append(r)
        if emit is not None:
            emit(r)

    for index, entry in entries:
        assert entry.kvm is not None
        prefix = f"providers[{index}].kvm"
        try:
            check_kvm_files(entry.kvm, prefix=prefix)
        except ConfigError as exc:
            hint = v.key_file_hint(entry.kvm.ssh_key_file, flag="--ssh-key") if "sshKeyFile" in str(exc) \
                else v.key_file_hint(entry.kvm.known_hosts_file or "", flag="--known-hosts")
            raise ConfigError(f"{exc}{hint}") from None
        sizes: dict[str, int | None] = {}
        for label, (verdict, size) in (await probe_images(entry.kvm, policy=image_policy,
                                                             time_limit=time_limit)).items():
            sizes[label] = size
            record(CheckResult(entry.name, None, f"{IMAGE_CHECK} {label}", verdict.status, verdict.detail))
        needs = pool_needs(entry.kvm, sizes, vms=vms)
        for host in entry.kvm.hosts:
            try:
                host_results = await check_host(entry.name, entry.kvm, host, needs=needs)
            except Exception as exc:  # one host's unforeseen failure must not hide the other hosts
                host_results = [CheckResult(entry.name, host.name, "checks", Status.FAIL,
                                            f"preflight could not finish: {type(exc).__name__}: "
                                            f"{_describe(exc)}")]
            for r in host_results:
                record(r)
    return results
