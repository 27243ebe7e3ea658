"""The HTTP forward proxy a simulated guest serves on its address: CONNECT tunnels and absolute-URI
requests, one request per connection. Enough for the operator's real health probes and for a test's
request through a Proxy; not a general-purpose proxy."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

HEAD_LIMIT = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _refuse(writer: asyncio.StreamWriter, status: str) -> None:
    writer.write(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
    with contextlib.suppress(Exception):
        await writer.drain()
        writer.close()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        writer.close()
        return
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError:
        await _refuse(writer, "400 Bad Request")
        return
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        path_line = None
    else:
        url = urlsplit(target)
        if url.scheme != "http" or not url.hostname:
            await _refuse(writer, "400 Bad Request")
            return
        host, port = url.hostname, str(url.port or 80)
        path_line = f"{method} {url.path or '/'}{'?' + url.query if url.query else ''} {version}"
    try:
        opening = asyncio.open_connection(host.strip("[]"), int(port))
        up_reader, up_writer = await asyncio.wait_for(opening, 10)
    except (OSError, ValueError, TimeoutError):
        await _refuse(writer, "502 Bad Gateway")
        return
    if path_line is None:
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    else:
        kept = [h for h in lines[1:] if h and not h.lower().startswith(("proxy-", "connection:"))]
        up_writer.write(("\r\n".join([path_line, *kept, "Connection: close", "", ""])).encode("latin-1"))
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def serve(host: str, port: int) -> asyncio.Server:
    return await asyncio.start_server(handle, host, port, limit=HEAD_LIMIT, reuse_address=True)
