"""Guests that never settle cost less and less: one that keeps stopping (a panic at boot; libvirt's
default on_crash destroys it, so it shows as shut off) is started again on a growing delay, with Events
on the 1st, 2nd, 4th... start, not every poll; one whose network never comes up is polled less often."""

from __future__ import annotations

import asyncio
import dataclasses

from egress_kvm.providers.base import PowerState

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, phase, spec_for


async def test_a_vm_that_keeps_stopping_is_restarted_on_a_growing_delay(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({"kvm-home": provider})  # poll 0.02 s: 1 s is 50 polls
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    real_get = provider.get

    async def get(name, zone, *, owner_uid=None):  # the guest powers itself off right after every start
        inst = await real_get(name, zone, owner_uid=owner_uid)
        return dataclasses.replace(inst, power_state=PowerState.STOPPED) if inst else None

    provider.get = get  # type: ignore[method-assign]
    c.enqueue(KEY)
    await asyncio.sleep(1.0)
    starts = sum(1 for op, _ in provider.calls if op == "start")
    restarted = [m for _t, r, m in kube.events_for("px1") if r == "Restarted"]
    assert 3 <= starts <= 7  # 0.02, 0.04, 0.08, 0.16, 0.32 s apart: not one per poll
    assert len(restarted) == starts.bit_length()  # the 1st, 2nd, 4th... start
    assert "started 2 times since it was last Ready" in restarted[1]

    provider.get = real_get  # type: ignore[method-assign]  # the guest stays up now
    c.enqueue(KEY)
    # Ready ends the streak: the next stop is told at once again.
    await eventually(lambda: phase(kube) == "Ready" and c.reconciler.memory.peek(KEY).restarts == 0)


async def test_a_vm_that_never_gets_an_ip_is_looked_at_less_and_less_often(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    from egress_kvm.controller.reconciler import Timings

    provider.ip_for = lambda name: None  # the guest's network never comes up
    c = make_controller({"kvm-home": provider}, timings=Timings(
        poll=0.02, pending_retry=0.05, progress_interval=0.0, ip_wait_polls=5, ip_wait_max=0.4))
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: "waiting for the IP address" in kube.status(KEY).get("message", ""))
    await asyncio.sleep(1.5)  # 75 polls at a steady 0.02 s
    gets = sum(1 for op, _ in provider.calls if op == "get")
    assert gets <= 20, f"{gets} provider round trips while waiting for an IP"
    name = kube.status(KEY)["instance"]["name"]
    provider.vms[("nas1", name)] = dataclasses.replace(provider.vms[("nas1", name)], ip="127.0.0.1")
    await eventually(lambda: phase(kube) == "Ready" and c.reconciler.memory.peek(KEY).ip_waits == 0)
