"""The Lease renewals' own API client (kube/client.py own_pool) through the real Operator wiring: the elector
uses it, not the workers' pool; the lease is released through it before it closes; and it is closed on
every way out (a stop as leader or as a standby, a cancel, a failed election)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kube.kube_emulator_fixtures import create_namespace, emulator_with_crd

from egress_kvm.kube import client as kube_client
from egress_kvm.kube.api import micro_time
from egress_kvm.kube.k8s import ApiClient
from egress_kvm.kube.leader import LeaderElector
from egress_kvm.kube.rest import request_json
from egress_kvm.operator import process
from egress_kvm.operator.flags import Options
from egress_kvm.operator.process import Operator

pytestmark = pytest.mark.timeout(60)
NS = "egress-proxies-operator-system"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
LEASE = f"{LEASES}/egress-kvm.egressproxies.io"

Made = list[tuple[ApiClient, ApiClient]]  # (the client own_pool was given, the one it made)


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Made:
    """Every client the operator makes through own_pool, with the one it was made from."""
    seen: Made = []

    def spy(api_client: ApiClient) -> ApiClient:
        other = kube_client.own_pool(api_client)
        seen.append((api_client, other))
        return other

    monkeypatch.setattr(process, "own_pool", spy)
    return seen


def closed(client: ApiClient) -> bool:
    return bool(client.rest_client.pool_manager.closed)


async def _until(pred: Callable[[], bool], task: asyncio.Task[int], within: float = 20.0) -> None:
    async with asyncio.timeout(within):
        while not pred():
            if task.done():
                raise AssertionError(f"operator exited: {task.result()}")
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _operator(tmp_path: Path, emu: Any) -> AsyncIterator[tuple[Operator, asyncio.Task[int]]]:
    providers = tmp_path / "providers.yaml"
    providers.write_text("providers: []\n")
    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
    op = Operator(Options(kubeconfig=str(kubeconfig), providers_config=str(providers), cluster_id="test",
                          metrics_bind_address=None, health_probe_bind_address=None, leader_elect=True,
                          leader_election_namespace=NS, graceful_shutdown_timeout=1.0))
    task = asyncio.create_task(op.run())
    try:
        yield op, task
    finally:  # a failed assertion must not leave it running against a stopped emulator
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def api() -> AsyncIterator[tuple[Any, ApiClient]]:
    async with emulator_with_crd() as (emu, client):
        await create_namespace(client, NS)
        yield emu, client


async def test_the_leader_renews_on_its_own_pool_and_releases_before_closing_it(
        tmp_path: Path, api: tuple[Any, ApiClient], made: Made) -> None:
    emu, client = api
    async with _operator(tmp_path, emu) as (op, task):
        await _until(lambda: "leader" in op._tasks and "controller" in op._tasks, task)
        assert len(made) == 1
        main, lease_client = made[0]
        assert op.elector is not None and op.elector._api is lease_client
        assert lease_client.rest_client.pool_manager is not main.rest_client.pool_manager
        assert op.kube is not None and op.kube._api_client is main  # the workers keep the main pool
        assert (await request_json(client, "GET", LEASE))["spec"]["holderIdentity"] == op.elector.identity

        op.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
    # Released through the lease client (a closed one would have raised), then both closed.
    assert (await request_json(client, "GET", LEASE))["spec"]["holderIdentity"] == ""
    assert closed(lease_client) and closed(main)


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_a_standby_leaving_closes_its_lease_client_and_leaves_the_lease_alone(
        tmp_path: Path, api: tuple[Any, ApiClient], made: Made, how: str) -> None:
    emu, client = api
    now = micro_time()
    await request_json(client, "POST", LEASES, body={
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "egress-kvm.egressproxies.io", "namespace": NS},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600, "acquireTime": now,
                 "renewTime": now, "leaseTransitions": 0}})
    async with _operator(tmp_path, emu) as (op, task):
        # a standby: it has read the lease someone else holds
        await _until(lambda: op.elector is not None and op.elector._observed is not None, task)
        lease_client = made[0][1]
        assert not closed(lease_client)
        if how == "stop":  # SIGTERM while a standby
            op.request_stop()
            assert await asyncio.wait_for(task, 30) == 0
        else:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
    assert "controller" not in op._tasks
    assert closed(lease_client) and closed(made[0][0])
    assert (await request_json(client, "GET", LEASE))["spec"]["holderIdentity"] == "someone-else"


async def test_a_failed_election_exits_1_and_closes_the_lease_client(
        tmp_path: Path, api: tuple[Any, ApiClient], made: Made, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(self: LeaderElector) -> None:
        raise RuntimeError("a bug in the election")

    monkeypatch.setattr(LeaderElector, "acquire", broken)
    emu, _client = api
    async with _operator(tmp_path, emu) as (op, task):
        assert await asyncio.wait_for(task, 30) == 1
    assert "controller" not in op._tasks
    assert len(made) == 1 and closed(made[0][1]) and closed(made[0][0])
