"""Faults at fleet scale, as a timed plan run beside the Proxies' creation, and the convergence wait after.

The plan (times from the apply): transient RPC failures on every host, hosts killed (power loss: their
running guests are gone) and revived, the operator SIGKILLed and restarted, one host's pool filled (the
next write fails with ENOSPC, as when another tenant fills the disk) and freed, and a share of the
Proxies deleted mid-flight. `converge` then waits until the invariants hold (invariants.py) or a
timeout passes, and returns the last checks either way, so a run prints what did or did not converge.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.fleet import invariants
from testbed.fleet.kube import FleetKube
from testbed.fleet.stack import FleetStack


@dataclass
class ChaosPlan:
    fail_rate: float = 0.05  # share of RPCs answered with a transient error, from the apply to `calm_at`
    kill_hosts: int = 2
    kill_at: float = 5.0
    kill_for: float = 60.0
    operator_kills: tuple[float, ...] = (10.0, 35.0)
    fill_pool_at: float | None = 3.0  # one live host's pool is filled here ...
    free_pool_at: float = 45.0  # ... and freed here
    delete_share: float = 0.1  # of the Proxies, deleted at `delete_at` (spread over every host)
    delete_at: float = 20.0
    calm_at: float = 70.0  # transient failures stop (after the hosts are back)
    log: list[str] = field(default_factory=list)

    def killed(self, hosts: list[str]) -> list[str]:
        return hosts[len(hosts) - self.kill_hosts:] if self.kill_hosts else []

    def filled(self, hosts: list[str]) -> str | None:
        live = [h for h in hosts if h not in self.killed(hosts)]
        return live[-1] if self.fill_pool_at is not None and live else None


async def run_plan(plan: ChaosPlan, stack: FleetStack, kube: FleetKube, *, t0: float,
                   to_delete: list[str], on_deleted: Callable[[list[str]], None]) -> None:
    hosts = stack.host_names
    killed, filled = plan.killed(hosts), plan.filled(hosts)
    steps: list[tuple[float, str]] = [(0.0, "fail"), (plan.kill_at, "kill"),
                                      (plan.kill_at + plan.kill_for, "revive"), (plan.delete_at, "delete"),
                                      (plan.calm_at, "calm")]
    steps += [(t, "operator") for t in plan.operator_kills]
    if filled is not None and plan.fill_pool_at is not None:
        steps += [(plan.fill_pool_at, "fill"), (plan.free_pool_at, "free")]
    for at, what in sorted(steps):
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        if what == "fail" and plan.fail_rate:
            await stack.set_knobs(fail_rate=plan.fail_rate)
        elif what == "kill" and killed:
            await asyncio.gather(*(stack.sim(h).request("kill") for h in killed))
        elif what == "revive" and killed:
            await asyncio.gather(*(stack.sim(h).request("revive") for h in killed))
        elif what == "delete" and to_delete:
            on_deleted(to_delete)
            await kube.delete_all(to_delete)
        elif what == "calm":
            await stack.set_knobs(fail_rate=0.0)
        elif what == "operator":
            await asyncio.to_thread(stack.kill_operator)
        elif what == "fill" and filled:
            await stack.sim(filled).request("fill_pool")
        elif what == "free" and filled:
            await stack.sim(filled).request("free_pool")
        else:
            continue
        detail = {"kill": killed, "revive": killed, "fill": filled, "free": filled,
                  "delete": f"{len(to_delete)} Proxies", "fail": plan.fail_rate}.get(what, "")
        plan.log.append(f"t+{time.monotonic() - t0:6.1f}s {what} {detail}".rstrip())


async def snapshot(stack: FleetStack, kube: FleetKube, *, expected: set[str], deleted: set[str],
                   zones: dict[str, str]) -> invariants.Snapshot:
    """The API's Proxies (a fresh list, not the watch's view) and every host's simulator state."""
    from testbed.fleet.kube import ProxyView

    items, _ = await kube.list()
    states = await stack.host_states()
    return invariants.Snapshot(
        proxies={o["metadata"]["name"]: ProxyView.of(o) for o in items}, expected=expected, deleted=deleted,
        alive_hosts={h for h, st in states.items() if not st["killed"]}, zones=zones, hosts=states)


async def converge(stack: FleetStack, kube: FleetKube, *, expected: set[str], deleted: set[str],
                   zones: dict[str, str], within: float, interval: float = 5.0) -> list[invariants.Check]:
    deadline = time.monotonic() + within
    while True:
        snap = await snapshot(stack, kube, expected=expected, deleted=deleted, zones=zones)
        checks = invariants.check(snap)
        if all(c.ok for c in checks) or time.monotonic() >= deadline:
            return checks
        await asyncio.sleep(interval)


async def drain(stack: FleetStack, *, within: float, interval: float = 1.0
                ) -> tuple[invariants.Check, float]:
    """Wait until no host holds a domain or a non-base volume; the last check and the seconds it took."""
    t0 = time.monotonic()
    while True:
        c = invariants.empty_hosts(await stack.host_states())
        if c.ok or time.monotonic() - t0 >= within:
            return c, time.monotonic() - t0
        await asyncio.sleep(interval)
