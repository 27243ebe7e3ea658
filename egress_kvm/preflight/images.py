"""Does each configured image URL answer, and how big is it? HEAD first, a one-byte ranged GET when the
server will not say the length on HEAD (some object stores and CDNs refuse HEAD or omit the length)."""

from __future__ import annotations

import socket
import ssl
from urllib.parse import urlsplit

import aiohttp

from egress_kvm.config.models import KvmConfig
from egress_kvm.redact import redact_url

from .verdicts import HttpFailure, Verdict, content_range_total, image_verdict


def _failure(exc: BaseException) -> HttpFailure:
    if isinstance(exc, TimeoutError):
        return HttpFailure.TIMEOUT
    if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
        return HttpFailure.TLS
    os_error = getattr(exc, "os_error", None)
    if isinstance(exc, aiohttp.ClientConnectorDNSError) or isinstance(os_error, socket.gaierror):
        return HttpFailure.DNS
    if isinstance(os_error, ConnectionRefusedError):
        return HttpFailure.REFUSED
    return HttpFailure.OTHER


async def _size(session: aiohttp.ClientSession, url: str) -> tuple[int, int | None]:
    async with session.head(url, allow_redirects=True) as resp:
        if resp.status < 400 and resp.content_length is not None:
            return resp.status, resp.content_length
        head_status = resp.status
    if head_status not in (403, 405, 501) and head_status >= 400:
        return head_status, None
    async with session.get(url, headers={"Range": "bytes=0-0"}, allow_redirects=True) as resp:
        if resp.status == 206:
            return resp.status, content_range_total(resp.headers.get("Content-Range"))
        return resp.status, resp.content_length if resp.status < 400 else None  # body is never read


async def probe_images(kvm: KvmConfig, *, time_limit: float) -> dict[str, tuple[Verdict, int | None]]:
    """label -> (verdict, size in bytes when known). No proxy from the environment, as the operator."""
    out: dict[str, tuple[Verdict, int | None]] = {}
    timeout = aiohttp.ClientTimeout(total=time_limit)
    async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
        for label, image in kvm.images.items():
            shown = redact_url(image.url)
            try:
                status, size = await _size(session, image.url)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                verdict = image_verdict(label=label, shown_url=shown, status=None, size=None,
                                        failure=_failure(exc), host=urlsplit(image.url).hostname or "",
                                        reason=type(exc).__name__)
                out[label] = (verdict, None)
                continue
            out[label] = (image_verdict(label=label, shown_url=shown, status=status, size=size), size)
    return out
