"""An import nobody waits for any more is cancelled and cleaned up (issue 9 item 3).

First the Importer alone (who waits, who leaves, what a cancel does), then the provider over the fake
pool with a real HTTP server on loopback that announces a large image and trickles it: the Proxy's
instance deleted (or its owner moving to another image) cancels the download, deletes the partial
volume and closes the connection; status progress and the bytes metric are checked on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from fakes import fake_kvm_provider, qcow2_image
from provider_helpers import request

from egress_kvm.metrics import REGISTRY
from egress_kvm.providers.base import InProgress, ProgressCallback
from egress_kvm.providers.kvm import naming
from egress_kvm.providers.kvm.images import BaseImage, ImportLimits, _progress_text
from egress_kvm.providers.kvm.imports import Importer

MIB = 1024 * 1024


class Fetch:
    """A fetch that runs until cancelled, and records that it was (and that its clean-up ran)."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.cleanup = asyncio.Event()  # the clean-up after a cancel waits for this

    async def __call__(self, _progress: ProgressCallback) -> BaseImage:
        self.started += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            await self.cleanup.wait()  # e.g. deleting the partial volume: awaits work after a cancel
            raise
        raise AssertionError("unreachable")


async def nothing_cached() -> BaseImage | None:
    return None


async def wait(imp: Importer, key: str, *, instance: str, owner: str = "", fetch: Fetch) -> InProgress:
    with pytest.raises(InProgress) as e:
        await imp.base(key, label=key, instance=instance, owner=owner, cached=nothing_cached, fetch=fetch)
    return e.value


async def test_the_import_runs_while_anyone_waits_and_is_cancelled_when_the_last_one_leaves() -> None:
    imp, fetch = Importer(slots=lambda: asyncio.Semaphore(2)), Fetch()
    first = await wait(imp, "k", instance="proxy-a", owner="uid-a", fetch=fetch)
    await wait(imp, "k", instance="proxy-b", owner="uid-b", fetch=fetch)
    await asyncio.sleep(0)
    assert fetch.started == 1 and imp.waiting("k") == ["proxy-a", "proxy-b"]
    imp.leave("proxy-a")
    await asyncio.sleep(0)
    assert fetch.cancelled == 0 and imp.waiting("k") == ["proxy-b"] and not first.wake.done()  # type: ignore[union-attr]
    imp.leave("proxy-unrelated")
    imp.leave("proxy-b")
    await asyncio.sleep(0)
    assert fetch.cancelled == 1 and imp.running() == [] and first.wake.done()  # type: ignore[union-attr]
    # Asked again during the clean-up: a fresh import, not the cancelled one, and no failure reported.
    fetch.cleanup.set()
    await wait(imp, "k", instance="proxy-c", fetch=fetch)
    await asyncio.sleep(0)
    assert fetch.started == 2 and imp.waiting("k") == ["proxy-c"]
    await imp.close()


async def test_an_owner_moving_to_another_image_leaves_the_import_it_waited_on() -> None:
    imp, fetch = Importer(slots=lambda: asyncio.Semaphore(2)), Fetch()
    fetch.cleanup.set()
    await wait(imp, "old", instance="proxy-a", owner="uid-a", fetch=fetch)
    await wait(imp, "old", instance="proxy-x", owner="uid-x", fetch=fetch)
    await wait(imp, "new", instance="proxy-a2", owner="uid-a", fetch=fetch)  # uid-a's Proxy moved
    await asyncio.sleep(0)
    assert imp.waiting("old") == ["proxy-x"] and fetch.cancelled == 0
    await wait(imp, "new", instance="proxy-x2", owner="uid-x", fetch=fetch)  # and the other one too
    await asyncio.sleep(0)
    assert imp.waiting("old") == [] and fetch.cancelled == 1
    assert imp.waiting("new") == ["proxy-a2", "proxy-x2"]
    await imp.close()


async def test_close_waits_for_a_cancelled_import_to_clean_up() -> None:
    imp, fetch = Importer(slots=lambda: asyncio.Semaphore(2)), Fetch()
    await wait(imp, "k", instance="proxy-a", fetch=fetch)
    await asyncio.sleep(0)
    imp.leave("proxy-a")
    closing = asyncio.ensure_future(imp.close())
    await asyncio.sleep(0.05)
    assert not closing.done()  # the clean-up still runs: close does not leave it behind
    fetch.cleanup.set()
    await asyncio.wait_for(closing, 5)


