"""Bounds on every image download (issue 13 item 3), against real HTTP servers on loopback.

A server that sends nothing after its headers, one that trickles below the minimum rate, one that
announces more than the size cap and one that streams past it without a length are each stopped, leave
no volume behind, and say which bound stopped them. The pool is refreshed and its reserve kept before
the space counts.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from fakes import fake_kvm_provider, qcow2_image
from provider_helpers import create_waiting, request

from egress_kvm.providers.base import InProgress, PermanentError, QuotaError, TransientError
from egress_kvm.providers.kvm import placement
from egress_kvm.providers.kvm.images import ImportLimits

IMAGE = qcow2_image(2 * 1024 * 1024)
MIB = 1024 * 1024

STOP = web.AppKey("stop", asyncio.Event)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []
    stop = asyncio.Event()

    async def start(handler: Handler) -> str:
        async def guarded(req: web.Request) -> web.StreamResponse:
            try:
                return await handler(req)
            except ConnectionError:
                return web.Response(status=499)

        app = web.Application()
        app[STOP] = stop
        app.router.add_get("/{tail:.*}", guarded)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/image.qcow2"

    yield start
    stop.set()
    for r in runners:
        await r.cleanup()


def provider_with(url: str, *, limits: ImportLimits, max_bytes: int | None = None,
                  monkeypatch: pytest.MonkeyPatch | None = None, **kw: object):  # type: ignore[no-untyped-def]
    provider, hv = fake_kvm_provider(images={"debian-12": {"url": url}}, precache=False, **kw)  # type: ignore[arg-type]
    provider._images.limits = limits
    provider._importer._failure_hold = 0.0
    if max_bytes is not None:
        assert monkeypatch is not None
        real = placement.image_source
        monkeypatch.setattr(placement, "image_source",
                            lambda kvm, image: dataclasses.replace(real(kvm, image), max_bytes=max_bytes))
    return provider, hv


async def test_a_server_that_goes_silent_is_stopped_at_the_deadline(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    async def silent(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(len(IMAGE))})
        await resp.prepare(req)
        await resp.write(IMAGE[:1024 * 1024])
        await req.app[STOP].wait()
        return resp

    url = await serve(silent)
    provider, hv = provider_with(url, limits=ImportLimits(timeout=0.5, min_rate=0, window=60, reserve=0))
    try:
        with pytest.raises(TransientError, match=r"took longer than 0 s \(imageImport.timeoutSeconds\)"):
            await create_waiting(provider, request())
        assert hv["host0"].volume_names() == set()
    finally:
        await provider.close()


async def test_a_server_that_sends_no_headers_is_stopped_at_the_deadline(serve) -> None:  # type: ignore[no-untyped-def]
    async def mute(req: web.Request) -> web.StreamResponse:
        await req.app[STOP].wait()
        return web.Response()

    url = await serve(mute)
    provider, hv = provider_with(url, limits=ImportLimits(timeout=0.3, min_rate=0, window=60, reserve=0))
    try:
        with pytest.raises(TransientError, match="sent no answer within"):
            await create_waiting(provider, request())
        assert hv["host0"].volume_names() == set()
    finally:
        await provider.close()


async def test_a_trickle_below_the_minimum_rate_is_stopped_after_one_window(serve) -> None:  # type: ignore[no-untyped-def]
    async def trickle(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(len(IMAGE))})
        await resp.prepare(req)
        await resp.write(IMAGE[:1024 * 1024])  # a good start (the header checks pass) ...
        for b in IMAGE[1024 * 1024:]:  # ... then a byte every 50 ms
            await resp.write(bytes([b]))
            await asyncio.sleep(0.05)
        return resp

    url = await serve(trickle)
    provider, hv = provider_with(url, limits=ImportLimits(timeout=3600, min_rate=64 * 1024, window=0.5,
                                                         reserve=0))
    try:
        with pytest.raises(TransientError, match=r"below the minimum of 65536 bytes/s"):
            await create_waiting(provider, request())
        assert hv["host0"].volume_names() == set()
    finally:
        await provider.close()


async def test_a_content_length_above_the_cap_is_refused_before_any_volume(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    async def big(req: web.Request) -> web.StreamResponse:
        return web.Response(body=IMAGE)

    url = await serve(big)
    provider, hv = provider_with(url, limits=ImportLimits(reserve=0), max_bytes=MIB, monkeypatch=monkeypatch)
    try:
        with pytest.raises(PermanentError, match=r"is 2.0 MiB, more than its size cap of 1.0 MiB"):
            await create_waiting(provider, request())
        assert "storage_vol_create_xml" not in hv["host0"].calls
    finally:
        await provider.close()


async def test_a_stream_without_length_is_stopped_at_the_cap(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    async def chunked(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(req)
        for i in range(0, len(IMAGE), 64 * 1024):
            await resp.write(IMAGE[i:i + 64 * 1024])
        await resp.write_eof()
        return resp

    url = await serve(chunked)
    provider, hv = provider_with(url, limits=ImportLimits(reserve=0), max_bytes=MIB, monkeypatch=monkeypatch)
    try:
        with pytest.raises(PermanentError, match=r"larger than its size cap of 1.0 MiB \(maxSizeGb\)"):
            await create_waiting(provider, request())
        assert hv["host0"].volume_names() == set()
    finally:
        await provider.close()


async def test_the_pool_reserve_is_kept_for_the_image_and_the_overlay(serve) -> None:  # type: ignore[no-untyped-def]
    async def ok(req: web.Request) -> web.StreamResponse:
        return web.Response(body=IMAGE)

    url = await serve(ok)
    gib = 1024**3
    provider, _hv = provider_with(url, limits=ImportLimits(reserve=gib), diskSizeGb=1,
                                 host_kwargs={"pool_capacity": gib + gib // 2})
    try:
        with pytest.raises(QuotaError, match=r"1.0 GiB of it kept in reserve, poolReserveGb\), "
                                             r"VM 'proxy-abc' \(overlay \+ seed\) needs 1.0 GiB"):
            await create_waiting(provider, request())
        provider._images.limits = ImportLimits(reserve=0)
        await create_waiting(provider, request())  # the same pool without the reserve: room
    finally:
        await provider.close()


async def test_space_freed_outside_libvirt_counts_at_once(serve) -> None:  # type: ignore[no-untyped-def]
    """libvirt's pool figures change only on refresh: the create refreshes before deciding, so a full
    pool recovers by itself once space is freed (it stayed QuotaExceeded until a manual pool-refresh)."""
    async def ok(req: web.Request) -> web.StreamResponse:
        return web.Response(body=IMAGE)

    url = await serve(ok)
    gib = 1024**3
    provider, hv = provider_with(url, limits=ImportLimits(reserve=0), diskSizeGb=1)
    h = hv["host0"]
    try:
        await create_waiting(provider, request(name="proxy-first"))
        h.outside_usage = h.pool_available() - 10 * MIB  # somebody filled the pool
        with pytest.raises(QuotaError, match=r"has 10\.0 MiB available"):
            await create_waiting(provider, request())
        h.free_pool_space()  # freed outside libvirt: visible only after a refresh
        assert h.pool_available(as_libvirt_sees=True) < gib
        await create_waiting(provider, request())
    finally:
        await provider.close()


async def test_create_answers_in_progress_at_once_while_the_import_runs(serve) -> None:  # type: ignore[no-untyped-def]
    gate = asyncio.Event()

    async def gated(req: web.Request) -> web.StreamResponse:
        await gate.wait()
        return web.Response(body=IMAGE)

    url = await serve(gated)
    provider, _hv = provider_with(url, limits=ImportLimits(reserve=0))
    try:
        with pytest.raises(InProgress, match="waiting for image debian-12 on host host0") as first:
            await provider.create(request())
        with pytest.raises(InProgress) as second:  # joins the same import: one wake for both
            await provider.create(request(name="proxy-two"))
        assert first.value.wake is second.value.wake and not first.value.wake.done()
        gate.set()
        await asyncio.wait_for(first.value.wake, 10)
        await provider.create(request())
        await provider.create(request(name="proxy-two"))
    finally:
        await provider.close()
