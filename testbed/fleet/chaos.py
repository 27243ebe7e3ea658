"""Faults at fleet scale, as a timed plan run beside the Proxies' creation, and the convergence wait after.

The plan (times from the apply): transient RPC failures on every host, hosts killed (power loss: their
running guests are gone) and revived, the operator SIGKILLed and restarted, one host's pool filled (the
next write fails with ENOSPC, as when another tenant fills the disk) and freed, and a share of the
Proxies deleted mid-flight. `converge` then waits until the invariants hold (invariants.py) or a
timeout passes, and returns the last checks either way, so a run prints what did or did not converge.

A fault that hit nothing proves nothing, so the plan records what each one did, read back from the hosts
and processes (`Effects`), and `missing` names every fault without its effect: the hosts' kill waits
(bounded) until each victim runs a guest, so the kill stops guests whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.fleet import invariants
from testbed.fleet.kube import FleetKube
from testbed.fleet.stack import FleetStack


@dataclass
class Effects:
    """What the faults did, as the hosts and processes report it right after each one."""

    guests_stopped: dict[str, int] = field(default_factory=dict)  # killed host -> running guests it lost
    seen_dead: list[str] = field(default_factory=list)  # killed hosts whose state said so after the kill
    seen_revived: list[str] = field(default_factory=list)
    operator_exits: list[int | None] = field(default_factory=list)  # each SIGKILLed operator's returncode
    pool_available_after_fill: int | None = None
    injected_failures: int = 0  # OPERATION_TIMEOUT replies over every host, from the apply to the calm
    deleted: int = 0


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
    kill_wait: float = 300.0  # at most this long past `kill_at` for every victim to run a guest
    log: list[str] = field(default_factory=list)
    effects: Effects = field(default_factory=Effects)

    def killed(self, hosts: list[str]) -> list[str]:
        return hosts[len(hosts) - self.kill_hosts:] if self.kill_hosts else []

    def filled(self, hosts: list[str]) -> str | None:
        live = [h for h in hosts if h not in self.killed(hosts)]
        return live[-1] if self.fill_pool_at is not None and live else None


def missing(plan: ChaosPlan, hosts: list[str], e: Effects) -> list[str]:
    """The plan's faults that show no effect (empty: every fault happened and hit something)."""
    killed, filled = plan.killed(hosts), plan.filled(hosts)
    out = [f"kill {h}: stopped no guest" for h in killed if e.guests_stopped.get(h, 0) < 1]
    out += [f"kill {h}: not seen dead" for h in killed if h not in e.seen_dead]
    out += [f"revive {h}: not seen alive" for h in killed if h not in e.seen_revived]
    if len(e.operator_exits) != len(plan.operator_kills) or \
            any(rc != -signal.SIGKILL for rc in e.operator_exits):
        out.append(f"operator SIGKILLs: {len(plan.operator_kills)} planned, exits seen {e.operator_exits}")
    if filled is not None and e.pool_available_after_fill != 0:
        out.append(f"fill {filled}: {e.pool_available_after_fill} bytes still available")
    if plan.fail_rate and e.injected_failures < 1:
        out.append("transient failures: none answered")
    if plan.delete_share and e.deleted < 1:
        out.append("mid-flight deletes: none")
    return out


async def run_plan(plan: ChaosPlan, stack: FleetStack, kube: FleetKube, *, t0: float,
                   to_delete: list[str], on_deleted: Callable[[list[str]], None]) -> None:
    hosts = stack.host_names
    killed, filled = plan.killed(hosts), plan.filled(hosts)
    e = plan.effects

    def note(what: str, detail: object = "") -> None:
        plan.log.append(f"t+{time.monotonic() - t0:6.1f}s {what} {detail}".rstrip())

    async def failures() -> int:
        return sum(st["errors"].get("OPERATION_TIMEOUT", 0) for st in (await stack.host_states()).values())

    async def outage() -> None:
        """Kill the victims once each runs a guest (or `kill_wait` passes), revive them `kill_for` later."""
        if not killed:
            return
        await asyncio.sleep(max(0.0, t0 + plan.kill_at - time.monotonic()))
        deadline = time.monotonic() + plan.kill_wait
        while time.monotonic() < deadline:
            states = await stack.host_states()
            if all(any(d["state"] == "running" for d in states[h]["domains"]) for h in killed):
                break
            await asyncio.sleep(0.2)
        replies = await asyncio.gather(*(stack.sim(h).request("kill") for h in killed))
        e.guests_stopped = {h: r["stopped"] for h, r in zip(killed, replies, strict=True)}
        states = await stack.host_states()
        e.seen_dead = [h for h in killed if states[h]["killed"]]
        note("kill", e.guests_stopped)
        await asyncio.sleep(plan.kill_for)
        await asyncio.gather(*(stack.sim(h).request("revive") for h in killed))
        states = await stack.host_states()
        e.seen_revived = [h for h in killed if not states[h]["killed"]]
        note("revive", killed)

    async def timeline() -> None:
        steps: list[tuple[float, str]] = [(0.0, "fail"), (plan.delete_at, "delete"), (plan.calm_at, "calm")]
        steps += [(t, "operator") for t in plan.operator_kills]
        if filled is not None and plan.fill_pool_at is not None:
            steps += [(plan.fill_pool_at, "fill"), (plan.free_pool_at, "free")]
        failed_before = await failures()
        for at, what in sorted(steps):
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            if what == "fail" and plan.fail_rate:
                await stack.set_knobs(fail_rate=plan.fail_rate)
                note(what, plan.fail_rate)
            elif what == "delete" and to_delete:
                on_deleted(to_delete)
                await kube.delete_all(to_delete)
                e.deleted += len(to_delete)
                note(what, f"{len(to_delete)} Proxies")
            elif what == "calm":
                await stack.set_knobs(fail_rate=0.0)
                e.injected_failures = await failures() - failed_before
                note(what, f"({e.injected_failures} transient failures answered)")
            elif what == "operator":
                old = stack.operator
                await asyncio.to_thread(stack.kill_operator)
                e.operator_exits.append(old.proc.returncode)
                note("operator SIGKILL", f"(exit {old.proc.returncode})")
            elif what == "fill" and filled:
                await stack.sim(filled).request("fill_pool")
                e.pool_available_after_fill = (await stack.sim(filled).request("state"))["pool"]["available"]
                note(what, filled)
            elif what == "free" and filled:
                await stack.sim(filled).request("free_pool")
                note(what, filled)

    await asyncio.gather(outage(), timeline())


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
