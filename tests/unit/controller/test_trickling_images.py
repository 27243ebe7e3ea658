"""Slow image servers cannot stall the operator (issue 13 item 3, issue 9 item 3).

Four real aiohttp servers on loopback trickle a byte a second, one per URL image, so four Proxies wait on
four imports while the controller runs the usual four workers. Before image imports moved off the
workers, those four creates held every worker and nothing else moved; now each waits in status
(Provisioning, "waiting for image ...") while a delete and a Proxy on a cached image complete.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from fakes import fake_kvm_provider

from egress_kvm.providers.kvm import addresses, eviction

from .conftest import eventually
from .fakekube import FakeKube
from .proxyserver import MiniProxy
from .test_with_kvm_provider import PROVIDER, instance_volumes, kvm_spec

TRICKLERS = 4


class Trickler:
    """An HTTP server that answers 200 with a large Content-Length and then sends one byte a second."""

    def __init__(self) -> None:
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.stop = asyncio.Event()
        self.requests = 0
        self.hung_up = asyncio.Event()  # the operator closed the connection

    async def start(self) -> None:
        async def handle(req: web.Request) -> web.StreamResponse:
            self.requests += 1
            resp = web.StreamResponse(headers={"Content-Length": str(64 * 1024 * 1024)})
            await resp.prepare(req)
            while not self.stop.is_set():
                try:
                    await resp.write(b"Q")
                except ConnectionError:  # the operator gave up on it
                    self.hung_up.set()
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 1.0)
            return resp

        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/image.qcow2"

    async def close(self) -> None:
        self.stop.set()
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def tricklers() -> AsyncIterator[list[Trickler]]:
    servers = [Trickler() for _ in range(TRICKLERS)]
    for s in servers:
        await s.start()
    yield servers
    for s in servers:
        await s.close()


def phase(kube: FakeKube, name: str) -> str:
    return str((kube.objects.get(("default", name), {}).get("status") or {}).get("phase", ""))


def message(kube: FakeKube, name: str) -> str:
    return str((kube.objects.get(("default", name), {}).get("status") or {}).get("message", ""))


async def test_four_trickling_image_servers_do_not_hold_the_workers(
        kube: FakeKube, proxy_server: MiniProxy, make_controller, tricklers: list[Trickler],
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = addresses.usable_ipv4
    monkeypatch.setattr(addresses, "usable_ipv4", lambda a: a.startswith("127.") or real(a))
    provider, hv = fake_kvm_provider(hosts=["host0"], cluster_id="c1", urlImages=["127.0.0.1/32"])
    h = hv["host0"]
    try:
        make_controller({PROVIDER: provider}, workers=4)
        # One Proxy Ready on the cached image first: it is deleted while the imports trickle.
        kube.create_proxy("old", kvm_spec(proxy_server))
        await eventually(lambda: ((kube.objects.get(("default", "old"), {}).get("status") or {})
                                  .get("instance") or {}).get("name") in h.domains, what="old defined")
        old_name = kube.objects[("default", "old")]["status"]["instance"]["name"]
        h.set_vm_ip(old_name, "127.0.0.1")
        await eventually(lambda: phase(kube, "old") == "Ready", what="old Ready")

        for i, srv in enumerate(tricklers):
            placement = {"zone": "host0", "machineType": "small", "image": srv.url}
            spec = kvm_spec(proxy_server, placement=placement)
            kube.create_proxy(f"slow{i}", spec)
        await eventually(lambda: sum(s.requests for s in tricklers) == 2, what="two imports started")
        await eventually(lambda: all("waiting for image" in message(kube, f"slow{i}")
                                     for i in range(TRICKLERS)), what="every slow Proxy waiting")
        assert all(phase(kube, f"slow{i}") == "Provisioning" for i in range(TRICKLERS))

        kube.delete(("default", "old"))
        kube.create_proxy("new", kvm_spec(proxy_server, cloudInit={"userData": "#cloud-config\n{}\n"}))
        await eventually(lambda: ("default", "old") not in kube.objects, what="old deleted")
        assert old_name not in h.domains and instance_volumes(h, old_name) == set()
        await eventually(lambda: ((kube.objects.get(("default", "new"), {}).get("status") or {})
                                  .get("instance") or {}).get("name") in h.domains, what="new defined")
        h.set_vm_ip(kube.objects[("default", "new")]["status"]["instance"]["name"], "127.0.0.1")
        await eventually(lambda: phase(kube, "new") == "Ready", what="new Ready")
        # The imports are still trickling (nothing finished them), two at a time: the global cap.
        assert sorted(s.requests for s in tricklers) == [0, 0, 1, 1]
        assert all(phase(kube, f"slow{i}") == "Provisioning" for i in range(TRICKLERS))
    finally:
        await provider.close()



async def test_deleting_the_only_proxy_waiting_on_an_import_cancels_it_and_frees_its_slot(
        kube: FakeKube, proxy_server: MiniProxy, make_controller, tricklers: list[Trickler]) -> None:
    """Issue 9 item 3: the Proxy's deletion (through the finalizer, which deletes its recorded instance)
    leaves the import; nobody waits any more, so it is cancelled, its connection closed, and the import
    queued behind it for a slot starts. (A partial volume deleted on cancel: test_import_waiters.py.)"""
    provider, hv = fake_kvm_provider(hosts=["host0"], cluster_id="c1", urlImages=["127.0.0.1/32"])
    h = hv["host0"]
    try:
        make_controller({PROVIDER: provider}, workers=4)
        for i, srv in enumerate(tricklers[:3]):
            placement = {"zone": "host0", "machineType": "small", "image": srv.url}
            kube.create_proxy(f"slow{i}", kvm_spec(proxy_server, placement=placement))
            if i < 2:  # started in this order: the third waits for one of the two slots
                await eventually(lambda srv=srv: srv.requests == 1, what=f"slow{i}'s import started")
        await eventually(lambda: "queued for an import slot" in message(kube, "slow2"), what="slow2 queued")
        assert tricklers[2].requests == 0
        kube.delete(("default", "slow0"))
        await eventually(lambda: ("default", "slow0") not in kube.objects, what="slow0 deleted")
        await asyncio.wait_for(tricklers[0].hung_up.wait(), 10)
        await eventually(lambda: tricklers[2].requests == 1, what="slow2's import took the freed slot")
        assert tricklers[1].requests == 1 and not tricklers[1].hung_up.is_set()  # slow1's import runs on
        assert not [v for v in h.volumes if eviction.is_url_base(v)]  # (a byte a second: none written yet)
        assert all(phase(kube, n) == "Provisioning" for n in ("slow1", "slow2"))
    finally:
        await provider.close()
