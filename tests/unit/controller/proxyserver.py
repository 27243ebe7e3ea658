"""A real HTTP forward proxy and a real target server on 127.0.0.x, for the health probes to go through.

`MiniProxy` speaks enough HTTP/1.1 proxying for a probe: an absolute-form GET, optional Basic
Proxy-Authorization (407 otherwise), the request forwarded to the target over a real connection and the
answer relayed. `stop()`/`start()` take it down and back on the same address, as a proxy restarting in
a VM would.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from urllib.parse import urlsplit

from aiohttp import web


class TargetServer:
    """The site fetched through the proxy (the lab's 10.231.1.1:8080 plays this role for real VMs)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.hits = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def ok(_request: web.Request) -> web.Response:
            self.hits += 1
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/{tail:.*}", ok)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/healthz"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class MiniProxy:
    def __init__(self, host: str = "127.0.0.1", *, username: str | None = None,
                 password: str | None = None) -> None:
        self.host = host
        self.port = 0
        self.requests = 0
        self.auth_seen: list[str | None] = []
        self._creds = (username, password) if username is not None else None
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for t in list(self._conns):
            t.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        self.requests += 1
        auth = headers.get("proxy-authorization")
        self.auth_seen.append(auth)
        if self._creds is not None:
            want = "Basic " + base64.b64encode(f"{self._creds[0]}:{self._creds[1]}".encode()).decode()
            if auth != want:
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                             b"Proxy-Authenticate: Basic realm=\"proxy\"\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
                await writer.drain()
                return
        if method != "GET" or not target.startswith("http://"):
            writer.write(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            return
        u = urlsplit(target)
        try:
            r, w = await asyncio.open_connection(u.hostname, u.port or 80)
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            return
        path = u.path or "/"
        w.write(f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode())
        await w.drain()
        answer = await r.read()
        w.close()
        writer.write(answer)
        await writer.drain()
