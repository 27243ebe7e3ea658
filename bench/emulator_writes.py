"""The API emulator's CPU per request, for the fleet benchmark's write mix (issue 8).

In `bench/fleet.py` the emulator shares the machine's 2 cores with the operator and the simulated hosts,
so every CPU second it spends lengthens the operator's ramp. This bench replays what the operator does
per Proxy, through the real aiohttp server and a real HTTP client, with the emulator alone in its own
process so its CPU can be read from /proc:

    create (POST) -> finalizer (PUT) -> GET -> status PUT x4 -> Event POST x3 -> delete (DELETE)
    -> finalizer removed (PUT, the object goes)

with `--watchers` cluster-wide watches on the Proxies (2 by default, as in the fleet bench: the operator's
informer and the bench's own) that read every event. Each step runs for every Proxy before the next
(`--concurrency` requests in flight), and the emulator's CPU (utime + stime of its process) is read before
the step and after it, once the watchers have seen the events it made: reported per request of each step
(a status PUT's includes encoding its watch event for both watchers), per 1,000 requests and per Proxy.

To compare two source trees in one run (e.g. main's, from a detached worktree), name them with
`--tree`; the runs alternate between trees and each row shows the best run and the spread
((worst - best) / best):

    git worktree add --detach /tmp/emu-base main
    .venv/bin/python bench/emulator_writes.py --tree /tmp/emu-base --tree . [--proxies 400] [--rounds 3]

Each tree is put first on the emulator process's PYTHONPATH (its testbed/ and egress_kvm/ are imported
from there; the child prints the file it imported, shown in the report).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "deploy" / "crd" / "egressproxies.io_proxies.yaml"
BASE = "/apis/egressproxies.io/v1alpha1"
MANAGER = "egress-kvm"

CHILD = """
import asyncio, sys
import testbed.emulator
from testbed.emulator import Emulator

async def main():
    async with Emulator.running(host="127.0.0.1", port=0, bookmark_interval=10.0) as emu:
        print(emu.url, testbed.emulator.__file__, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proxy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "egressproxies.io/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "default", "labels": {"bench": "emulator-writes"}},
        "spec": {
            "mode": "Managed",
            "provider": "kvm-home",
            "placement": {"zone": "nas1", "machineType": "small", "image": "debian-13"},
            "port": 3128,
            "cloudInit": {"userData": "#cloud-config\npackages: [tinyproxy]\n"},
        },
    }


def statuses(name: str) -> list[dict[str, Any]]:
    """The operator's status progression for one Proxy (docs/crd.md): Provisioning, Running, Ready."""
    t0, t1, t2 = "2026-12-01T20:00:00Z", "2026-12-01T20:00:05Z", "2026-12-01T20:00:07Z"
    inst = {"name": f"egress-{name}", "zone": "nas1", "provider": "kvm-home"}
    host = {"type": "HostReachable", "status": "True", "reason": "Connected", "message": "ok",
            "lastTransitionTime": t0, "observedGeneration": 1}

    def ready(status: str, reason: str, t: str) -> dict[str, Any]:
        return {"type": "Ready", "status": status, "reason": reason, "message": reason,
                "lastTransitionTime": t, "observedGeneration": 1}

    return [
        {"phase": "Provisioning", "observedGeneration": 1, "instance": inst, "message": "creating the VM",
         "conditions": [ready("False", "Provisioning", t0), host]},
        {"phase": "Running", "observedGeneration": 1, "instance": inst, "ip": "127.1.0.5",
         "endpoint": "http://127.1.0.5:3128", "message": "waiting for the probes",
         "conditions": [ready("False", "Probing", t1), host]},
        {"phase": "Running", "observedGeneration": 1, "instance": inst, "ip": "127.1.0.5",
         "endpoint": "http://127.1.0.5:3128", "message": "waiting for the probes", "healthy": False,
         "lastProbeTime": t1,
         "conditions": [ready("False", "Probing", t1), host,
                        {"type": "Healthy", "status": "False", "reason": "ProbeFailed", "message": "1/2",
                         "lastTransitionTime": t1, "observedGeneration": 1}]},
        {"phase": "Ready", "observedGeneration": 1, "instance": inst, "ip": "127.1.0.5",
         "endpoint": "http://127.1.0.5:3128", "message": "", "healthy": True, "lastProbeTime": t2,
         "conditions": [ready("True", "Healthy", t2), host,
                        {"type": "Healthy", "status": "True", "reason": "ProbeSucceeded", "message": "2/2",
                         "lastTransitionTime": t2, "observedGeneration": 1}]},
    ]


