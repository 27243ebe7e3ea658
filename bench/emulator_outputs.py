"""Every answer and watch line of the API emulator for a fixed request mix, compared between source trees.

The emulator's CPU work (bench/emulator_writes.py) may change only how it computes, never what it
sends. This replays, over HTTP with a fixed clock and fixed uids, the operator's per-Proxy requests plus
what else touches the shared paths (a no-op status write, another manager's write, dry runs, merge and
JSON patches, server-side applies with a conflict and a force, a status apply, stale and managedFields-
resetting PUTs, Tables and metadata-only GETs, lists, deletes held by a finalizer), with four watches
open (plain, label-selected, Table, Events), and records every status code and body byte and every watch
line. With two or more `--tree`s it runs each in its own process (that tree first on PYTHONPATH) and
says whether the records are identical, else shows the first difference:

    mkdir /tmp/emu-base && git archive main | tar -x -C /tmp/emu-base
    .venv/bin/python bench/emulator_outputs.py --tree /tmp/emu-base --tree .
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml

sys.path.insert(1, str(Path(__file__).resolve().parent))
import emulator_writes as ew


def record() -> None:
    """In the child: replay the mix against this process's emulator, print the record."""
    import testbed.emulator.api as apimod
    from testbed.emulator import Emulator

    print(apimod.__file__, file=sys.stderr)
    ctr = itertools.count()
    apimod.uuid.uuid4 = lambda: uuid.UUID(int=next(ctr))  # type: ignore[attr-defined]
    random.seed(1)
    asyncio.run(_main(Emulator))


