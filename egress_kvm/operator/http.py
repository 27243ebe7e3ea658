"""The process's two small HTTP servers: health probes and Prometheus metrics.

Separate listeners (as controller-runtime has) so a NetworkPolicy or a Service can expose /metrics to
a scraper without exposing the probes, and so a slow scrape never delays a kubelet probe.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .flags import BindAddress

Check = Callable[[], str | None]  # None: ok; otherwise the reason it is not


def _probe(checks: dict[str, Check]) -> Callable[[web.Request], web.Response]:
    async def handler(request: web.Request) -> web.Response:
        failures = {name: reason for name, check in checks.items() if (reason := check()) is not None}
        verbose = "verbose" in request.query
        if failures:
            text = "".join(f"[-]{name} failed: {reason}\n" for name, reason in failures.items())
            return web.Response(status=500, text=text + f"{request.path} check failed\n")
        if verbose:
            text = "".join(f"[+]{name} ok\n" for name in checks)
            return web.Response(text=text + f"{request.path} check passed\n")
        return web.Response(text="ok")

    return handler  # type: ignore[return-value]


class HttpServer:
    """One aiohttp listener; `bound` holds the address after start (useful with port 0)."""

    def __init__(self, app: web.Application, address: BindAddress) -> None:
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        self._address = address
        self.bound: tuple[str, int] | None = None

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, host=self._address.host, port=self._address.port,
                           reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            host, port = sockets[0].getsockname()[:2]
            self.bound = (host, port)

    async def close(self) -> None:
        await self._runner.cleanup()


def health_app(*, healthz: dict[str, Check], readyz: dict[str, Check]) -> web.Application:
    app = web.Application()
    app.router.add_get("/healthz", _probe(healthz))
    app.router.add_get("/readyz", _probe(readyz))
    return app


def metrics_app(registry: CollectorRegistry) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app
