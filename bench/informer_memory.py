"""RSS of the operator's Proxy cache at 5,000 Proxies with 64 KiB of inline user-data each (issue 13 item 6).

A local HTTP server on loopback plays the API server's Proxy list (paginated with limit/continue, as the
real one is) and an idle watch; each round runs `ProxyInformer` in a fresh child process until its first
list is stored, then reports the child's resident set (VmRSS, after a GC) and its peak (VmHWM). Two sides
alternate, rounds interleaved so machine noise hits both alike:

- **now**: the informer as shipped (every page trimmed before the next is read, egress_kvm/kube/trim.py);
- **reference**: the informer before (whole objects kept, the list read in one response).

Each Proxy carries `spec.cloudInit.userData` of 64 KiB and, by default, kubectl's last-applied annotation
(which repeats the spec), since `kubectl apply` is how Proxies are usually made. Run:

    .venv/bin/python bench/informer_memory.py [--proxies 5000] [--user-data-kib 64] [--rounds 2]
                                              [--no-last-applied]

The Deployment's memory limit is 384 MiB (deploy/); the target is to stay well under it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
GROUP, VERSION, PLURAL, KIND = "egressproxies.io", "v1alpha1", "proxies", "Proxy"
LIMIT_MIB = 384


def proxy(i: int, *, user_data: str, last_applied: bool) -> dict[str, Any]:
    spec = {"mode": "Managed", "provider": "kvm-home", "port": 3128,
            "placement": {"zone": "nas1", "machineType": "small", "image": "debian-13"},
            "cloudInit": {"userData": user_data}}
    meta: dict[str, Any] = {"name": f"px{i:05d}", "namespace": "tenants", "uid": f"uid-{i:05d}",
                            "resourceVersion": str(1000 + i), "generation": 1}
    if last_applied:
        meta["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": meta["name"]},
             "spec": spec})}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": meta, "spec": spec,
            "status": {"phase": "Ready", "ip": "10.0.0.1", "instance": {"name": f"proxy-{i:020d}",
                                                                     "zone": "nas1"}}}


async def serve(n: int, user_data: str, last_applied: bool) -> tuple[web.AppRunner, str]:
    async def handle(req: web.Request) -> web.StreamResponse:
        if req.query.get("watch") in ("true", "1"):
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(req)
            await asyncio.sleep(3600)
            return resp
        start = int(req.query.get("continue") or 0)
        end = min(n, start + int(req.query.get("limit") or n))
        meta: dict[str, Any] = {"resourceVersion": "99999"}
        if end < n:
            meta["continue"] = str(end)
        items = [proxy(i, user_data=user_data, last_applied=last_applied) for i in range(start, end)]
        body = json.dumps({"apiVersion": f"{GROUP}/{VERSION}", "kind": f"{KIND}List", "metadata": meta,
                           "items": items})
        return web.Response(text=body, content_type="application/json")

    app = web.Application(client_max_size=1 << 30)
    app.router.add_get(f"/apis/{GROUP}/{VERSION}/{PLURAL}", handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


async def child(url: str, side: str) -> None:
    from kubernetes_asyncio.client import ApiClient, Configuration

    from egress_kvm.kube import informer as informer_mod

    page_size = 100
    if side == "reference":
        informer_mod.trimmed = lambda obj: obj  # type: ignore[assignment]  # whole objects, as before
        page_size = 10**9  # one response, as before
    gc.collect()
    baseline = status_kib("VmRSS")
    async with ApiClient(Configuration(host=url)) as client:
        inf = informer_mod.ProxyInformer(client, namespace=None, on_event=lambda kind, obj: None,
                                         page_size=page_size, request_timeout=900.0)
        task = asyncio.create_task(inf.run())
        started = time.monotonic()
        while not inf.has_synced():  # noqa: ASYNC110 - the informer offers no event to wait on
            await asyncio.sleep(0.05)
        took = time.monotonic() - started
        gc.collect()
        rss, peak = status_kib("VmRSS"), status_kib("VmHWM")
        print(json.dumps({"side": side, "proxies": len(inf.keys()), "baseline_kib": baseline,
                          "rss_kib": rss, "peak_kib": peak, "seconds": round(took, 2)}))
        inf.stop()
        task.cancel()


async def main(args: argparse.Namespace) -> None:
    user_data = "#cloud-config\n" + "x" * (args.user_data_kib * 1024 - 14)
    runner, url = await serve(args.proxies, user_data, not args.no_last_applied)
    results: dict[str, list[dict[str, Any]]] = {"now": [], "reference": []}
    try:
        for _ in range(args.rounds):
            for side in ("now", "reference"):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--child", url, side, cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=asyncio.subprocess.PIPE)
                out, _ = await proc.communicate()
                if proc.returncode != 0:
                    raise SystemExit(f"{side} round failed (exit {proc.returncode})")
                results[side].append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        await runner.cleanup()
    print(f"{args.proxies} Proxies, {args.user_data_kib} KiB userData each, last-applied annotation: "
          f"{not args.no_last_applied}; {args.rounds} alternating rounds; best (min) and spread")
    print("| side | RSS after sync (MiB) | peak RSS (MiB) | process before the informer (MiB) "
          "| list time (s) |")
    print("|---|---|---|---|---|")
    best: dict[str, dict[str, float]] = {}
    for side, runs in results.items():
        rss = [r["rss_kib"] / 1024 for r in runs]
        peak = [r["peak_kib"] / 1024 for r in runs]
        base = [r["baseline_kib"] / 1024 for r in runs]
        secs = [r["seconds"] for r in runs]
        assert all(r["proxies"] == args.proxies for r in runs)
        best[side] = {"rss": min(rss), "peak": min(peak)}
        def spread(v):
            return (f" (spread {max(v) - min(v):.1f})" if len(v) > 1 else "")
        print(f"| {side} | {min(rss):.1f}{spread(rss)} | {min(peak):.1f}{spread(peak)} | "
              f"{statistics.median(base):.1f} | {min(secs):.1f} |")
    print(f"ratio now/reference: RSS {best['now']['rss'] / best['reference']['rss']:.2f}x, "
          f"peak {best['now']['peak'] / best['reference']['peak']:.2f}x; "
          f"limit {LIMIT_MIB} MiB: now peaks at {100 * best['now']['peak'] / LIMIT_MIB:.0f}% of it")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        asyncio.run(child(sys.argv[2], sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxies", type=int, default=5000)
    parser.add_argument("--user-data-kib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-last-applied", action="store_true")
    asyncio.run(main(parser.parse_args()))
