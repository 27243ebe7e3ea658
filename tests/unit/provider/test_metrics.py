"""The provider's Prometheus metrics move when the work happens: RPC durations per method and result
(observed through the same observer the real client feeds), and image bytes fetched (the image's size
on a download, nothing on a cache hit). Printing the metric's HELP line proves neither."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from fakes import fake_kvm_provider, qcow2_image
from provider_helpers import create_waiting, request

from egress_kvm.metrics import REGISTRY

IMAGE = qcow2_image(1024 * 1024 + 77)


def rpc_count(method: str, result: str = "ok", host: str = "host0") -> float:
    return REGISTRY.get_sample_value("egress_kvm_libvirt_rpc_duration_seconds_count",
                                     {"host": host, "method": method, "result": result}) or 0.0


def fetched(host: str = "host0") -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        for s in metric.samples:
            if s.name == "egress_kvm_image_bytes_fetched_total" and s.labels.get("host") == host:
                total += s.value
    return total


@pytest.fixture
async def image_url() -> AsyncIterator[str]:
    async def handle(_req: web.Request) -> web.Response:
        return web.Response(body=IMAGE)

    app = web.Application()
    app.router.add_get("/debian-12.qcow2", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/debian-12.qcow2"
    finally:
        await runner.cleanup()


async def test_rpc_durations_are_recorded_per_method_and_result() -> None:
    provider, _hv = fake_kvm_provider()
    define, start = rpc_count("domain_define_xml"), rpc_count("domain_create_with_flags")
    lookups_missing = rpc_count("domain_lookup_by_name", "not_found")
    try:
        await create_waiting(provider, request())
        assert await provider.get("proxy-does-not-exist", "host0") is None
    finally:
        await provider.close()
    assert rpc_count("domain_define_xml") == define + 1  # one define and one start for one create
    assert rpc_count("domain_create_with_flags") == start + 1
    assert rpc_count("domain_lookup_by_name", "not_found") > lookups_missing  # the miss, labelled so


async def test_image_bytes_fetched_grow_by_the_image_on_download_and_not_on_a_cache_hit(
        image_url: str) -> None:
    provider, _hv = fake_kvm_provider(images={"debian-12": {"url": image_url, "format": "qcow2"}},
                                      precache=False)
    try:
        before = fetched()
        await create_waiting(provider, request("proxy-one"))
        assert fetched() == before + len(IMAGE)
        await create_waiting(provider, request("proxy-two", uid="uid-2"))  # the base is cached on host0 now
        assert fetched() == before + len(IMAGE)
    finally:
        await provider.close()


def imports(result: str, host: str = "host0", image: str = "debian-12") -> float:
    return REGISTRY.get_sample_value("egress_kvm_image_imports_total",
                                     {"host": host, "image": image, "result": result}) or 0.0


async def test_image_imports_count_downloads_by_result(image_url: str) -> None:
    """What the EgressKvmImageImportFailing alert watches: a failing download counts as an error, a
    successful one as a success, a cache hit as neither."""
    broken, _ = fake_kvm_provider(images={"debian-12": {"url": image_url + ".missing", "format": "qcow2"}},
                                  precache=False)
    ok_before, err_before = imports("success"), imports("error")
    try:
        with pytest.raises(Exception, match="HTTP 404"):
            await create_waiting(broken, request("proxy-broken"))
    finally:
        await broken.close()
    assert (imports("success"), imports("error")) == (ok_before, err_before + 1)
    provider, _ = fake_kvm_provider(images={"debian-12": {"url": image_url, "format": "qcow2"}},
                                    precache=False)
    try:
        await create_waiting(provider, request("proxy-one"))
        await create_waiting(provider, request("proxy-two", uid="uid-2"))  # cached: no import
    finally:
        await provider.close()
    assert (imports("success"), imports("error")) == (ok_before + 1, err_before + 1)
