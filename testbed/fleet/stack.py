"""The fleet's processes: N simulated hosts (a simulated lab), the API emulator and the operator.

Every piece is a real process reached the way production reaches it: the operator is `egress-kvm run`
(its own process, SIGKILLable and restartable), the emulator is `egress-kvm emulator`, and each host is
testbed/sim's daemon behind the lab's sshd. The base image is a tiny qcow2 served over HTTP from host0's
bridge (the simulator never boots it, so its size would only cost upload time). Processes are started
in their own session and stopped by PID; `close()` leaves nothing running but the lab, which `down()`
removes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from egress_kvm.operator.flags import parse_duration
from testbed import lab as labmod
from testbed.process import Process
from testbed.sim.control import AsyncSimControl

BIN = Path(sys.executable).parent
EGRESS_KVM = str(BIN / "egress-kvm")
REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "deploy" / "crd" / "egressproxies.io_proxies.yaml"
IMAGE_KEY = "fleet"
IMAGE_FILE = "fleet-base.qcow2"
GIB = 1024**3
#: A simulated host big enough for 100+ small VMs (512 MiB each, a 10 GiB thin overlay counted whole).
HOST_KNOBS: dict[str, Any] = {"memory_bytes": 256 * GIB, "pool_capacity_bytes": 16 * 1024 * GIB}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class StackConfig:
    hosts: int = 10
    boot_delay_s: float = 5.0
    rtt_ms: float = 0.0
    start_service_ms: float = 0.0  # a domain start's daemon-side time (the simulator's start_service_s)
    max_client_requests: int = 5  # each host's calls in service per connection (libvirtd's default)
    resync_period: str = "60s"
    gc_interval: str = "30s"
    gc_grace_period: str = "60s"
    workers: int | None = None  # --max-concurrent-reconciles; None: the operator's default
    log_level: str = "info"
    index: int = field(default_factory=lambda: int(os.environ.get("EGRESS_LAB_INDEX", "0")))

    @property
    def gc_seconds(self) -> float:
        """--gc-interval in seconds, read as the operator reads it."""
        return parse_duration(self.gc_interval)

    def knobs(self) -> dict[str, Any]:
        return {**HOST_KNOBS, "boot_delay_s": self.boot_delay_s, "rpc_latency_s": self.rtt_ms / 1000,
                "start_service_s": self.start_service_ms / 1000,
                "max_client_requests": self.max_client_requests, "fail_rate": 0.0, "drop_rate": 0.0,
                "frozen": False}


class FleetStack:
    def __init__(self, workdir: Path, config: StackConfig) -> None:
        self.workdir = workdir
        self.config = config
        self.lab: labmod.LabInfo | None = None
        self.emulator: Process | None = None
        self.api_url = ""
        self.kubeconfig = workdir / "kubeconfig"
        self.providers_file = workdir / "providers.yaml"
        self.operators: list[Process] = []
        self.metrics_port = free_port()

    # -- bring up / tear down -----------------------------------------------------------------------

    def start(self) -> None:
        """Lab (reused when healthy with the same host count), image, emulator with the CRD, operator."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lab = labmod.up(index=self.config.index, hosts=self.config.hosts, image=False, simulated=True,
                             knobs=self.config.knobs())
        if asyncio.run(self._dirty()):  # an earlier run's leftovers: a fresh lab is quicker than cleaning
            labmod.down(self.lab.state_dir)
            self.lab = labmod.up(index=self.config.index, hosts=self.config.hosts, image=False,
                                 simulated=True, knobs=self.config.knobs())
        self._write_providers()
        self._start_emulator()
        self.start_operator()

    def close(self) -> None:
        """Stop every process this stack started, each one even if stopping another failed."""
        errors: list[BaseException] = []
        for p in [*self.operators, *([self.emulator] if self.emulator is not None else [])]:
            try:
                p.stop()
            except Exception as exc:  # the others must still be stopped; the first is raised below
                errors.append(exc)
        if errors:
            raise errors[0]

    def down(self) -> None:
        """Remove the simulated lab (close() first)."""
        if self.lab is not None:
            labmod.down(self.lab.state_dir)

    def teardown(self, *, keep_lab: bool = False) -> None:
        """close(), then down() (unless keep_lab) even when close() failed: no process, no netns left."""
        try:
            self.close()
        finally:
            if not keep_lab:
                self.down()

    # -- the hosts --------------------------------------------------------------------------------

    @property
    def host_names(self) -> list[str]:
        assert self.lab is not None
        return [h.name for h in self.lab.hosts]

    def sim(self, host: str) -> AsyncSimControl:
        assert self.lab is not None
        return AsyncSimControl(self.lab.host(host).sim_control)

    async def set_knobs(self, hosts: list[str] | None = None, **knobs: Any) -> None:
        await asyncio.gather(*(self.sim(h).request("set", knobs=knobs) for h in hosts or self.host_names))

    async def host_states(self) -> dict[str, dict[str, Any]]:
        names = self.host_names
        states = await asyncio.gather(*(self.sim(h).request("state") for h in names))
        return dict(zip(names, states, strict=True))

    async def _dirty(self) -> list[str]:
        """Hosts that are not as a fresh lab's: killed, or holding domains or volumes (an earlier run's)."""
        return [n for n, st in (await self.host_states()).items()
                if st["killed"] or st["domains"] or st["volumes"]]

    # -- files --------------------------------------------------------------------------------------

    def _write_providers(self) -> None:
        """The lab's providers file plus a tiny base image served from host0's bridge (allowed by CIDR:
        the egress policy denies private addresses by default)."""
        assert self.lab is not None
        host0 = self.lab.hosts[0]
        www = Path(self.lab.state_dir) / host0.name / "www"
        image = www / IMAGE_FILE
        if not image.exists():
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "1G"], check=True)
        import hashlib

        digest = hashlib.sha256(image.read_bytes()).hexdigest()
        target = urlsplit(host0.http_target)
        url = f"http://{target.hostname}:{target.port}/{IMAGE_FILE}"
        doc = yaml.safe_load(Path(self.lab.providers_file).read_text())
        doc["egress"] = {"allowedCIDRs": [f"{target.hostname}/32:{target.port}"]}
        doc["providers"][0]["kvm"]["images"] = {IMAGE_KEY: {"url": url, "sha256": digest, "format": "qcow2"}}
        self.providers_file.write_text(yaml.safe_dump(doc, sort_keys=False))

    # -- processes ----------------------------------------------------------------------------------

    def _start_emulator(self) -> None:
        self.kubeconfig.unlink(missing_ok=True)
        log_path = self.workdir / "emulator.log"
        self.emulator = Process([EGRESS_KVM, "emulator", "--listen", "127.0.0.1:0", "--kubeconfig-out",
                                 str(self.kubeconfig)], log_path=log_path)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for line in log_path.read_text(errors="replace").splitlines():
                if line.startswith("emulator serving on "):
                    self.api_url = line.split()[-1]
            if self.api_url or not self.emulator.running():
                break
            time.sleep(0.1)
        if not self.api_url:
            raise RuntimeError("emulator did not start:\n" + log_path.read_text(errors="replace"))
        from testbed.fleet.kube import kubectl

        kubectl(self.kubeconfig, "apply", "-f", str(CRD))

    def operator_argv(self) -> list[str]:
        c = self.config
        argv = [EGRESS_KVM, "run", "--kubeconfig", str(self.kubeconfig), "--providers-config",
                str(self.providers_file), f"--zap-log-level={c.log_level}",
                "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
                "--health-probe-bind-address", "0",
                "--resync-period", c.resync_period, "--gc-interval", c.gc_interval,
                "--gc-grace-period", c.gc_grace_period]
        if c.workers is not None:
            argv += ["--max-concurrent-reconciles", str(c.workers)]
        return argv

    def start_operator(self) -> Process:
        n = len(self.operators) + 1
        op = Process(self.operator_argv(), log_path=self.workdir / f"operator-{n}.log")
        self.operators.append(op)
        return op

    @property
    def operator(self) -> Process:
        return self.operators[-1]

    def kill_operator(self) -> Process:
        """SIGKILL the operator and start a new one at once (as a Deployment's pod restarts)."""
        self.operator.kill()
        return self.start_operator()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"
