"""The simulator's knobs, felt by the real provider through real SSH: boots, a crash, a full pool, a
dead host and its return, and no domain or volume left behind (counted with the control socket)."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from egress_kvm.config import parse_providers
from egress_kvm.providers.base import (
    CreateRequest,
    InProgress,
    Instance,
    Placement,
    PowerState,
    QuotaError,
    TransientError,
)
from egress_kvm.providers.kvm import KvmProvider
from egress_kvm.providers.registry import build_providers
from testbed.sim.control import SimControl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def provider(info: Any) -> KvmProvider:
    doc = yaml.safe_load(Path(info.providers_file).read_text())
    config = parse_providers(doc, source=info.providers_file)
    (built,) = build_providers(config, cluster_id="it-sim-knobs").values()
    assert isinstance(built, KvmProvider)
    return built


def request(p: KvmProvider, name: str, info: Any) -> CreateRequest:
    return CreateRequest(name=name, owner_uid=f"uid-{name}", placement=p.resolve(Placement(zone="host0")),
                         user_data=Path(info.user_data_file).read_bytes(), owner_namespace="it",
                         owner_name=name)


async def create(p: KvmProvider, req: CreateRequest) -> Instance:
    """Create as the controller drives it: while a base image imports it answers InProgress; wait, retry."""
    while True:
        try:
            return await p.create(req)
        except InProgress as e:
            assert e.wake is not None
            await e.wake


async def ip_of(p: KvmProvider, name: str, *, within: float = 20.0) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        inst = await p.get(name, "host0")
        if inst is not None and inst.ip:
            return inst.ip
        await asyncio.sleep(0.2)
    raise AssertionError(f"{name}: no IP within {within}s")


async def test_knobs_reach_the_provider_through_ssh(sim_lab: Any) -> None:
    info = sim_lab
    sim = SimControl(info.hosts[0].sim_control)
    sim.set(boot_delay_s=0.5)
    p = provider(info)
    name, other = "proxy-sk-a", "proxy-sk-b"
    try:
        inst = await create(p, request(p, name, info))
        assert inst.power_state == PowerState.RUNNING
        ip = await ip_of(p, name)
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(info.hosts[0].lan_cidr)

        sim.crash(name)  # QEMU died: shut off, reason crashed; a start brings it back with its address
        assert (await p.get(name, "host0")).power_state == PowerState.STOPPED  # type: ignore[union-attr]
        await p.start(name, "host0")
        assert await ip_of(p, name) == ip

        sim.fill_pool()  # another tenant took the disk: the next create is a quota problem, not a crash
        with pytest.raises(QuotaError):
            await create(p, request(p, other, info))
        sim.free_pool()

        sim.kill()  # the host dies: the provider says transient, never "gone"
        with pytest.raises(TransientError):
            await p.get(name, "host0")
        sim.revive()  # back after a power loss: the persistent domain is there, shut off
        assert (await p.get(name, "host0")).power_state == PowerState.STOPPED  # type: ignore[union-attr]
    finally:
        for n in (name, other):
            await p.delete(n, "host0")
        await p.close()
    state = sim.state()
    assert [d["name"] for d in state["domains"] if d["name"].startswith("proxy-sk")] == []
    assert [v["name"] for v in state["volumes"] if v["name"].startswith("proxy-sk")] == []


async def test_a_malformed_event_costs_the_provider_s_watch_that_event_only(sim_lab: Any) -> None:
    """A daemon's bug (the `malformed_events` knob cuts the next event message short), felt through real SSH
    and the real rpc client: the watch drops that one event (counted), and the guest agent's next event
    still reaches the sink on the same registration: no re-registration, no reconcile of the host. Before,
    the agent stream ended there until the host's connection was re-dialled."""
    from egress_kvm.metrics import LIBVIRT_EVENTS, LIBVIRT_EVENTS_SUBSCRIBED
    from egress_kvm.providers.base import AgentEvent, AgentState, EventsResumed, InstanceChange, InstanceEvent

    info = sim_lab
    sim = SimControl(info.hosts[0].sim_control)
    sim.set(boot_delay_s=0.5)
    p = provider(info)
    name = "proxy-sk-ev"
    got: list[Any] = []

    async def until(check: Any, what: str) -> None:
        """The limit is a safety net, not an assertion about speed."""
        for _ in range(300):
            if check():
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    handle = None
    try:
        await create(p, request(p, name, info))
        await ip_of(p, name)  # booted before the watch: its events are not ours to see
        handle = p.watch_instances(got.append)
        await until(lambda: LIBVIRT_EVENTS_SUBSCRIBED.labels("host0")._value.get() == 1, "the subscription")
        (watcher,) = [w for w in handle.watchers if w.host.name == "host0"]  # type: ignore[attr-defined]
        assert watcher.agent_refused is None
        sim.crash(name)
        await until(lambda: any(isinstance(e, InstanceEvent) and e.change is InstanceChange.STOPPED
                                for e in got), "the crash's STOPPED")
        malformed = LIBVIRT_EVENTS.labels("host0", "agent-malformed")._value.get()
        sim.set(malformed_events=1)
        await p.start(name, "host0")  # agent DISCONNECTED (cut short), STARTED, then the boot's CONNECTED
        await until(lambda: any(isinstance(e, AgentEvent) for e in got), "the agent's CONNECTED")
        assert [e.state for e in got if isinstance(e, AgentEvent)] == [AgentState.CONNECTED]
        assert LIBVIRT_EVENTS.labels("host0", "agent-malformed")._value.get() == malformed + 1
        assert sim.state()["knobs"]["malformed_events"] == 0
        assert watcher.subscriptions == 1  # the same registration throughout
        assert not [e for e in got if isinstance(e, EventsResumed)]
    finally:
        sim.set(malformed_events=0)  # the session's sim lab: a failure here must not cut others' events
        if handle is not None:
            await handle.close()
        await p.delete(name, "host0")
        await p.close()
    assert [d["name"] for d in sim.state()["domains"] if d["name"] == name] == []
