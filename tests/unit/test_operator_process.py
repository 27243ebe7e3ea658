"""`egress-kvm run` as a subprocess against the API emulator: start-up, probes, metrics, the controller
wired in, providers-file reloads, leader election between two processes, and SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncssh
import pytest
from kube.kube_emulator_fixtures import create_namespace, create_proxy, emulator_with_crd

from egress_kvm.kube.api import KubeApiClient
from egress_kvm.kube.interfaces import FINALIZER
from egress_kvm.kube.rest import request_json

pytestmark = pytest.mark.timeout(120)
EXE = str(Path(sys.executable).with_name("egress-kvm"))
LEASE = ("/apis/coordination.k8s.io/v1/namespaces/egress-proxies-operator-system/leases/"
         "egress-kvm.egressproxies.io")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProc:
    """One `egress-kvm run` subprocess; its JSON log lines are collected as they come."""

    def __init__(self, proc: asyncio.subprocess.Process, health: int, metrics: int) -> None:
        self.proc = proc
        self.health = health
        self.metrics = metrics
        self.lines: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._reader = asyncio.create_task(self._read())
        self._new = asyncio.Event()

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace").rstrip("\n")
            self.raw.append(text)
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(text))
            self._new.set()

    def logged(self, msg: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("msg") == msg]

    async def wait_log(self, msg: str, within: float = 30) -> dict[str, Any]:
        async with asyncio.timeout(within):
            while True:
                found = self.logged(msg)
                if found:
                    return found[0]
                if self.proc.returncode is not None and self._reader.done():
                    raise AssertionError(f"process exited ({self.proc.returncode}) before {msg!r}:\n"
                                         + "\n".join(self.raw[-30:]))
                self._new.clear()
                await self._new.wait()

    async def get(self, port: int, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
            return r.status, await r.text()

    async def terminate(self, within: float = 40) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(self.proc.wait(), within)
        await self._reader
        return rc

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        with contextlib.suppress(Exception):
            await self._reader


async def start_operator(kubeconfig: Path, providers: Path, *extra: str) -> OperatorProc:
    health, metrics = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    proc = await asyncio.create_subprocess_exec(
        EXE, f"--kubeconfig={kubeconfig}", f"--providers-config={providers}",
        f"--health-probe-bind-address=127.0.0.1:{health}", f"--metrics-bind-address=127.0.0.1:{metrics}",
        "--zap-log-level=debug", *extra,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env=env)
    return OperatorProc(proc, health, metrics)


@contextlib.asynccontextmanager
async def operators(tmp_path: Path, count: int = 1, *extra: str, providers_text: str = "providers: []\n",
                    ) -> AsyncIterator[tuple[Any, Any, list[OperatorProc]]]:
    providers = tmp_path / "providers.yaml"
    providers.write_text(providers_text)
    async with emulator_with_crd() as (emu, client):
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
        procs: list[OperatorProc] = []
        try:
            for _ in range(count):
                procs.append(await start_operator(kubeconfig, providers, *extra))
            yield emu, client, procs
        finally:
            for p in procs:
                await p.kill()


async def until(pred: Callable[[], Any], within: float = 30) -> Any:
    async with asyncio.timeout(within):
        while True:
            value = pred()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(0.1)


async def test_starts_serves_probes_and_metrics_reconciles_and_stops_on_sigterm(tmp_path: Path) -> None:
    async with operators(tmp_path) as (_emu, client, (op,)):
        await op.wait_log("controller started")

        async def ok(path: str) -> bool:
            return (await op.get(op.health, path))[0] == 200

        await until(lambda: ok("/readyz"))
        assert await ok("/healthz")
        status, body = await op.get(op.health, "/readyz?verbose")
        assert status == 200 and "[+]informer-synced ok" in body

        # The controller is wired to the informer: a Proxy naming a provider that is not configured
        # goes Failed with a message naming the value.
        await create_proxy(client, "p", provider="nope")
        kube = KubeApiClient(client)

        async def failed() -> dict[str, Any] | None:
            obj = await kube.get_proxy("default", "p")
            return obj if obj and (obj.get("status") or {}).get("phase") == "Failed" else None

        obj = await until(failed)
        assert "'nope'" in obj["status"]["message"]

        async def recorded() -> bool:  # Events are written in the background, after the status
            events = (await request_json(client, "GET", "/api/v1/namespaces/default/events"))["items"]
            return any(e["involvedObject"]["name"] == "p" and e["source"]["component"] == "egress-kvm"
                       for e in events)

        await until(recorded)

        status, metrics = await op.get(op.metrics, "/metrics")
        assert status == 200
        assert 'controller_runtime_reconcile_total{controller="proxy"' in metrics
        assert "workqueue_depth" in metrics
        assert "egress_kvm_libvirt_rpc_duration_seconds" in metrics
        # As a controller-runtime operator's: workqueue latency, the process collector, no _created noise;
        # and the Failed Proxy shows in the per-Proxy gauge.
        for series in ('workqueue_adds_total{controller="proxy",name="proxy"}',
                       'workqueue_queue_duration_seconds_bucket{controller="proxy",le="1e-08",name="proxy"}',
                       'controller_runtime_active_workers{controller="proxy"}',
                       "process_resident_memory_bytes ", "egress_kvm_build_info{",
                       'egress_kvm_proxy_condition{name="p",namespace="default",type="Ready"} 0.0'):
            assert series in metrics, series
        assert "_created" not in metrics

        assert await op.terminate() == 0
        assert op.logged("operator stopped")
        assert not any(line.get("level") == "error" for line in op.lines), [
            line for line in op.lines if line.get("level") == "error"]
        for line in op.lines:
            assert {"ts", "level", "logger", "msg"} <= set(line)
        # Every stderr line, not just those that happened to parse (other libraries' too: log.configure).
        assert len(op.lines) == len(op.raw), [t for t in op.raw if not t.startswith("{")]


async def test_a_bad_providers_file_stops_start_up_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "providers.yaml"
    bad.write_text("providers:\n  - name: kvm-home\n    type: kvm\n    kvm:\n      sshKeyFile: /x\n"
                   "      insecureIgnoreHostKey: true\n"
                   "      machineTypes: {small: {vcpus: 0, memoryMiB: 512}}\n"
                   "      hosts: [{name: h, address: '127.0.0.1:22', user: u, bridge: br0}]\n")
    op = await start_operator(tmp_path / "no-kubeconfig", bad)
    rc = await asyncio.wait_for(op.proc.wait(), 30)
    await op._reader
    assert rc != 0
    text = "\n".join(op.raw)
    assert str(bad) in text and "providers[0].kvm.machineTypes.small.vcpus" in text


async def test_a_missing_key_file_stops_start_up_naming_path_and_field(tmp_path: Path) -> None:
    cfg = tmp_path / "providers.yaml"
    cfg.write_text("providers:\n  - name: kvm-home\n    type: kvm\n    kvm:\n"
                   f"      sshKeyFile: {tmp_path}/missing_ed25519\n      insecureIgnoreHostKey: true\n"
                   "      machineTypes: {small: {vcpus: 1, memoryMiB: 512}}\n"
                   "      hosts: [{name: h, address: '127.0.0.1:22', user: u, bridge: br0}]\n")
    op = await start_operator(tmp_path / "no-kubeconfig", cfg)
    rc = await asyncio.wait_for(op.proc.wait(), 30)
    await op._reader
    assert rc != 0
    text = "\n".join(op.raw)
    assert "sshKeyFile" in text and f"{tmp_path}/missing_ed25519" in text


async def test_no_credentials_is_a_clear_start_up_error(tmp_path: Path) -> None:
    cfg = tmp_path / "providers.yaml"
    cfg.write_text("providers: []\n")
    op = await start_operator(tmp_path / "absent-kubeconfig", cfg)
    rc = await asyncio.wait_for(op.proc.wait(), 30)
    await op._reader
    assert rc != 0
    assert "absent-kubeconfig" in "\n".join(op.raw) and "does not exist" in "\n".join(op.raw)


async def test_providers_file_changes_are_picked_up_and_bad_edits_keep_the_old_ones(tmp_path: Path) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    (tmp_path / "id_ed25519").write_bytes(key.export_private_key())
    good = ("providers:\n  - name: kvm-home\n    type: kvm\n    kvm:\n"
            f"      sshKeyFile: {tmp_path}/id_ed25519\n      insecureIgnoreHostKey: true\n"
            "      machineTypes: {small: {vcpus: 1, memoryMiB: 512}}\n"
            "      hosts: [{name: h, address: '127.0.0.1:1', user: u, bridge: br0}]\n")
    async with operators(tmp_path, 1, "--providers-poll-interval=0.5") as (_emu, _client, (op,)):
        await op.wait_log("controller started")
        (tmp_path / "providers.yaml").write_text(good.replace("id_ed25519", "later_ed25519"))
        invalid = "providers config changed but is invalid; keeping the current providers"
        first = await op.wait_log(invalid)
        assert "later_ed25519" in first["error"] and "sshKeyFile" in first["error"]
        await asyncio.sleep(1.5)  # three more polls: retried, but the same problem is logged once
        assert len(op.logged(invalid)) == 1
        # The key appears after the file that names it (a Secret created after the ConfigMap edit):
        # the next poll picks the unchanged file up.
        (tmp_path / "later_ed25519").write_bytes(key.export_private_key())
        reloaded = await op.wait_log("providers config reloaded")
        assert reloaded["providers"] == ["kvm-home"]
        (tmp_path / "providers.yaml").write_text("providers: [{name: BAD NAME}]\n")
        await until(lambda: len(op.logged(invalid)) == 2)
        assert "providers[0]" in op.logged(invalid)[1]["error"]
        assert (await op.get(op.health, "/healthz"))[0] == 200
        assert await op.terminate() == 0


async def test_two_processes_one_leader_and_a_takeover_after_sigterm(tmp_path: Path) -> None:
    async with operators(tmp_path, 2, "--leader-elect") as (_emu, client, (a, b)):
        await create_namespace(client, "egress-proxies-operator-system")
        first = await until(lambda: a if a.logged("controller started") else
                            b if b.logged("controller started") else None)
        second = b if first is a else a
        await second.wait_log("attempting to acquire leader lease")
        # Both are ready (a standby keeps a warm cache) but only the leader runs the controller.
        for op in (a, b):
            await until(lambda op=op: op.get(op.health, "/readyz"))
        await asyncio.sleep(3)  # several retry periods: the standby must stay a standby
        assert not second.logged("controller started")
        holder = (await request_json(client, "GET", LEASE))["spec"]["holderIdentity"]
        assert holder == first.logged("successfully acquired lease")[0]["identity"]

        assert await first.terminate() == 0
        await second.wait_log("controller started", within=20)  # released lease: no 15 s expiry wait
        await create_proxy(client, "after-takeover", provider="nope")
        kube = KubeApiClient(client)

        async def failed() -> bool:
            obj = await kube.get_proxy("default", "after-takeover")
            return bool(obj and (obj.get("status") or {}).get("phase") == "Failed")

        await until(failed)
        assert await second.terminate() == 0


async def test_sigterm_mid_reconcile_abandons_the_stuck_call_and_exits_cleanly(tmp_path: Path) -> None:
    # A "hypervisor" that accepts the SSH connection and then says nothing: the reconcile hangs inside
    # the provider (until asyncssh's own 20 s timeout) when SIGTERM arrives.
    connected = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def black_hole(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        connected.set()

    server = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    key = asyncssh.generate_private_key("ssh-ed25519")
    (tmp_path / "id_ed25519").write_bytes(key.export_private_key())
    providers = ("providers:\n  - name: kvm-home\n    type: kvm\n    kvm:\n"
                 f"      sshKeyFile: {tmp_path}/id_ed25519\n      insecureIgnoreHostKey: true\n"
                 "      images: {deb: {url: 'http://127.0.0.1:9/deb.qcow2'}}\n"
                 "      machineTypes: {small: {vcpus: 1, memoryMiB: 512}}\n"
                 f"      hosts: [{{name: h, address: '127.0.0.1:{port}', user: u, bridge: br0}}]\n")
    try:
        async with operators(tmp_path, 1, "--graceful-shutdown-timeout=1s",
                             providers_text=providers) as (_emu, client, (op,)):
            await op.wait_log("controller started")
            await create_proxy(client, "stuck", placement={"machineType": "small", "image": "deb"},
                               cloudInit={"userData": "#cloud-config\n"})
            await asyncio.wait_for(connected.wait(), 30)

            # The host's event watch dials it at start, so a connection alone does not say the reconcile
            # is in the provider yet: wait for its worker too (it then hangs on the silent host).
            async def reconcile_in_flight() -> bool:
                _, text = await op.get(op.metrics, "/metrics")
                return re.search(r"^controller_runtime_active_workers\{[^}]*\} 1\.0$", text, re.M) is not None

            await until(reconcile_in_flight)
            assert await op.terminate(within=15) == 0
            stopping = op.logged("controller stopping")[0]
            assert stopping["inFlight"] == 1
            assert op.logged("reconciles abandoned at shutdown")
            assert op.logged("operator stopped")
            obj = await KubeApiClient(client).get_proxy("default", "stuck")
            # Abandoned safely: the finalizer is on (a later delete still cleans up whatever the next
            # reconcile finds) and the phase never claimed more than what happened.
            assert obj is not None and FINALIZER in obj["metadata"]["finalizers"]
            assert (obj.get("status") or {}).get("phase") in (None, "Pending", "Provisioning")
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


async def test_start_up_waits_for_an_api_server_that_is_not_up_yet(tmp_path: Path) -> None:
    from testbed.emulator import Emulator

    providers = tmp_path / "providers.yaml"
    providers.write_text("providers: []\n")
    emu = Emulator(port=free_port())
    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
    op = await start_operator(kubeconfig, providers)
    try:
        await op.wait_log("reading the cluster id failed, retrying")  # connection refused: not final
        await emu.start()
        try:
            await op.wait_log("controller started")
            assert await op.terminate() == 0
        finally:
            await emu.stop()
    finally:
        await op.kill()
