"""The image cache against a real HTTP server on loopback, streaming into the fake pool."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fakes import (
    FakeHypervisor,
    FakeLibvirtClient,
    fake_kvm_provider,
    overlay_of,
    precache_image,
    qcow2_image,
)
from provider_helpers import LogCapture, create_waiting, request

from egress_kvm.providers.base import PermanentError, QuotaError, TransientError
from egress_kvm.providers.kvm import naming

IMAGE = qcow2_image(3 * 1024 * 1024 + 123)
DIGEST = hashlib.sha256(IMAGE).hexdigest()
# The pinned image's base is named by its digest (the URL does not matter: naming.base_volume).
BASE = naming.base_volume(key="debian-12", url="http://unused.test/", sha256=DIGEST)
MARKER = naming.marker_volume(BASE)


def base_for(srv: ImageServer, sha256: str | None) -> str:
    return naming.base_volume(key="debian-12", url=f"{srv.url}/debian-12.qcow2", sha256=sha256)


@dataclass
class ImageServer:
    url: str
    files: dict[str, bytes]
    requests: list[str] = field(default_factory=list)
    gate: asyncio.Event | None = None
    cut_after: int | None = None  # close the connection after this many body bytes
    stall_after: int | None = None  # stop sending (but keep the connection) after this many bytes
    release: asyncio.Event = field(default_factory=asyncio.Event)  # ends a stall (at teardown)


@pytest.fixture
async def server() -> AsyncIterator[ImageServer]:
    files: dict[str, bytes] = {"/debian-12.qcow2": IMAGE}
    srv = ImageServer(url="", files=files)

    async def handle(req: web.Request) -> web.StreamResponse:
        srv.requests.append(req.path)
        if srv.gate is not None:
            await srv.gate.wait()
        body = files.get(req.path)
        if body is None:
            return web.Response(status=404)
        resp = web.StreamResponse(headers={"Content-Length": str(len(body))})
        await resp.prepare(req)
        for i in range(0, len(body), 64 * 1024):  # several writes: the client sees a real stream
            if srv.cut_after is not None and i >= srv.cut_after:
                assert req.transport is not None
                req.transport.close()
                return resp
            if srv.stall_after is not None and i >= srv.stall_after:
                await srv.release.wait()  # set at teardown, so the server's cleanup need not wait
            await resp.write(body[i:i + 64 * 1024])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    srv.url = f"http://127.0.0.1:{port}"
    try:
        yield srv
    finally:
        srv.release.set()
        await runner.cleanup()


def provider_for(srv: ImageServer, *, sha256: str | None = DIGEST, fmt: str = "qcow2", **kw: object):  # type: ignore[no-untyped-def]
    image: dict[str, object] = {"url": f"{srv.url}/debian-12.qcow2", "format": fmt}
    if sha256 is not None:
        image["sha256"] = sha256
    # URL images are off by default: the test server's address is allowed explicitly.
    kw.setdefault("urlImages", ["127.0.0.1"])
    return fake_kvm_provider(images={"debian-12": image}, precache=False, **kw)  # type: ignore[arg-type]


def _record_volume_calls(monkeypatch: pytest.MonkeyPatch, h: FakeHypervisor
                         ) -> tuple[list[tuple[str, str]], list[set[str]]]:
    """Record (create|upload|refresh, volume) on `h` in order, and the pool's volumes at every piece of
    the base's upload (to see that no marker exists while the base is still being written)."""
    order: list[tuple[str, str]] = []
    during: list[set[str]] = []
    create, upload, refresh = (FakeLibvirtClient.storage_vol_create_xml, FakeLibvirtClient.storage_vol_upload,
                               FakeLibvirtClient.storage_pool_refresh)

    async def create_xml(self: FakeLibvirtClient, pool: Any, xml: str, flags: int = 0) -> Any:
        vol = await create(self, pool, xml, flags)
        if self.hyp is h:
            order.append(("create", vol.name))
        return vol

    async def vol_upload(self: FakeLibvirtClient, vol: Any, offset: int, length: int, flags: int,
                         data: Any) -> int:
        if self.hyp is h and vol.name == BASE and not isinstance(data, bytes | bytearray | memoryview):
            async def watched(src: Any = data) -> AsyncIterator[bytes]:
                async for piece in src:
                    during.append(set(h.volumes))
                    yield piece
            data = watched()
        n = await upload(self, vol, offset, length, flags, data)
        if self.hyp is h:
            order.append(("upload", vol.name))
        return n

    async def pool_refresh(self: FakeLibvirtClient, pool: Any, flags: int = 0) -> None:
        await refresh(self, pool, flags)
        if self.hyp is h:
            order.append(("refresh", ""))

    monkeypatch.setattr(FakeLibvirtClient, "storage_vol_create_xml", create_xml)
    monkeypatch.setattr(FakeLibvirtClient, "storage_vol_upload", vol_upload)
    monkeypatch.setattr(FakeLibvirtClient, "storage_pool_refresh", pool_refresh)
    return order, during


