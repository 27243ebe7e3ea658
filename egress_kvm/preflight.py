"""Preflight: the spec's "check from the operator's point of view", done by the operator's own code.

For every host of every kvm provider (or one provider): SSH login with the configured key and host-key
verification; that sshd allows stream-local forwarding (a hardened sshd may forbid it, and the operator
reaches libvirt only that way); libvirt reachable through the forwarded socket (its version); the storage
pool present, active and with free space; the bridge present (and a bridge) via `ip` over SSH exec.
One result per check with a reason; a check that cannot run because an earlier one failed is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import asyncssh

import rpc
from egress_kvm.config import ConfigError, ProvidersConfig, check_kvm_files
from egress_kvm.config.models import HostConfig, KvmConfig
from egress_kvm.providers.kvm.capacity import fmt_bytes
from egress_kvm.providers.kvm.session import LIBVIRT_URI
from rpc.constants import StoragePoolState

CHECKS = ("ssh", "forwarding", "libvirt", "pool", "bridge")


@dataclass(frozen=True)
class CheckResult:
    provider: str
    host: str
    check: str
    ok: bool | None  # None: skipped, an earlier check failed
    detail: str

    def line(self) -> str:
        status = "PASS" if self.ok else ("SKIP" if self.ok is None else "FAIL")
        return f"{status} {self.provider}/{self.host} {self.check}: {self.detail}"


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _version(v: int) -> str:
    return f"{v // 1_000_000}.{v // 1000 % 1000}.{v % 1000}"


async def check_host(provider: str, kvm: KvmConfig, host: HostConfig, *,
                     time_limit: float = 15.0) -> list[CheckResult]:
    timeout = time_limit
    results: list[CheckResult] = []

    def add(check: str, ok: bool | None, detail: str) -> None:
        results.append(CheckResult(provider, host.name, check, ok, detail))

    def skip_rest(after: str) -> list[CheckResult]:
        for name in CHECKS[CHECKS.index(after) + 1:]:
            add(name, None, f"skipped: {after} failed")
        return results

    address, port = host.host_port
    known_hosts = None if kvm.insecure_ignore_host_key else kvm.known_hosts_file
    try:
        conn = await rpc.open_ssh(address, port, username=host.user, client_keys=[kvm.ssh_key_file],
                                  known_hosts=known_hosts, timeout=timeout, agent_path=None, config=None)
    except rpc.HostKeyRejected as exc:
        add("ssh", False, f"host key not accepted: {exc}")
        return skip_rest("ssh")
    except (rpc.ConnectFailed, OSError) as exc:
        add("ssh", False, str(exc))
        return skip_rest("ssh")
    key_note = "host key NOT verified (insecureIgnoreHostKey)" if known_hosts is None else \
        f"host key verified against {known_hosts}"
    add("ssh", True, f"logged in as {host.user}@{host.address}, {key_note}")
    try:
        try:
            _reader, writer = await asyncio.wait_for(conn.open_unix_connection(host.socket), timeout)
        except asyncssh.ChannelOpenError as exc:
            if exc.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED:
                add("forwarding", False, f"sshd refuses stream-local forwarding ({exc.reason}); set "
                                         f"AllowStreamLocalForwarding yes for user {host.user}")
            else:
                add("forwarding", False, f"cannot open libvirt socket {host.socket} through SSH: "
                                         f"{exc.reason} (is libvirtd running, may {host.user} open it?)")
            return skip_rest("forwarding")
        except (TimeoutError, asyncssh.Error, OSError) as exc:
            add("forwarding", False, f"opening {host.socket} through SSH failed: {exc}")
            return skip_rest("forwarding")
        writer.close()
        add("forwarding", True, f"stream-local forwarding to {host.socket} allowed")

        try:
            client = await rpc.connect_over(conn, socket_path=host.socket, uri=LIBVIRT_URI, timeout=timeout,
                                            call_timeout=timeout)
        except (rpc.RpcError, OSError) as exc:
            add("libvirt", False, f"libvirt handshake failed: {exc}")
            return skip_rest("libvirt")
        try:
            # A link that dies or a daemon that stops answering mid-check is that check's FAIL (RpcError
            # covers ConnectionLost and DeadlineExceeded, which are not LibvirtError), not a traceback.
            try:
                lib = await client.connect_get_lib_version()
                hv = await client.connect_get_version()
            except (rpc.RpcError, OSError) as exc:
                add("libvirt", False, f"libvirt did not answer its version: {_describe(exc)}")
                return skip_rest("libvirt")
            add("libvirt", True, f"libvirt {_version(lib)}, hypervisor {_version(hv)} at {LIBVIRT_URI}")
            try:
                pool = await client.storage_pool_lookup_by_name(host.pool)
                info = await client.storage_pool_get_info(pool)
            except rpc.NotFoundError:
                add("pool", False, f"storage pool {host.pool!r} does not exist "
                                   f"(virsh pool-define-as {host.pool} dir --target /var/lib/libvirt/images)")
            except rpc.LibvirtError as exc:
                add("pool", False, f"storage pool {host.pool!r}: {exc.message}")
            except (rpc.RpcError, OSError) as exc:
                add("pool", False, f"storage pool {host.pool!r}: libvirt did not answer: {_describe(exc)}")
            else:
                if info.state != StoragePoolState.RUNNING:
                    known = info.state in StoragePoolState._value2member_map_
                    state = StoragePoolState(info.state).name.lower() if known else str(info.state)
                    add("pool", False, f"storage pool {host.pool!r} is {state}, not active "
                                       f"(virsh pool-start {host.pool})")
                elif info.available <= 0:
                    add("pool", False, f"storage pool {host.pool!r} has no free space "
                                       f"(capacity {fmt_bytes(info.capacity)})")
                else:
                    add("pool", True, f"storage pool {host.pool!r} active, {fmt_bytes(info.available)} free "
                                      f"of {fmt_bytes(info.capacity)}")
        finally:
            with contextlib.suppress(Exception):
                await client.close()

        await _check_bridge(conn, host, add, time_limit=timeout)
    finally:
        conn.close()
        with contextlib.suppress(Exception):
            await conn.wait_closed()
    return results


async def _check_bridge(conn: asyncssh.SSHClientConnection, host: HostConfig,
                        add: Callable[[str, bool | None, str], None], *, time_limit: float) -> None:
    timeout = time_limit
    command = f"ip -j -d link show dev {host.bridge}"  # bridge name validated: [A-Za-z0-9._-]
    try:
        result = await asyncio.wait_for(conn.run(command, check=False), timeout)
    except asyncssh.ChannelOpenError as exc:
        add("bridge", False, f"cannot check: the host refuses command execution ({exc.reason}); the "
                             f"SSH user must be able to run `ip`")
        return
    except (TimeoutError, asyncssh.Error, OSError) as exc:
        add("bridge", False, f"cannot check: running `ip` failed: {exc}")
        return
    if result.exit_status == 127:
        add("bridge", False, f"cannot check: `ip` is not on {host.user}'s PATH on the host")
        return
    if result.exit_status != 0:
        err = str(result.stderr or "").strip()
        add("bridge", False, f"bridge {host.bridge!r} not found on the host: {err}")
        return
    try:
        links = json.loads(str(result.stdout))
        kind = links[0].get("linkinfo", {}).get("info_kind", "")
        state = links[0].get("operstate", "")
    except (ValueError, IndexError, AttributeError):
        kind, state = "", ""
    if kind and kind != "bridge":
        add("bridge", False, f"{host.bridge!r} exists but is a {kind} device, not a bridge")
        return
    add("bridge", True, f"bridge {host.bridge!r} present (state {state or 'unknown'})")


async def run_preflight(config: ProvidersConfig, *, provider: str | None = None,
                        emit: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Check every host of the kvm providers (or of `provider`); ConfigError for bad files or names."""
    entries = [(i, p) for i, p in enumerate(config.providers) if p.type == "kvm" and p.kvm is not None]
    if provider is not None:
        entries = [(i, p) for i, p in entries if p.name == provider]
        if not entries:
            known = ", ".join(p.name for p in config.providers) or "none"
            raise ConfigError(f"--provider {provider!r} is not in the providers config (known: {known})")
    results: list[CheckResult] = []
    for index, entry in entries:
        assert entry.kvm is not None
        check_kvm_files(entry.kvm, prefix=f"providers[{index}].kvm")
        for host in entry.kvm.hosts:
            try:
                host_results = await check_host(entry.name, entry.kvm, host)
            except Exception as exc:  # one host's unforeseen failure must not hide the other hosts
                host_results = [CheckResult(entry.name, host.name, "checks", False,
                                            f"preflight could not finish: {type(exc).__name__}: "
                                            f"{_describe(exc)}")]
            for r in host_results:
                results.append(r)
                if emit is not None:
                    emit(r)
    return results
