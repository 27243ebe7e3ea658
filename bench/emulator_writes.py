"""The API emulator's CPU per request, for the fleet benchmark's write mix (issue 8).

In `bench/fleet.py` the emulator shares the machine's 2 cores with the operator and the simulated hosts,
so every CPU second it spends lengthens the operator's ramp. This bench replays what the operator does
per Proxy, through the real aiohttp server and a real HTTP client, with the emulator alone in its own
process so its CPU can be read from /proc:

    create (POST) -> finalizer (PUT) -> GET -> status PUT x4 -> Event POST x3 -> delete (DELETE)
    -> finalizer removed (PUT, the object goes)

with `--watchers` cluster-wide watches on the Proxies (2 by default, as in the fleet bench: the operator's
informer and the bench's own) that read every event. The emulator's CPU (utime + stime of its process)
is read before and after the run, once the watchers have seen the last event, and reported per 1,000
requests and per Proxy.

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


async def one_proxy(c: Client, name: str) -> None:
    path = f"{BASE}/namespaces/default/proxies/{name}"
    obj = await c.call("POST", f"{BASE}/namespaces/default/proxies", proxy(name))
    obj["metadata"]["finalizers"] = ["egressproxies.io/finalizer"]
    obj = await c.call("PUT", path, obj)
    obj = await c.call("GET", path)
    for i, st in enumerate(statuses(name)):
        obj = await c.call("PUT", path + "/status", {**obj, "status": st})
        if i < 3:
            await c.call("POST", "/api/v1/namespaces/default/events", event(obj, i))


async def delete_proxy(c: Client, name: str) -> None:
    path = f"{BASE}/namespaces/default/proxies/{name}"
    await c.call("DELETE", path, ok=(200, 202))
    obj = await c.call("GET", path)
    obj["metadata"]["finalizers"] = []
    await c.call("PUT", path, obj)


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
    cpu_create: float
    cpu_delete: float

    @property
    def cpu(self) -> float:
        return self.cpu_create + self.cpu_delete


async def drive(url: str, pid: int, proxies: int, watchers: int, concurrency: int
                ) -> tuple[int, float, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency + watchers + 2)) as s:
        c = Client(s, url)
        await c.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                     yaml.safe_load(CRD.read_text()))
        seen = Seen()
        tasks = [asyncio.create_task(watcher(s, url, seen)) for _ in range(watchers)]
        await asyncio.sleep(0.3)
        names = [f"bench-{i:05d}" for i in range(proxies)]

        async def run(fn: Any, want_events: int) -> float:
            sem = asyncio.Semaphore(concurrency)

            async def one(n: str) -> None:
                async with sem:
                    await fn(c, n)

            before = cpu_seconds(pid)
            seen.expect(want_events * watchers)
            await asyncio.gather(*(one(n) for n in names))
            try:
                await asyncio.wait_for(seen.reached.wait(), 60)
            except TimeoutError:
                raise RuntimeError(f"watchers saw {seen.count} events, want {seen.want}") from None
            return cpu_seconds(pid) - before

        requests0 = c.requests
        cpu_create = await run(one_proxy, proxies * 6)  # ADDED, finalizer, 4 status
        cpu_delete = await run(delete_proxy, proxies * 8)  # + deletionTimestamp, DELETED
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return c.requests - requests0, cpu_create, cpu_delete


def run_tree(tree: Path, args: argparse.Namespace) -> Result:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=str(tree), stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        url, imported = child.stdout.readline().split()
        requests, cpu_create, cpu_delete = asyncio.run(
            drive(url, child.pid, args.proxies, args.watchers, args.concurrency))
        return Result(str(tree), imported, requests, args.proxies, cpu_create, cpu_delete)
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
            print(f"round {r + 1} {t}: {res.cpu:.2f} s CPU, {res.requests} requests "
                  f"(create {res.cpu_create:.2f} s, delete {res.cpu_delete:.2f} s)", flush=True)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average "
          f"{load}; {args.proxies} Proxies, {args.watchers} watcher(s), concurrency {args.concurrency}, "
          f"best of {args.rounds} rounds; spread = (worst - best) / best\n")
    print("| tree (imported from) | CPU ms per 1,000 requests | CPU ms per Proxy | create phase per Proxy "
          "| delete phase per Proxy |")
    print("|---|---|---|---|---|")
    best: dict[str, float] = {}
    for t, rs in results.items():
        b = min(rs, key=lambda x: x.cpu)
        spread = (max(x.cpu for x in rs) - b.cpu) / b.cpu if b.cpu else 0.0
        best[t] = b.cpu
        median = statistics.median(x.cpu for x in rs)
        print(f"| {t} ({Path(b.imported).parent}) | {b.cpu / b.requests * 1e6:.0f} | "
              f"{b.cpu / b.proxies * 1e3:.1f} (median {median / b.proxies * 1e3:.1f}, spread {spread:.0%}) | "
              f"{b.cpu_create / b.proxies * 1e3:.1f} | {b.cpu_delete / b.proxies * 1e3:.1f} |")
    if len(trees) > 1:
        first = str(trees[0])
        for t in list(best)[1:]:
            print(f"\n{t} vs {first}: {best[first] / best[t]:.2f}x less CPU (best vs best)")


if __name__ == "__main__":
    main()