def event(obj: dict[str, Any], i: int) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{i:x}", "namespace": "default"},
        "involvedObject": {"apiVersion": obj["apiVersion"], "kind": "Proxy", "name": meta["name"],
                           "namespace": "default", "uid": meta["uid"],
                           "resourceVersion": meta["resourceVersion"]},
        "reason": ["Creating", "Created", "Ready"][i % 3], "message": "bench event", "type": "Normal",
        "count": 1, "firstTimestamp": "2026-12-01T20:00:00Z", "lastTimestamp": "2026-12-01T20:00:00Z",
        "source": {"component": "egress-kvm"}, "reportingComponent": "egress-kvm",
    }


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url, self.requests = session, url, 0

    async def call(self, method: str, path: str, body: Any = None, *, ok: tuple[int, ...] = (200, 201)
                   ) -> Any:
        self.requests += 1
        params = {"fieldManager": MANAGER} if method in ("POST", "PUT") else None
        async with self.session.request(method, self.url + path, json=body, params=params) as resp:
            data = await resp.json(content_type=None)
            if resp.status not in ok:
                raise RuntimeError(f"{method} {path}: {resp.status} {data}")
            return data


STEPS = ("create POST", "finalizer PUT", "GET", "status PUT", "Event POST", "DELETE", "GET (deleting)",
         "finalizer removal PUT")


async def steps(c: Client, name: str, objs: dict[str, Any], step: str, i: int = 0) -> None:
    """One request of `step` for Proxy `name` (`i`: which status, which Event); `objs` holds each Proxy's
    last answer, which the next step starts from, as the operator's next write starts from what it read."""
    path = f"{BASE}/namespaces/default/proxies/{name}"
    if step == "create POST":
        objs[name] = await c.call("POST", f"{BASE}/namespaces/default/proxies", proxy(name))
    elif step == "finalizer PUT":
        obj = objs[name]
        obj["metadata"]["finalizers"] = ["egressproxies.io/finalizer"]
        objs[name] = await c.call("PUT", path, obj)
    elif step in ("GET", "GET (deleting)"):
        objs[name] = await c.call("GET", path)
    elif step == "status PUT":
        objs[name] = await c.call("PUT", path + "/status", {**objs[name], "status": statuses(name)[i]})
    elif step == "Event POST":
        await c.call("POST", "/api/v1/namespaces/default/events", event(objs[name], i))
    elif step == "DELETE":
        await c.call("DELETE", path, ok=(200, 202))
    elif step == "finalizer removal PUT":
        obj = objs[name]
        obj["metadata"]["finalizers"] = []
        await c.call("PUT", path, obj)


# Per Proxy, in the operator's order: (step, index, watch events it makes on Proxies).
SEQUENCE = [("create POST", 0, 1), ("finalizer PUT", 0, 1), ("GET", 0, 0)]
for _i in range(4):
    SEQUENCE.append(("status PUT", _i, 1))
    if _i < 3:
        SEQUENCE.append(("Event POST", _i, 0))
SEQUENCE += [("DELETE", 0, 1), ("GET (deleting)", 0, 0), ("finalizer removal PUT", 0, 1)]
DELETE_PHASE = ("DELETE", "GET (deleting)", "finalizer removal PUT")


class Seen:
    """Events the watchers read, and a wake-up once they reach `want`."""

    def __init__(self) -> None:
        self.count, self.want, self.reached = 0, 0, asyncio.Event()

    def expect(self, want: int) -> None:
        self.want = want
        self.reached.clear()
        if self.count >= want:
            self.reached.set()

    def add(self) -> None:
        self.count += 1
        if self.count >= self.want:
            self.reached.set()


async def watcher(session: aiohttp.ClientSession, url: str, seen: Seen) -> None:
    async with session.get(url + f"{BASE}/proxies", params={"watch": "true", "resourceVersion": "0",
                                                            "allowWatchBookmarks": "true"},
                           timeout=aiohttp.ClientTimeout(total=None)) as resp:
        async for line in resp.content:
            if json.loads(line)["type"] != "BOOKMARK":
                seen.add()


@dataclass
class Result:
    tree: str
    imported: str
    requests: int
    proxies: int
    cpu: dict[str, float]  # CPU seconds per step (all its requests)
    counts: dict[str, int]  # requests per step

    @property
    def total(self) -> float:
        return sum(self.cpu.values())

    @property
    def cpu_create(self) -> float:
        return sum(v for k, v in self.cpu.items() if k not in DELETE_PHASE)

    @property
    def cpu_delete(self) -> float:
        return sum(v for k, v in self.cpu.items() if k in DELETE_PHASE)

    def per_request(self, step: str) -> float:
        return self.cpu[step] / self.counts[step] if self.counts[step] else 0.0


