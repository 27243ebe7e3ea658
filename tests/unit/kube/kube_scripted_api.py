"""A scripted Proxy list/watch endpoint (real HTTP on loopback) for the informer's fault cases.

The API emulator is the faithful server; this one exists for what a faithful server does only by
accident: a stream that goes silent, HTTP 410 at connect, a connection cut mid-line, a line of megabytes
split across many writes. Each watch request takes the next plan from `plans`; a plan is an async
function that writes to the open stream (or returns a status to answer with instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from egress_kvm.kube.interfaces import GROUP, KIND, PLURAL, VERSION

Plan = Callable[["WatchStream"], Awaitable[int | None]]


def proxy(name: str, rv: int, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv),
                         "uid": f"uid-{namespace}-{name}"},
            "spec": {"mode": "Managed", "provider": "kvm-home", **spec}}


@dataclass
class WatchStream:
    response: web.StreamResponse
    query: dict[str, str]

    async def send(self, type_: str, obj: dict[str, Any]) -> None:
        await self.response.write(json.dumps({"type": type_, "object": obj}).encode() + b"\n")

    async def send_raw(self, data: bytes) -> None:
        await self.response.write(data)

    async def bookmark(self, rv: int) -> None:
        await self.send("BOOKMARK", {"kind": KIND, "apiVersion": f"{GROUP}/{VERSION}",
                                     "metadata": {"resourceVersion": str(rv)}})

    async def gone(self) -> None:
        await self.send("ERROR", {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "message": "too old resource version", "reason": "Expired", "code": 410})


async def hang(stream: WatchStream) -> int | None:
    """Keep the stream open and silent until the client goes away."""
    await asyncio.sleep(3600)
    return None


@dataclass
class ScriptedApi:
    items: list[dict[str, Any]] = field(default_factory=list)
    list_rv: int = 100
    plans: list[Plan] = field(default_factory=list)
    list_status: list[int] = field(default_factory=list)  # statuses to answer lists with first
    # (items, resourceVersion) for the 2nd, 3rd, ... list: what changed while the client was away
    later_lists: list[tuple[list[dict[str, Any]], int]] = field(default_factory=list)
    lists: int = 0
    watch_queries: list[dict[str, str]] = field(default_factory=list)
    list_queries: list[dict[str, str]] = field(default_factory=list)
    paginate: bool = False  # honour `limit`/`continue` as the API server does
    url: str = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        if query.get("watch", "").lower() in ("true", "1"):
            self.watch_queries.append(query)
            plan = self.plans.pop(0) if self.plans else hang
            response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            status = getattr(plan, "status", None)
            if status is not None:
                return web.json_response({"kind": "Status", "apiVersion": "v1", "code": status,
                                          "reason": "Expired", "message": "too old"}, status=status)
            await response.prepare(request)
            stream = WatchStream(response, query)
            with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
                await plan(stream)
            return response
        self.list_queries.append(query)
        if self.paginate and "limit" in query:
            start = int(query.get("continue") or 0)
            end = start + int(query["limit"])
            meta: dict[str, Any] = {"resourceVersion": str(self.list_rv)}
            if end < len(self.items):
                meta["continue"] = str(end)
            return web.json_response({"apiVersion": f"{GROUP}/{VERSION}", "kind": f"{KIND}List",
                                      "metadata": meta, "items": self.items[start:end]})
        self.lists += 1
        if self.lists > 1 and self.later_lists:
            self.items, self.list_rv = self.later_lists.pop(0)
        if self.list_status:
            status = self.list_status.pop(0)
            return web.json_response({"kind": "Status", "code": status, "message": "scripted"}, status=status)
        return web.json_response({"apiVersion": f"{GROUP}/{VERSION}", "kind": f"{KIND}List",
                                  "metadata": {"resourceVersion": str(self.list_rv)},
                                  "items": self.items})

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ScriptedApi]:
        app = web.Application()
        app.router.add_get(f"/apis/{GROUP}/{VERSION}/{PLURAL}", self._handle)
        app.router.add_get(f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}", self._handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        try:
            yield self
        finally:
            await runner.cleanup()


def status_plan(status: int) -> Plan:
    """A plan that answers the watch request itself with an HTTP error status."""

    async def plan(stream: WatchStream) -> int | None:
        return status

    plan.status = status  # type: ignore[attr-defined]
    return plan
