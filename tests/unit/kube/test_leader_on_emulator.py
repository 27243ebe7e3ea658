"""Leader election on a real Lease object (API emulator): one leader, hand-over on release and on expiry."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from egress_kvm.kube.leader import LeaderElector, LeadershipLost, lease_namespace
from egress_kvm.kube.rest import request_json

from .kube_emulator_fixtures import create_namespace, emulator_with_crd

pytestmark = pytest.mark.timeout(60)
NS = "egress-proxies-operator-system"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/egress-kvm.egressproxies.io"
FAST = dict(lease_duration=1.5, renew_deadline=1.0, retry_period=0.2)


def elector(client, identity: str) -> LeaderElector:  # type: ignore[no-untyped-def]
    return LeaderElector(client, namespace=NS, identity=identity, **FAST)


async def test_only_one_leads_and_the_other_takes_over_after_release() -> None:
    async with emulator_with_crd() as (_emu, client):
        await create_namespace(client, NS)
        a, b = elector(client, "a"), elector(client, "b")
        await a.acquire()
        hold_a = asyncio.create_task(a.hold())
        b_acquire = asyncio.create_task(b.acquire())
        await asyncio.sleep(FAST["lease_duration"] * 2)  # a keeps renewing: b must not get in
        assert a.is_leader and not b.is_leader and not b_acquire.done()
        lease = await request_json(client, "GET", LEASE)
        assert lease["spec"]["holderIdentity"] == "a"
        assert lease["spec"]["leaseDurationSeconds"] == 2
        assert lease["spec"]["renewTime"].endswith("Z") and "." in lease["spec"]["renewTime"]
        hold_a.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hold_a
        await a.release()
        assert not a.is_leader
        released = await request_json(client, "GET", LEASE)
        assert released["spec"]["holderIdentity"] == ""
        # b sees the empty holder on its next round: no wait for the lease to expire.
        await asyncio.wait_for(b_acquire, FAST["retry_period"] * 5)
        assert b.is_leader
        taken = await request_json(client, "GET", LEASE)
        assert taken["spec"]["holderIdentity"] == "b"
        assert taken["spec"]["leaseTransitions"] == 1
        await b.release()


async def test_a_crashed_leaders_lease_is_taken_over_once_it_expires() -> None:
    async with emulator_with_crd() as (_emu, client):
        await create_namespace(client, NS)
        a, b = elector(client, "a"), elector(client, "b")
        await a.acquire()  # then a "crashes": it never renews and never releases
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(b.acquire(), 10)
        waited = loop.time() - started
        assert b.is_leader
        # b must have waited for the lease to go unrenewed for a whole duration on its own clock.
        assert waited >= FAST["lease_duration"]
        lease = await request_json(client, "GET", LEASE)
        assert lease["spec"]["holderIdentity"] == "b"


async def test_a_leader_whose_lease_was_taken_stops_leading() -> None:
    async with emulator_with_crd() as (_emu, client):
        await create_namespace(client, NS)
        a = elector(client, "a")
        await a.acquire()
        hold = asyncio.create_task(a.hold())
        # An administrator (or a partitioned peer that saw it expire) hands the lease to someone else.
        lease = await request_json(client, "GET", LEASE)
        lease["spec"]["holderIdentity"] = "intruder"
        await request_json(client, "PUT", LEASE, body=lease)
        with pytest.raises(LeadershipLost):
            await asyncio.wait_for(hold, 5)
        assert not a.is_leader
        await a.release()  # not the holder: must leave the intruder's lease alone
        assert (await request_json(client, "GET", LEASE))["spec"]["holderIdentity"] == "intruder"


async def test_racing_candidates_never_both_lead() -> None:
    async with emulator_with_crd() as (_emu, client):
        await create_namespace(client, NS)
        candidates = [elector(client, f"c{i}") for i in range(4)]
        tasks = [asyncio.create_task(c.acquire()) for c in candidates]
        done, pending = await asyncio.wait(tasks, timeout=3, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.5)
        assert sum(c.is_leader for c in candidates) == 1
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        assert len(done) == 1


def test_lease_namespace_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert lease_namespace("ops", pod_namespace="pod-ns") == "ops"
    assert lease_namespace("", pod_namespace="pod-ns") == "pod-ns"
    assert lease_namespace("", pod_namespace=None) == NS
    monkeypatch.setenv("POD_NAMESPACE", "from-downward-api")
    assert lease_namespace("", pod_namespace=None) == "from-downward-api"


def test_timing_rules_are_checked() -> None:
    with pytest.raises(ValueError, match="retry_period"):
        LeaderElector(None, namespace=NS,  # type: ignore[arg-type]
                      lease_duration=5, renew_deadline=6, retry_period=1)
