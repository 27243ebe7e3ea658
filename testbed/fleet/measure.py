"""What the fleet counts, read where it happens: the operator's own /metrics (libvirt RPCs by method,
reconciles), /proc for its memory and CPU, the emulator's request counts by writer (API writes as they
land), and each simulated host's call count (RPCs as they land, whatever the operator thinks it sent).

A `Sample` is one reading of all of these; the difference of two samples is a window's counts.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

BENCH_AGENT = "fleet-bench"  # the User-Agent product of testbed/fleet/kube.py's requests
NOT_OPERATOR = frozenset({BENCH_AGENT, "kubectl"})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class ProcStat:
    rss_bytes: int = 0
    peak_rss_bytes: int = 0  # VmHWM: the kernel's high-water mark for this process
    cpu_seconds: float = 0.0


def proc_stat(pid: int) -> ProcStat:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ProcStat()
    kb = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in status.splitlines()
          if line.startswith(("VmRSS:", "VmHWM:"))}
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15 of stat)
    return ProcStat(rss_bytes=kb.get("VmRSS", 0), peak_rss_bytes=kb.get("VmHWM", 0), cpu_seconds=cpu)


@dataclass(frozen=True)
class MachineCpu:
    """The machine's CPU time from /proc/stat's `cpu` line, in ticks: this machine is a VM on a shared
    hypervisor, and the time the hypervisor gave to others (steal) moves a run's timings as much as any
    change does, so the bench prints it beside them."""

    busy: int = 0  # user, nice, system, irq, softirq
    idle: int = 0  # idle, iowait
    steal: int = 0

    def minus(self, before: MachineCpu) -> MachineCpu:
        return MachineCpu(self.busy - before.busy, self.idle - before.idle, self.steal - before.steal)

    def shares(self) -> tuple[float, float]:
        """(busy, stolen) as fractions of all the CPU time that passed; (0, 0) if none did."""
        total = self.busy + self.idle + self.steal
        return (self.busy / total, self.steal / total) if total else (0.0, 0.0)


def machine_cpu(stat_text: str) -> MachineCpu:
    """/proc/stat's aggregate `cpu` line (fields: user nice system idle iowait irq softirq steal ...)."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            padded = (fields[1:9] + ["0"] * 8)[:8]  # an old kernel's line lacks the later columns
            user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in padded)
            return MachineCpu(busy=user + nice + system + irq + softirq, idle=idle + iowait, steal=steal)
    return MachineCpu()


def read_machine_cpu() -> MachineCpu:
    try:
        return machine_cpu(Path("/proc/stat").read_text())
    except OSError:
        return MachineCpu()


@dataclass
class Sample:
    rpc_by_method: Counter[str] = field(default_factory=Counter)  # operator's egress_kvm_libvirt_rpc_*
    reconciles: int = 0
    api_writes: Counter[str] = field(default_factory=Counter)  # "PUT proxies/status", ... by the operator
    api_reads: Counter[str] = field(default_factory=Counter)
    sim_calls: int = 0  # every call the simulated daemons answered (or failed)
    proc: ProcStat = field(default_factory=ProcStat)
    machine: MachineCpu = field(default_factory=MachineCpu)

    def minus(self, before: Sample) -> Sample:
        return Sample(rpc_by_method=self.rpc_by_method - before.rpc_by_method,
                      reconciles=self.reconciles - before.reconciles,
                      api_writes=self.api_writes - before.api_writes,
                      api_reads=self.api_reads - before.api_reads,
                      sim_calls=self.sim_calls - before.sim_calls,
                      proc=ProcStat(self.proc.rss_bytes, self.proc.peak_rss_bytes,
                                    self.proc.cpu_seconds - before.proc.cpu_seconds),
                      machine=self.machine.minus(before.machine))

    @property
    def rpcs(self) -> int:
        return sum(self.rpc_by_method.values())

    @property
    def writes(self) -> int:
        return sum(self.api_writes.values())


def parse_metrics(text: str) -> tuple[Counter[str], int]:
    """RPC counts by method and the reconcile total, from the operator's Prometheus text."""
    rpcs: Counter[str] = Counter()
    reconciles = 0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "egress_kvm_libvirt_rpc_duration_seconds_count":
                rpcs[s.labels["method"]] += int(s.value)
            elif s.name == "controller_runtime_reconcile_total":
                reconciles += int(s.value)
    return rpcs, reconciles


def parse_requests(body: dict[str, Any]) -> tuple[Counter[str], Counter[str]]:
    """The emulator's /debug/requests without the bench's own and kubectl's rows (the operator's writes
    carry its fieldManager, `egress-kvm`; its reads only kubernetes-asyncio's User-Agent): writes and
    reads by verb and resource."""
    writes: Counter[str] = Counter()
    reads: Counter[str] = Counter()
    for row in body["requests"]:
        if row["agent"] in NOT_OPERATOR:
            continue
        key = f"{row['method']}{' watch' if row['watch'] else ''} {row['resource']}" + \
              (f"/{row['subresource']}" if row["subresource"] else "")
        (writes if row["method"] in WRITE_METHODS else reads)[key] += row["count"]
    return writes, reads


async def sample(session: aiohttp.ClientSession, *, metrics_url: str, api_url: str, operator_pid: int,
                 host_states: dict[str, dict[str, Any]]) -> Sample:
    s = Sample(proc=proc_stat(operator_pid), sim_calls=sum(st["calls"] for st in host_states.values()),
               machine=read_machine_cpu())
    try:
        async with session.get(metrics_url) as resp:
            s.rpc_by_method, s.reconciles = parse_metrics(await resp.text())
    except aiohttp.ClientError:
        pass  # an operator that is restarting has no metrics yet: counts read as zero
    async with session.get(f"{api_url}/debug/requests") as resp:
        s.api_writes, s.api_reads = parse_requests(await resp.json())
    return s


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * p // 100)))
    return ordered[int(rank) - 1]