async def test_first_create_streams_the_image_and_writes_the_marker_last(
        server: ImageServer, logs: LogCapture, monkeypatch: pytest.MonkeyPatch) -> None:
    provider, hv = provider_for(server)
    h = hv["host0"]
    progress: list[str] = []

    async def on_progress(text: str) -> None:
        progress.append(text)

    provider._images._progress_every = 0  # report on every chunk, to see it at all in a small image
    order, seen_during_base_upload = _record_volume_calls(monkeypatch, h)
    try:
        await create_waiting(provider, request(), progress=on_progress)
        assert bytes(h.volumes[BASE].data) == IMAGE
        assert h.volumes[BASE].format == "qcow2"  # re-probed by the pool refresh
        assert bytes(h.volumes[MARKER].data).decode() == DIGEST
        assert h.upload_pieces[BASE] > 1  # streamed in pieces, not one buffered blob
        creates = [c for c in h.calls if c == "storage_vol_create_xml"]
        assert len(creates) == 4  # base, marker, overlay, seed
        assert order.index(("create", MARKER)) > max(i for i, c in enumerate(order) if c == ("upload", BASE))
        assert order.index(("create", MARKER)) > order.index(("refresh", ""))
        assert order.index(("upload", MARKER)) > order.index(("create", MARKER))
        assert seen_during_base_upload and not any(MARKER in names for names in seen_during_base_upload)
        assert server.requests == ["/debian-12.qcow2"]
        assert progress and "debian-12" in progress[-1] and "host0" in progress[-1]
        fetching = logs.lines("fetching base image into host pool")
        cached = logs.lines("base image cached")
        assert fetching[0]["image"] == "debian-12" and fetching[0]["host"] == "host0"
        assert fetching[0]["name"] == cached[0]["name"] == "proxy-abc"
        assert cached[0]["size"] == len(IMAGE) and cached[0]["duration"] >= 0
        assert cached[0]["sha256"] == DIGEST

        await create_waiting(provider, request(name="proxy-second"))
        assert server.requests == ["/debian-12.qcow2"]  # cached: no second download
    finally:
        await provider.close()


async def test_two_creates_needing_the_same_missing_image_download_once(server: ImageServer) -> None:
    provider, hv = provider_for(server)
    server.gate = asyncio.Event()
    try:
        tasks = [asyncio.create_task(create_waiting(provider, request(name=f"proxy-{i}"))) for i in range(3)]
        await asyncio.sleep(0.2)
        server.gate.set()
        await asyncio.gather(*tasks)
        assert server.requests == ["/debian-12.qcow2"]
        assert {"proxy-0", "proxy-1", "proxy-2"} <= set(hv["host0"].domains)
    finally:
        await provider.close()


