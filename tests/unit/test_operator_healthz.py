"""/healthz through the real Operator wiring: it fails, naming the loop, once the informer, the
controller or the providers poller has died (never a zombie that answers probes but does nothing)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from kube.kube_emulator_fixtures import create_proxy, emulator_with_crd

from egress_kvm.kube.rest import request_json
from egress_kvm.operator.flags import BindAddress, Options
from egress_kvm.operator.process import Operator

pytestmark = pytest.mark.timeout(60)


async def _get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


async def _until(pred, within: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(within):
        while True:
            if await pred():
                return
            await asyncio.sleep(0.05)


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[Operator, int]]:
    providers = tmp_path / "providers.yaml"
    providers.write_text("providers: []\n")
    async with emulator_with_crd() as (emu, _client):
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
        op = Operator(Options(kubeconfig=str(kubeconfig), providers_config=str(providers),
                              cluster_id="test-cluster", metrics_bind_address=None,
                              health_probe_bind_address=BindAddress("127.0.0.1", 0),
                              providers_poll_interval=0.5, graceful_shutdown_timeout=1.0))
        task = asyncio.create_task(op.run())

        async def up() -> bool:
            if task.done():
                raise AssertionError(f"operator exited: {task.result()}")
            return op.health_server is not None and op.health_server.bound is not None and \
                "controller" in op._tasks and op.informer is not None and op.informer.has_synced()

        await _until(up)
        assert op.health_server is not None and op.health_server.bound is not None
        port = op.health_server.bound[1]
        assert await _get(port, "/healthz") == (200, "ok")
        try:
            yield op, port
        finally:
            op.request_stop()
            assert await asyncio.wait_for(task, 30) == 0


@pytest.mark.parametrize(("task", "line"), [
    ("informer", "[-]informer failed: informer was cancelled"),
    ("controller", "[-]controller failed: controller was cancelled"),
    ("providers-poller", "[-]providers failed: providers-poller was cancelled"),
])
async def test_healthz_fails_when_a_loop_dies(running: tuple[Operator, int], task: str, line: str) -> None:
    op, port = running
    op._tasks[task].cancel()  # the loop is gone, as if it had crashed; the process keeps running

    async def failing() -> bool:
        return (await _get(port, "/healthz"))[0] == 500

    await _until(failing)
    status, body = await _get(port, "/healthz")
    assert status == 500 and line in body.splitlines(), body
    assert body.rstrip().endswith("/healthz check failed")


async def test_healthz_fails_when_the_informer_dies_of_an_error(running: tuple[Operator, int]) -> None:
    op, port = running
    assert op.informer is not None
    op.informer._died = RuntimeError("watch loop crashed")  # what run() records before re-raising

    status, body = await _get(port, "/healthz")
    assert status == 500 and "[-]informer failed: the Proxy watch died" in body.splitlines(), body


Running = tuple[aiohttp.ClientSession, Operator, "asyncio.Task[int]"]


@contextlib.asynccontextmanager
async def _operator_with_a_queued_event(tmp_path: Path, reason: str) -> AsyncIterator[Running]:
    """The real Operator running against the emulator, with one Event just handed to its recorder."""
    providers = tmp_path / "providers.yaml"
    providers.write_text("providers: []\n")
    async with emulator_with_crd() as (emu, client):
        obj = await create_proxy(client, "p", provider="nope")  # goes Failed: one Event at least
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
        op = Operator(Options(kubeconfig=str(kubeconfig), providers_config=str(providers),
                              cluster_id="test-cluster", metrics_bind_address=None,
                              health_probe_bind_address=None, graceful_shutdown_timeout=1.0))
        task = asyncio.create_task(op.run())

        async def up() -> bool:
            if task.done():
                raise AssertionError(f"operator exited: {task.result()}")
            return op.kube is not None and "controller" in op._tasks

        await _until(up)
        assert op.kube is not None
        await op.kube.record_event(obj, type_="Normal", reason=reason, message="queued")
        yield client, op, task


def _senders() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("event sender")]


async def test_stop_writes_the_queued_events_and_leaves_no_sender(tmp_path: Path) -> None:
    """The Event senders are part of the process's lifetime: stopped (after a drain) before it exits."""
    async with _operator_with_a_queued_event(tmp_path, "JustBeforeStop") as (client, op, task):
        op.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        assert _senders() == []
        events = (await request_json(client, "GET", "/api/v1/namespaces/default/events"))["items"]
        assert "JustBeforeStop" in {e["reason"] for e in events}


async def test_a_cancelled_operator_leaves_no_sender(tmp_path: Path) -> None:
    """Cancelled instead of stopped (asyncio.run unwinding on Ctrl-C, an embedding caller giving up): the
    Event senders still end with it."""
    async with _operator_with_a_queued_event(tmp_path, "JustBeforeCancel") as (_client, _op, task):
        senders = _senders()
        assert senders  # started by the Event above
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        assert all(t.done() for t in senders)
