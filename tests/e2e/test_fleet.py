"""The fleet under chaos, reduced for CI (issue 8): the real operator process, the API emulator and 3
simulated hypervisors behind real sshd (testbed/fleet), 100 Proxies applied at once while one host is
killed and revived, the operator is SIGKILLed and restarted, 5% of libvirt calls fail transiently,
another host's pool is filled and freed, and 10 Proxies are deleted mid-flight.

Asserted (the invariants, never timings): every planned fault took effect (the killed host lost running
guests, the operator exited by SIGKILL, the pool read full, transient failures were answered); every
remaining Proxy is Ready with a running domain on its host, every deleted Proxy is gone, no host holds a
domain or volume that no Proxy owns, nor a half-imported base; then, after deleting every Proxy, every
host is empty but for its base image. The checks print with their counts
(`pytest -s`). bench/fleet.py --chaos is the full-size run (1,000 Proxies over 10 hosts).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from testbed import lab as labmod
from testbed.fleet import chaos, invariants
from testbed.fleet.kube import FleetKube, proxy_doc
from testbed.fleet.stack import IMAGE_KEY, FleetStack, StackConfig
from tests.envknobs import lab_index

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

PROXIES, HOSTS = 100, 3
CONVERGE_WITHIN = 600  # a create that failed waits out its backoff; a host back from the dead re-dials


def chaos_plan() -> chaos.ChaosPlan:
    """A fresh plan per run: it records what its faults did (a rerun must not see the last run's)."""
    return chaos.ChaosPlan(fail_rate=0.05, kill_hosts=1, kill_at=5, kill_for=30, operator_kills=(15,),
                           fill_pool_at=3, free_pool_at=40, delete_share=0.1, delete_at=10, calm_at=45)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    reason = labmod.unavailable_reason()
    if reason:
        pytest.skip(reason)
    stack = FleetStack(tmp_path_factory.mktemp("fleet"),
                       StackConfig(hosts=HOSTS, boot_delay_s=2.0, resync_period="60s", gc_interval="10s",
                                   gc_grace_period="30s", index=lab_index()))
    try:
        stack.start()
        yield stack
    finally:
        print(f"\nfleet logs: {stack.workdir}")
        stack.teardown()


async def run(stack: FleetStack, plan: chaos.ChaosPlan
              ) -> tuple[list[invariants.Check], invariants.Check, list[invariants.Check]]:
    assert stack.lab is not None
    names = [f"fleet-{i:03d}" for i in range(PROXIES)]
    zones = {n: stack.host_names[i % HOSTS] for i, n in enumerate(names)}
    targets = {h.name: h.http_target for h in stack.lab.hosts}
    kube = FleetKube(stack.api_url, in_flight=16)
    expected, deleted = set(names), set[str]()

    def on_deleted(batch: list[str]) -> None:
        expected.difference_update(batch)
        deleted.update(batch)

    try:
        t0 = time.monotonic()
        plan_task = asyncio.get_running_loop().create_task(chaos.run_plan(
            plan, stack, kube, t0=t0, to_delete=names[::10], on_deleted=on_deleted))
        await kube.create_all([proxy_doc(n, zone=zones[n], target=targets[zones[n]], interval_s=5,
                                         image=IMAGE_KEY) for n in names])
        await plan_task
        print("\nchaos plan as run:\n  " + "\n  ".join(plan.log))
        converged = await chaos.converge(stack, kube, expected=expected, deleted=deleted, zones=zones,
                                         within=CONVERGE_WITHIN)
        await kube.delete_all(sorted(expected))
        # until every Proxy is gone from the API (its finalizer goes after its VM) and no host holds a
        # domain or a volume (with no Proxy left, every one counts as a leak): then the hosts' final look
        after = await chaos.converge(stack, kube, expected=set(), deleted=set(names), zones=zones,
                                     within=300, interval=1.0)
        empty, _ = await chaos.drain(stack, within=30)
        return converged, empty, after
    finally:
        await kube.close()


def test_fleet_chaos_invariants(fleet: FleetStack) -> None:
    plan = chaos_plan()
    converged, empty, after = asyncio.run(run(fleet, plan))
    print("invariants after the chaos plan:\n  " + "\n  ".join(c.line() for c in converged))
    print("after deleting every Proxy:\n  " + "\n  ".join(c.line() for c in [empty, *after]))
    # the chaos happened and hit something: the host kill stopped guests, the operator exited by our
    # SIGKILL, the pool read full, transient failures were answered (chaos.missing, a table in unit tests)
    assert chaos.missing(plan, fleet.host_names, plan.effects) == [], plan.effects
    assert len(fleet.operators) == 2 and fleet.operator.running()
    assert [c.line() for c in converged if not c.ok] == []
    assert {c.name: c.looked_at for c in converged}["expected Proxies on live hosts not Ready"] == 90
    assert empty.ok, empty.line()
    assert [c.line() for c in after if not c.ok] == []