async def test_base_without_marker_is_deleted_and_redone(server: ImageServer, logs: LogCapture) -> None:
    provider, hv = provider_for(server)
    h = hv["host0"]
    h.put_volume(BASE, IMAGE[: len(IMAGE) // 2])  # a crash mid-download
    try:
        await create_waiting(provider, request())
        assert bytes(h.volumes[BASE].data) == IMAGE
        assert bytes(h.volumes[MARKER].data).decode() == DIGEST
        assert "interrupted" in logs.lines("fetching base image into host pool")[0]["reason"]
    finally:
        await provider.close()


async def test_a_changed_sha256_imports_a_new_base_beside_the_old_one(server: ImageServer) -> None:
    """Bases are content-addressed: the base of the earlier sha256 stays (running VMs back onto it) and
    the new one is imported under its own name; eviction.py collects the old one once nothing uses it."""
    old = qcow2_image(8192)
    old_sha = hashlib.sha256(old).hexdigest()
    provider, hv = provider_for(server)
    h = hv["host0"]
    old_base = precache_image(h, "debian-12", old, url=f"{server.url}/debian-12.qcow2", sha256=old_sha)
    try:
        await create_waiting(provider, request())
        assert bytes(h.volumes[BASE].data) == IMAGE and old_base != BASE
        assert bytes(h.volumes[old_base].data) == old  # untouched
        assert h.volumes[overlay_of("proxy-abc")].backing_path == h.volumes[BASE].path
        assert server.requests == ["/debian-12.qcow2"]
    finally:
        await provider.close()


async def test_a_changed_url_without_sha256_imports_a_new_base_beside_the_old_one(
        server: ImageServer) -> None:
    old = qcow2_image(8192)
    provider, hv = provider_for(server, sha256=None)
    h = hv["host0"]
    old_base = precache_image(h, "debian-12", old, url=f"{server.url}/old/debian-12.qcow2")
    try:
        await create_waiting(provider, request())
        new_base = base_for(server, None)
        assert new_base != old_base and bytes(h.volumes[new_base].data) == IMAGE
        assert bytes(h.volumes[old_base].data) == old
        assert server.requests == ["/debian-12.qcow2"]
    finally:
        await provider.close()


async def test_no_sha256_configured_keeps_the_cached_copy(server: ImageServer) -> None:
    old = qcow2_image(8192)
    provider, hv = provider_for(server, sha256=None)
    base = precache_image(hv["host0"], "debian-12", old, url=f"{server.url}/debian-12.qcow2")
    try:
        await create_waiting(provider, request())
        assert bytes(hv["host0"].volumes[base].data) == old  # pinned at first fetch
        assert server.requests == []
        assert "storage_vol_download" not in hv["host0"].calls  # marker not even read
    finally:
        await provider.close()


@pytest.mark.parametrize("sha256", [None, DIGEST])
async def test_an_empty_marker_left_by_a_crash_is_not_a_valid_cache(
        server: ImageServer, logs: LogCapture, sha256: str | None) -> None:
    provider, hv = provider_for(server, sha256=sha256)
    h = hv["host0"]
    base = base_for(server, sha256)
    marker = naming.marker_volume(base)
    h.put_volume(base, IMAGE, fmt="qcow2")
    h.put_volume(marker, b"")  # created, then the process died before the digest was written
    try:
        await create_waiting(provider, request())
        assert server.requests == ["/debian-12.qcow2"]
        assert bytes(h.volumes[marker].data).decode() == DIGEST
        reason = logs.lines("fetching base image into host pool")[0]["reason"]
        assert ("holds no digest" if sha256 is None else "(empty marker)") in reason
        await create_waiting(provider, request(name="proxy-second"))  # now a valid cache: no second download
        assert server.requests == ["/debian-12.qcow2"]
    finally:
        await provider.close()


async def test_sha256_mismatch_is_permanent_and_leaves_nothing(server: ImageServer) -> None:
    wrong = "0" * 64
    provider, hv = provider_for(server, sha256=wrong)
    try:
        with pytest.raises(PermanentError) as info:
            await create_waiting(provider, request())
        msg = str(info.value)
        assert "'debian-12'" in msg and wrong in msg and DIGEST in msg
        assert hv["host0"].volume_names() == set()
        assert hv["host0"].domains == {}
    finally:
        await provider.close()


@pytest.mark.parametrize(("body", "needle"), [
    (qcow2_image(backing=True), "backing file"),
    (qcow2_image(data_file=True), "external data file"),
    (b"\x00" * 4096, "not a qcow2"),
])
async def test_unsafe_or_wrong_format_images_are_refused_before_any_volume(
        server: ImageServer, body: bytes, needle: str) -> None:
    server.files["/debian-12.qcow2"] = body
    provider, hv = provider_for(server, sha256=None)
    try:
        with pytest.raises(PermanentError, match=needle):
            await create_waiting(provider, request())
        assert hv["host0"].volume_names() == set()
        assert "storage_vol_create_xml" not in hv["host0"].calls
    finally:
        await provider.close()


async def test_raw_image_backs_the_overlay_as_raw(server: ImageServer) -> None:
    raw = b"\x00" * 8192
    server.files["/debian-12.qcow2"] = raw
    provider, hv = provider_for(server, sha256=None, fmt="raw")
    try:
        await create_waiting(provider, request())
        assert hv["host0"].volumes[overlay_of("proxy-abc")].backing_format == "raw"
    finally:
        await provider.close()


async def test_url_image_is_cached_under_its_url_hash(server: ImageServer) -> None:
    provider, hv = provider_for(server, sha256=None)
    url = f"{server.url}/debian-12.qcow2"
    try:
        await create_waiting(provider, request(image=url))
        base = naming.base_volume(url=url)
        assert bytes(hv["host0"].volumes[base].data) == IMAGE
        assert bytes(hv["host0"].volumes[naming.marker_volume(base)].data).decode() == DIGEST
    finally:
        await provider.close()


async def test_http_errors_are_transient_and_leave_nothing(server: ImageServer) -> None:
    del server.files["/debian-12.qcow2"]
    provider, hv = provider_for(server)
    try:
        with pytest.raises(TransientError, match="HTTP 404"):
            await create_waiting(provider, request())
        assert hv["host0"].volume_names() == set()
    finally:
        await provider.close()


async def test_full_pool_is_quota_and_the_partial_base_is_removed(server: ImageServer) -> None:
    provider, hv = provider_for(server)
    hv["host0"].upload_fail_after = 1024 * 1024
    try:
        with pytest.raises(QuotaError, match=r"host 'host0' pool 'default' is out of space"):
            await create_waiting(provider, request())
        assert hv["host0"].volume_names() == set()
    finally:
        await provider.close()


async def test_pool_too_small_for_the_image_is_quota(server: ImageServer) -> None:
    provider, hv = provider_for(server, host_kwargs={"pool_capacity": 1024 * 1024})
    try:
        with pytest.raises(QuotaError, match=r"image 'debian-12' needs 3\.0 MiB"):
            await create_waiting(provider, request())
        assert hv["host0"].volume_names() == set()
    finally:
        await provider.close()


async def test_marker_without_base_is_redone(server: ImageServer, logs: LogCapture) -> None:
    provider, hv = provider_for(server)
    hv["host0"].put_volume(MARKER, DIGEST.encode())  # someone evicted only the base
    try:
        await create_waiting(provider, request())
        assert bytes(hv["host0"].volumes[BASE].data) == IMAGE
        assert logs.lines("fetching base image into host pool")[0]["reason"] == "marker without base volume"
    finally:
        await provider.close()


@pytest.mark.parametrize("how", ["cut", "stall"])
async def test_a_dropped_download_is_transient_leaves_nothing_and_keeps_the_host_session(
        server: ImageServer, logs: LogCapture, how: str) -> None:
    """The HTTP source failing mid-body is the download's failure, not the libvirt link's: the host's
    shared session stays up (one dial), nothing says `libvirt connection dropped`, the partial base goes."""
    if how == "cut":
        server.cut_after = 1024 * 1024
    else:
        server.stall_after = 1024 * 1024
    provider, hv = provider_for(server)
    provider._http_timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=0.3)
    provider._importer._failure_hold = 0.0  # retry at once (the hold is tested in test_imports.py)
    h = hv["host0"]
    try:
        with pytest.raises(TransientError, match=r"image 'debian-12': downloading .* (failed|timed out)"):
            await create_waiting(provider, request())
        assert h.volume_names() == set()
        assert "storage_vol_upload" in h.calls  # it failed mid-upload, not before
        assert logs.lines("libvirt connection dropped") == []
        assert hv.dials == ["host0"]
        assert provider._hosts["host0"].connected

        server.cut_after = server.stall_after = None
        await create_waiting(provider, request())  # the same session serves the retry
        assert bytes(h.volumes[BASE].data) == IMAGE
        assert hv.dials == ["host0"]
    finally:
        await provider.close()


@pytest.mark.parametrize("as_placement", [False, True])
async def test_image_url_credentials_and_signature_never_reach_logs_or_errors(
        server: ImageServer, logs: LogCapture, as_placement: bool) -> None:
    port = server.url.rsplit(":", 1)[1]
    url = f"http://user:tok3n-secret@127.0.0.1:{port}/gone.qcow2?X-Amz-Signature=sig-secret"
    if as_placement:  # a URL used directly in placement.image
        provider, _ = provider_for(server)
        req = request(image=url)
    else:
        provider, _ = fake_kvm_provider(images={"debian-12": {"url": url}}, precache=False)
        req = request()
    try:
        with pytest.raises(TransientError, match="HTTP 404") as info:
            await create_waiting(provider, req)
        msg = str(info.value)
        assert f"REDACTED@127.0.0.1:{port}/gone.qcow2?REDACTED" in msg
        fetching = logs.lines("fetching base image into host pool")
        assert fetching[0]["url"] == f"http://REDACTED@127.0.0.1:{port}/gone.qcow2?REDACTED"
        for text in (msg, logs.text):
            assert "secret" not in text and "user:" not in text
        assert server.requests == ["/gone.qcow2"]  # the real URL was fetched
    finally:
        await provider.close()


async def test_a_url_image_with_credentials_is_recorded_without_them(server: ImageServer) -> None:
    port = server.url.rsplit(":", 1)[1]
    url = f"http://user:tok3n-secret@127.0.0.1:{port}/debian-12.qcow2?sig=sig-secret"
    provider, hv = provider_for(server, sha256=None)
    try:
        await create_waiting(provider, request(image=url))
        xml = hv["host0"].domains["proxy-abc"].xml  # the domain's metadata names the image
        assert f'image="http://REDACTED@127.0.0.1:{port}/debian-12.qcow2?REDACTED"' in xml
        assert "secret" not in xml
    finally:
        await provider.close()


@pytest.mark.parametrize(("cancelled_at", "kept"), [
    ("the marker's creation", False),  # libvirt made it, the coroutine was cancelled before it knew
    ("the marker's upload", False),
    ("the finished base's path", True),  # marker written: complete, someone may back onto it already
])
async def test_a_cancel_racing_the_marker_write_leaves_a_complete_base_or_nothing(
        server: ImageServer, monkeypatch: pytest.MonkeyPatch, cancelled_at: str, kept: bool) -> None:
    """imports.py cancels an import nobody waits for at any await; whichever step it hits, the pool
    holds the finished base with its marker, or neither (never a marker without its base or a base
    without its marker). The cancel is raised right after the fake's RPC did its work."""
    from egress_kvm.providers.kvm import placement

    provider, hv = provider_for(server)
    h = hv["host0"]
    create, upload = FakeLibvirtClient.storage_vol_create_xml, FakeLibvirtClient.storage_vol_upload
    get_path = FakeLibvirtClient.storage_vol_get_path

    async def create_xml(self: FakeLibvirtClient, pool: Any, xml: str, flags: int = 0) -> Any:
        vol = await create(self, pool, xml, flags)
        if cancelled_at == "the marker's creation" and vol.name == MARKER:
            raise asyncio.CancelledError
        return vol

    async def vol_upload(self: FakeLibvirtClient, vol: Any, *args: Any) -> int:
        n = await upload(self, vol, *args)
        if cancelled_at == "the marker's upload" and vol.name == MARKER:
            raise asyncio.CancelledError
        return n

    async def vol_path(self: FakeLibvirtClient, vol: Any) -> str:
        path = await get_path(self, vol)
        if cancelled_at == "the finished base's path" and vol.name == BASE:
            raise asyncio.CancelledError
        return path

    monkeypatch.setattr(FakeLibvirtClient, "storage_vol_create_xml", create_xml)
    monkeypatch.setattr(FakeLibvirtClient, "storage_vol_upload", vol_upload)
    monkeypatch.setattr(FakeLibvirtClient, "storage_vol_get_path", vol_path)
    host = provider.host("host0")
    try:
        pool = await host.call("lookup", lambda lv: lv.storage_pool_lookup_by_name("default"))
        with pytest.raises(asyncio.CancelledError):
            await provider._images.ensure(host, pool, placement.image_source(provider.config, "debian-12"))
        if kept:
            assert bytes(h.volumes[BASE].data) == IMAGE and bytes(h.volumes[MARKER].data).decode() == DIGEST
        else:
            assert {BASE, MARKER}.isdisjoint(h.volumes)
    finally:
        await provider.close()
