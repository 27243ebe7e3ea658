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
from egress_kvm.providers.base import CreateRequest, Placement, PowerState, QuotaError, TransientError
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
        inst = await p.create(request(p, name, info))
        assert inst.power_state == PowerState.RUNNING
        ip = await ip_of(p, name)
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(info.hosts[0].lan_cidr)

        sim.crash(name)  # QEMU died: shut off, reason crashed; a start brings it back with its address
        assert (await p.get(name, "host0")).power_state == PowerState.STOPPED  # type: ignore[union-attr]
        await p.start(name, "host0")
        assert await ip_of(p, name) == ip

        sim.fill_pool()  # another tenant took the disk: the next create is a quota problem, not a crash
        with pytest.raises(QuotaError):
            await p.create(request(p, other, info))
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