BASE = ew.BASE
PX = f"{BASE}/namespaces/default/proxies"
TABLE = {"Accept": "application/json;as=Table;g=meta.k8s.io;v=v1"}
PARTIAL = {"Accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}
out: list[str] = []


async def watch(s: aiohttp.ClientSession, url: str, params: dict[str, str], tag: str,
                headers: dict[str, str] | None = None) -> None:
    async with s.get(url, params=params, headers=headers or {},
                     timeout=aiohttp.ClientTimeout(total=None)) as r:
        async for line in r.content:
            if b'"BOOKMARK"' not in line:
                out.append(f"W{tag} {line.decode().rstrip()}")


class Caller:
    def __init__(self, s: aiohttp.ClientSession, url: str) -> None:
        self.s, self.url = s, url

    async def __call__(self, method: str, path: str, body: Any = None, params: Any = None,
                       headers: Any = None, raw: str | None = None) -> Any:
        kw: dict[str, Any] = {"data": raw} if raw is not None else {"json": body} if body is not None else {}
        async with self.s.request(method, self.url + path, params=params, headers=headers or {}, **kw) as r:
            b = await r.read()
            out.append(f"{method} {path} {params} -> {r.status} {b.decode()}")
            try:
                return json.loads(b)
            except ValueError:
                return None


async def one(call: Caller, i: int) -> None:
    fm = {"fieldManager": "egress-kvm"}
    name = f"p{i}"
    path = f"{PX}/{name}"
    obj = await call("POST", PX, ew.proxy(name), fm)
    obj["metadata"]["finalizers"] = ["egressproxies.io/finalizer"]
    if i % 2:
        obj["metadata"]["labels"]["sel"] = "yes"
    obj = await call("PUT", path, obj, fm)
    obj = await call("GET", path)
    for j, st in enumerate(ew.statuses(name)):
        obj = await call("PUT", path + "/status", {**obj, "status": st}, fm)
        if j < 3:
            await call("POST", "/api/v1/namespaces/default/events", ew.event(obj, j), fm)
    obj = await call("PUT", path + "/status", obj, fm)  # the same status again: a no-op
    st = dict(obj["status"], message="other")
    obj = await call("PUT", path + "/status", {**obj, "status": st}, {"fieldManager": "other"})
    dry = {"fieldManager": "dry", "dryRun": "All"}
    await call("PUT", path, {**obj, "spec": {**obj["spec"], "port": 9}}, dry)
    await call("POST", PX, ew.proxy(name + "x"), dry)
    label = {"metadata": {"labels": {"sel": "no" if i % 2 else "yes"}}}  # leaves or enters the selection
    await call("PATCH", path, label, {"fieldManager": "kubectl-label"},
               {"Content-Type": "application/merge-patch+json"})
    await call("PATCH", path, [{"op": "replace", "path": "/spec/port", "value": 3129}], None,
               {"Content-Type": "application/json-patch+json", "User-Agent": "kubectl/v1.31"})
    applied = {"apiVersion": "egressproxies.io/v1alpha1", "kind": "Proxy",
               "metadata": {"name": name, "annotations": {"a": "b"}}, "spec": {"port": 3130}}
    for _ in range(2):
        await call("PATCH", path, raw=json.dumps(applied), params={"fieldManager": "applier"}, headers=APPLY)
    applied2 = {**applied, "metadata": {"name": name}, "spec": {"port": 3131}}
    await call("PATCH", path, raw=json.dumps(applied2), params={"fieldManager": "applier2"}, headers=APPLY)
    await call("PATCH", path, raw=json.dumps(applied2), params={"fieldManager": "applier2", "force": "true"},
               headers=APPLY)
    status_applied = {**applied2, "spec": None, "status": {"message": "applied"}}
    await call("PATCH", path + "/status", raw=json.dumps(status_applied), params={"fieldManager": "sapplier"},
               headers=APPLY)
    obj = await call("GET", path)
    await call("GET", path, headers=TABLE)
    await call("GET", path, headers=PARTIAL)
    await call("PUT", path, {**obj, "metadata": {**obj["metadata"], "resourceVersion": "1"}}, fm)  # stale
    obj = await call("GET", path)
    obj["metadata"]["managedFields"] = [{}]  # a reset
    await call("PUT", path, obj, {"fieldManager": "resetter"})


async def _main(Emulator: Any) -> None:
    async with Emulator.running(host="127.0.0.1", port=0, bookmark_interval=100) as emu:
        # long before now: a Table's Age (from the real clock) reads the same in every run of a day
        emu.api._clock = lambda: datetime(2026, 1, 1, tzinfo=UTC)
        url = emu.url
        async with aiohttp.ClientSession() as s:
            call = Caller(s, url)
            await call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                       yaml.safe_load(ew.CRD.read_text()))
            every = {"watch": "1", "resourceVersion": "0"}
            ws = [asyncio.create_task(watch(s, url + BASE + "/proxies", every, "all")),
                  asyncio.create_task(watch(s, url + BASE + "/proxies", {**every, "labelSelector": "sel=yes"},
                                            "sel")),
                  asyncio.create_task(watch(s, url + PX, every, "table", TABLE)),
                  asyncio.create_task(watch(s, url + "/api/v1/events", every, "events"))]
            await asyncio.sleep(0.3)
            for i in range(6):
                await one(call, i)
            await call("GET", f"{BASE}/proxies")
            await call("GET", f"{BASE}/proxies", params={"labelSelector": "sel=yes"})
            for i in range(6):
                path = f"{PX}/p{i}"
                await call("DELETE", path)
                obj = await call("GET", path)
                obj["metadata"]["finalizers"] = []
                await call("PUT", path, obj, {"fieldManager": "egress-kvm"})
                await call("GET", path)
            await asyncio.sleep(0.5)
            for t in ws:
                t.cancel()
            await asyncio.gather(*ws, return_exceptions=True)
    # each watch's lines in its order (the watches themselves interleave as they are scheduled)
    answers = [line for line in out if not line.startswith("W")]
    lines = sorted((line for line in out if line.startswith("W")), key=lambda line: line.split(" ", 1)[0])
    sys.stdout.write("\n".join(answers + lines) + "\n")

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", type=Path, required=True, help="source trees to compare")
    p.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    outs = []
    for tree in args.tree:
        env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
        run = subprocess.run([sys.executable, __file__, "--record", "--tree", str(tree)], env=env,
                             capture_output=True, text=True, check=True)
        outs.append(run.stdout.splitlines())
        print(f"{tree}: {len(outs[-1])} answers and watch lines ({run.stderr.strip()})")
    for tree, lines in zip(args.tree[1:], outs[1:], strict=True):
        if lines == outs[0]:
            print(f"{tree}: identical to {args.tree[0]}")
            continue
        at = next((n for n, (a, b) in enumerate(zip(outs[0], lines, strict=False)) if a != b),
                  min(len(lines), len(outs[0])))
        print(f"{tree}: differs from {args.tree[0]} at line {at + 1}:\n< {outs[0][at:at + 1]}\n"
              f"> {lines[at:at + 1]}")
        sys.exit(1)


if __name__ == "__main__":
    if "--record" in sys.argv:
        record()
    else:
        main()
