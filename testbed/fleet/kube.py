"""The fleet's Kubernetes side: Proxies created and deleted over the API, and a watch that records when
each became Ready and when each was gone.

Bulk writes go straight to the API (aiohttp, a bounded number in flight) rather than through kubectl:
`kubectl apply -f` of 1,000 objects is 2,000 sequential requests and would measure kubectl. The watch
timestamps every Proxy's first Ready on this process's monotonic clock, the same clock the creates are
stamped with, so a Proxy's time to Ready is exact to the event's arrival (status times in the API are
whole seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from testbed.fleet.measure import BENCH_AGENT

GROUP, VERSION, PLURAL = "egressproxies.io", "v1alpha1", "proxies"
NAMESPACE = "default"
USER_DATA = "#cloud-config\n# egress-kvm fleet bench: the simulated guest serves its proxy on Port 3128\n"


def kubectl(kubeconfig: Path, *args: str) -> str:
    path = shutil.which("kubectl") or str(Path(sys.executable).parent / "kubectl")
    out = subprocess.run([path, *args], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    if out.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def proxy_doc(name: str, *, zone: str, target: str, interval_s: int, image: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "mode": "Managed", "provider": "lab",
            "placement": {"zone": zone, "machineType": "small", "image": image},
            "port": 3128,
            "cloudInit": {"userData": USER_DATA},
            "healthCheck": {"url": target, "intervalSeconds": interval_s, "timeoutSeconds": 5},
        },
    }


@dataclass
class ProxyView:
    """What the watch last saw of one Proxy."""

    phase: str = ""
    ready: bool = False
    instance: str = ""
    zone: str = ""
    previous: str = ""
    previous_zone: str = ""
    message: str = ""

    @classmethod
    def of(cls, obj: dict[str, Any]) -> ProxyView:
        st = obj.get("status") or {}
        healthy = any(c.get("type") == "Healthy" and c.get("status") == "True"
                      for c in st.get("conditions", []))
        inst, prev = st.get("instance") or {}, st.get("previousInstance") or {}
        return cls(phase=st.get("phase", ""), ready=st.get("phase") == "Ready" and healthy,
                   instance=inst.get("name", ""), zone=inst.get("zone", ""), previous=prev.get("name", ""),
                   previous_zone=prev.get("zone", ""), message=st.get("message", ""))


@dataclass
class Recorder:
    """Proxies as the watch sees them, with the monotonic time of each one's first Ready, of the first
    sight of each phase it went through (where its time went) and of its end."""

    views: dict[str, ProxyView] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)
    first_ready: dict[str, float] = field(default_factory=dict)
    first_phase: dict[str, dict[str, float]] = field(default_factory=dict)
    gone: dict[str, float] = field(default_factory=dict)
    events: int = 0

    def seen(self, kind: str, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        self.events += 1
        if kind == "DELETED":
            self.views.pop(name, None)
            self.gone.setdefault(name, now)
            return
        view = self.views[name] = ProxyView.of(obj)
        if view.phase:
            self.first_phase.setdefault(name, {}).setdefault(view.phase, now)
        if view.ready:
            self.first_ready.setdefault(name, now)

    def stage(self, name: str, start: str, end: str) -> float | None:
        """Seconds from the first sight of phase `start` ("" for the POST's return) to the first of `end`
        ("Ready" is the first Ready with Healthy=True); None if either was not seen."""
        phases = self.first_phase.get(name, {})
        t0 = self.created.get(name) if start == "" else phases.get(start)
        t1 = self.first_ready.get(name) if end == "Ready" else phases.get(end)
        return None if t0 is None or t1 is None else t1 - t0

    def ready_count(self, names: set[str] | None = None) -> int:
        return sum(1 for n, v in self.views.items() if v.ready and (names is None or n in names))


class FleetKube:
    """Proxies over the API server's REST interface (the emulator's URL, no credentials)."""

    def __init__(self, api_url: str, *, in_flight: int = 32) -> None:
        self.base = f"{api_url}/apis/{GROUP}/{VERSION}"
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
                                             headers={"User-Agent": f"{BENCH_AGENT}/1"})
        self.limit = asyncio.Semaphore(in_flight)
        self.recorder = Recorder()
        self._watch: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.session.close()

    def _url(self, name: str = "") -> str:
        return f"{self.base}/namespaces/{NAMESPACE}/{PLURAL}" + (f"/{name}" if name else "")

    async def create(self, doc: dict[str, Any]) -> None:
        async with self.limit:
            async with self.session.post(self._url(), json=doc) as resp:
                if resp.status not in (200, 201):
                    raise RuntimeError(f"create {doc['metadata']['name']}: {resp.status} {await resp.text()}")
            self.recorder.created[doc["metadata"]["name"]] = time.monotonic()

    async def delete(self, name: str) -> None:
        async with self.limit, self.session.delete(self._url(name)) as resp:
            if resp.status not in (200, 202, 404):
                raise RuntimeError(f"delete {name}: {resp.status} {await resp.text()}")

    async def create_all(self, docs: list[dict[str, Any]]) -> None:
        await asyncio.gather(*(self.create(d) for d in docs))

    async def delete_all(self, names: list[str]) -> None:
        await asyncio.gather(*(self.delete(n) for n in names))

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        async with self.session.get(self._url()) as resp:
            body = await resp.json()
        return body.get("items", []), body["metadata"]["resourceVersion"]

    def start_watch(self) -> None:
        self._watch = asyncio.get_running_loop().create_task(self._watch_loop(), name="fleet-watch")

    async def _watch_loop(self) -> None:
        """List, then watch from the list's version; after any end of the stream, list and watch again
        (a relist reconciles what was missed: objects absent from it are recorded gone)."""
        while True:
            try:
                items, rv = await self.list()
                now = time.monotonic()
                listed = {o["metadata"]["name"] for o in items}
                for name in list(self.recorder.views):
                    if name not in listed:
                        self.recorder.seen("DELETED", {"metadata": {"name": name}}, now)
                for obj in items:
                    self.recorder.seen("MODIFIED", obj, now)
                params = {"watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "true"}
                async with self.session.get(self._url(), params=params) as resp:
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        ev = json.loads(line)
                        if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            self.recorder.seen(ev["type"], ev["object"], time.monotonic())
                        elif ev["type"] == "ERROR":
                            break
            except (TimeoutError, aiohttp.ClientError, ValueError):
                await asyncio.sleep(0.5)

    async def wait(self, predicate: Callable[[], bool], *, within: float, interval: float = 0.5) -> bool:
        """Until predicate() is true (True) or `within` seconds pass (False)."""
        deadline = time.monotonic() + within
        while not predicate():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(interval)
        return True