async def drive(url: str, pid: int, proxies: int, watchers: int, concurrency: int
                ) -> tuple[int, dict[str, float], dict[str, int]]:
    """Each step of SEQUENCE for every Proxy (`concurrency` in flight), measured on its own: the emulator's
    CPU from before the step's first request until the watchers have read the events it made."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency + watchers + 2)) as s:
        c = Client(s, url)
        await c.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                     yaml.safe_load(CRD.read_text()))
        seen = Seen()
        tasks = [asyncio.create_task(watcher(s, url, seen)) for _ in range(watchers)]
        await asyncio.sleep(0.3)
        names = [f"bench-{i:05d}" for i in range(proxies)]
        objs: dict[str, Any] = {}
        cpu = dict.fromkeys(STEPS, 0.0)
        counts = dict.fromkeys(STEPS, 0)
        requests0 = c.requests
        expected = 0
        for step, i, events in SEQUENCE:
            async def one(n: str, step: str = step, i: int = i,
                          sem: asyncio.Semaphore = asyncio.Semaphore(concurrency)) -> None:
                async with sem:
                    await steps(c, n, objs, step, i)

            expected += events * proxies * watchers
            before = cpu_seconds(pid)
            seen.expect(expected)
            await asyncio.gather(*(one(n) for n in names))
            try:
                await asyncio.wait_for(seen.reached.wait(), 60)
            except TimeoutError:
                raise RuntimeError(f"watchers saw {seen.count} events, want {seen.want}") from None
            cpu[step] += cpu_seconds(pid) - before
            counts[step] += proxies
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return c.requests - requests0, cpu, counts


def run_tree(tree: Path, args: argparse.Namespace) -> Result:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=str(tree), stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        url, imported = child.stdout.readline().split()
        requests, cpu, counts = asyncio.run(drive(url, child.pid, args.proxies, args.watchers,
                                                  args.concurrency))
        return Result(str(tree), imported, requests, args.proxies, cpu, counts)
    finally:
        child.terminate()
        child.wait(timeout=10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", type=Path, help="source tree(s) to compare (default: this one)")
    p.add_argument("--proxies", type=int, default=400)
    p.add_argument("--watchers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    results: dict[str, list[Result]] = {str(t): [] for t in trees}
    for r in range(args.rounds):
        for t in trees:
            res = run_tree(t, args)
            results[str(t)].append(res)
            print(f"round {r + 1} {t}: {res.total:.2f} s CPU, {res.requests} requests "
                  f"(create phase {res.cpu_create:.2f} s, delete phase {res.cpu_delete:.2f} s)", flush=True)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average "
          f"{load}; {args.proxies} Proxies, {args.watchers} watcher(s), concurrency {args.concurrency}, "
          f"best of {args.rounds} rounds; spread = (worst - best) / best\n")
    print("| tree (imported from) | CPU ms per 1,000 requests | CPU ms per Proxy | create phase per Proxy "
          "| delete phase per Proxy |")
    print("|---|---|---|---|---|")
    best: dict[str, Result] = {}
    for t, rs in results.items():
        b = min(rs, key=lambda x: x.total)
        spread = (max(x.total for x in rs) - b.total) / b.total if b.total else 0.0
        best[t] = b
        median = statistics.median(x.total for x in rs)
        per_proxy = (f"{b.total / b.proxies * 1e3:.1f} (median {median / b.proxies * 1e3:.1f}, "
                     f"spread {spread:.0%})")
        print(f"| {t} ({Path(b.imported).parent}) | {b.total / b.requests * 1e6:.0f} | {per_proxy} | "
              f"{b.cpu_create / b.proxies * 1e3:.1f} | {b.cpu_delete / b.proxies * 1e3:.1f} |")
    print("\nCPU us per request, by step (best of the rounds for each step; spread over the rounds):\n")
    print("| step | " + " | ".join(Path(t).name for t in results) + " |")
    print("|---" * (len(results) + 1) + "|")
    for step in STEPS:
        cells = []
        for rs in results.values():
            per = [x.per_request(step) for x in rs]
            lo = min(per)
            cells.append(f"{lo * 1e6:.0f} (spread {(max(per) - lo) / lo:.0%})" if lo else "-")
        print(f"| {step} | " + " | ".join(cells) + " |")
    if len(trees) > 1:
        first = str(trees[0])
        for t in list(best)[1:]:
            print(f"\n{t} vs {first}: {best[first].total / best[t].total:.2f}x less CPU (best vs best)")
            for step in STEPS:
                a = min(x.per_request(step) for x in results[first])
                b2 = min(x.per_request(step) for x in results[t])
                if a and b2:
                    print(f"  {step}: {a / b2:.2f}x")


if __name__ == "__main__":
    main()