@pytest.mark.parametrize(("moved", "length", "elapsed", "expected"), [
    (0, None, 0.0, "downloading image deb to host h0: 0 MB"),
    (50_000_000, None, 10.0, "downloading image deb to host h0: 50 MB (5.0 MB/s)"),
    (50_000_000, 200_000_000, 0.0, "downloading image deb to host h0: 50 of 200 MB (25%)"),
    (50_000_000, 200_000_000, 4.0, "downloading image deb to host h0: 50 of 200 MB (25%, 12.5 MB/s)"),
    (3 * 1024**3, 3 * 1024**3, 100.0, "downloading image deb to host h0: 3221 of 3221 MB (100%, 32.2 MB/s)"),
])
def test_progress_says_bytes_percent_when_the_length_is_known_and_rate(
        moved: int, length: int | None, elapsed: float, expected: str) -> None:
    assert _progress_text("deb", "h0", moved, length, elapsed=elapsed) == expected


# -- the provider, a real trickling HTTP server, the fake pool --------------------------------------------

ANNOUNCED = 3 * 1024**3  # what the server claims; it never sends more than a few MiB
HEAD = qcow2_image(MIB)


@pytest.fixture
async def trickler() -> AsyncIterator[dict[str, object]]:
    state: dict[str, object] = {"url": "", "closed": asyncio.Event(), "sent": 0}
    stop = asyncio.Event()

    async def handle(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(ANNOUNCED)})
        await resp.prepare(req)
        try:
            await resp.write(HEAD)
            state["sent"] = len(HEAD)
            while not stop.is_set():
                await resp.write(b"\0" * 4096)
                state["sent"] = int(state["sent"]) + 4096  # type: ignore[call-overload]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.05)
        except ConnectionError:
            state["closed"].set()  # type: ignore[attr-defined]
        return resp

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}/huge.qcow2"
    yield state
    stop.set()
    await runner.cleanup()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_deleting_the_only_waiting_instance_cancels_the_download_and_deletes_its_volume(
        trickler: dict[str, object]) -> None:
    provider, hv = fake_kvm_provider(images={"huge": {"url": str(trickler["url"])}}, precache=False,
                                     host_kwargs={"pool_capacity": 8 * 1024**3})
    provider._images.limits = ImportLimits(reserve=0)
    provider._images._progress_every = 0.0
    h = hv["host0"]
    base = naming.base_volume(key="huge", url=str(trickler["url"]))
    bytes_before = sample("egress_kvm_image_bytes_fetched_total", host="host0", image="huge")
    cancelled_before = sample("egress_kvm_image_imports_total", host="host0", image="huge",
                              result="cancelled")
    try:
        with pytest.raises(InProgress) as first:
            await provider.create(request(image="huge"))
        for _ in range(200):  # the download is under way: the partial base exists and bytes flowed
            if base in h.volumes and len(h.volumes[base].data) > len(HEAD):
                break
            await asyncio.sleep(0.02)
        with pytest.raises(InProgress) as again:  # the status a waiting Proxy shows: bytes, %, rate
            await provider.create(request(image="huge"))
        shown = str(again.value)
        assert "waiting for image huge on host host0: downloading image huge to host host0: " in shown
        assert "of 3221 MB (0%, " in str(again.value) and "MB/s)" in str(again.value)
        # Counted as they flow, before the import ends.
        assert sample("egress_kvm_image_bytes_fetched_total", host="host0", image="huge") > bytes_before
        await provider.delete("proxy-abc", "host0")  # the Proxy is deleted: nobody waits any more
        await asyncio.wait_for(first.value.wake, 5)  # type: ignore[arg-type]
        await asyncio.wait_for(trickler["closed"].wait(), 10)  # type: ignore[attr-defined]
        for _ in range(100):
            if base not in h.volumes:
                break
            await asyncio.sleep(0.02)
        assert base not in h.volumes and naming.marker_volume(base) not in h.volumes
        assert provider._importer.running() == []
        assert sample("egress_kvm_image_imports_total", host="host0", image="huge",
                      result="cancelled") == cancelled_before + 1
    finally:
        await provider.close()
