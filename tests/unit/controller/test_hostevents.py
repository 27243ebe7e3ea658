"""Host lifecycle events drive reconciles (issue 9 item 1): which Proxy an event concerns (a table over
the cached Proxies' status), and the controller over the real KvmProvider and the fake libvirt: a VM
destroyed or paused behind the operator's back is repaired on the event, with no probe, refresh or
resync to wake it. A guest agent that connects wakes the look for its address (agent_wakes, a table), the
IP timer staying the fallback."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from fakes import FakeHypervisors

from egress_kvm.backoff import Backoff
from egress_kvm.controller.hostevents import agent_wakes, keys_for, wakes_now
from egress_kvm.controller.planner import Timings
from egress_kvm.providers.base import AgentState
from egress_kvm.providers.kvm import KvmProvider

from .conftest import eventually
from .fakekube import FakeKube
from .proxyserver import MiniProxy
from .test_lifecycle import phase
from .test_with_kvm_provider import KEY, PROVIDER, boot, kvm_spec
from .test_with_kvm_provider import kvm as kvm  # the fixture, reused


def px(name: str, **status: object) -> tuple[tuple[str, str], dict]:
    return ("ns", name), {"status": status}


A = {"name": "proxy-a", "zone": "host0", "provider": "p"}
CACHE = [
    px("one", instance=A),
    px("replacing", instance={"name": "proxy-new", "zone": "host1", "provider": "p"},
       previousInstance={"name": "proxy-old", "zone": "host0", "provider": "p"}),
    px("legacy", instance={"name": "proxy-l", "zone": "host0"}),  # written before `provider` existed
    px("other-provider", instance={"name": "proxy-a", "zone": "host0", "provider": "q"}),
    px("no-status"),
    (("ns", "not-in-cache-any-more"), None),
]


@pytest.mark.parametrize(("provider", "zone", "name", "keys"), [
    ("p", "host0", "proxy-a", ["one"]),
    ("q", "host0", "proxy-a", ["other-provider"]),
    ("p", "host1", "proxy-a", []),  # the same name on another zone is not that instance
    ("p", "host0", "proxy-old", ["replacing"]),  # the instance a replacement retires
    ("p", "host1", "proxy-new", ["replacing"]),
    ("p", "host0", "proxy-l", ["legacy"]),
    ("p", "host0", "proxy-someone-elses", []),  # another cluster's, or nobody's: no Proxy records it
    ("p", "host0", None, ["one", "replacing", "legacy"]),  # every Proxy on the zone (after a gap)
])
def test_keys_for(provider: str, zone: str, name: str | None, keys: list[str]) -> None:
    got = keys_for(provider=provider, zone=zone, name=name, proxies=CACHE)
    assert [k[1] for k in got] == keys


@pytest.mark.parametrize(("failures", "restarts", "now"), [
    (0, 0, True),  # a Ready (or healthy) Proxy's VM changed: repair at once
    (1, 0, False),  # its reconciles are failing: our own cleanup's events must not bypass the backoff
    (0, 1, False),  # started again since it was last Ready: a crash loop keeps its growing restart delay
    (3, 2, False),
])
def test_wakes_now(failures: int, restarts: int, now: bool) -> None:
    assert wakes_now(failures=failures, restarts=restarts) is now


C, D = AgentState.CONNECTED, AgentState.DISCONNECTED


@pytest.mark.parametrize(("state", "target", "ip_waits", "failures", "wakes"), [
    (C, True, 1, 0, True),  # booting, on the IP timer: look now
    (C, True, 7, 0, True),  # many looks in (a slow guest, or the timer's doubling delay): look now
    (C, True, 0, 0, False),  # not waiting for an address (Ready, or its first look still to come)
    (C, False, 1, 0, False),  # the instance a replacement retires, not the one waited for
    (C, True, 1, 1, False),  # its reconciles are failing: the backoff decides
    (D, True, 1, 0, False),  # the agent went away: nothing to look for
    (D, True, 0, 0, False),
])
def test_agent_wakes(state: AgentState, target: bool, ip_waits: int, failures: int, wakes: bool) -> None:
    assert agent_wakes(state=state, target=target, ip_waits=ip_waits, failures=failures) is wakes


async def test_an_agent_connecting_wakes_the_look_for_its_address_and_replaces_the_timer(
        kube: FakeKube, kvm: tuple[KvmProvider, FakeHypervisors], proxy_server: MiniProxy, make_controller,
        logs: io.StringIO) -> None:
    """The IP timer is an hour here: the Proxy gets its address only if the event wakes its reconcile,
    and the woken reconcile takes the timer's place (no delayed add left once it is Running)."""
    provider, hv = kvm
    h = hv["host0"]
    c = make_controller({PROVIDER: provider}, probe_time_scale=1.0,
                        timings=Timings(poll=3600.0, pending_retry=3600.0, progress_interval=0.0))
    await eventually(lambda: len(h.agent_listeners) == 1, what="the controller follows host0's agents")
    kube.create_proxy("px1", kvm_spec(proxy_server))
    await eventually(lambda: "waiting for the IP address" in kube.status(KEY).get("message", ""))
    assert c.reconciler.memory.peek(KEY).ip_waits == 1 and KEY in c.queue.pending_delayed()
    name = await boot(kube, h)  # the guest's agent connects, reporting the address
    await eventually(lambda: phase(kube) in ("Running", "Ready"), what="the address found on the event")
    assert KEY not in c.queue.pending_delayed()  # the hour's timer went with the look it stood for
    [line] = lines(logs, "guest agent connected; looking for its address now")
    assert (line["proxy"], line["instance"], line["ipWaits"], line["state"]) == (
        "default/px1", name, 1, "Connected")
    assert kube.status(KEY)["ip"] == "127.0.0.1"

    # Ready, it waits for nothing: the agent reconnecting (a restarted qemu-ga) wakes no reconcile.
    await eventually(lambda: phase(kube) == "Ready")
    idle = "guest agent event; its Proxy is not waiting for it"
    before = len(lines(logs, idle))  # the start's DISCONNECTED (DOMAIN_STARTED) among them
    h.agent_stopped(name)
    h.set_vm_ip(name, "127.0.0.1")
    await eventually(lambda: len(lines(logs, idle)) == before + 2, what="both agent events heard")
    assert [r["state"] for r in lines(logs, idle)[before:]] == ["Disconnected", "Connected"]
    assert len(lines(logs, "guest agent connected; looking for its address now")) == 1


def lines(buf: io.StringIO, msg: str) -> list[dict]:
    return [r for r in map(json.loads, buf.getvalue().splitlines()) if r.get("msg") == msg]


async def test_destroyed_and_paused_vms_are_repaired_on_their_events(
        kube: FakeKube, kvm: tuple[KvmProvider, FakeHypervisors], proxy_server: MiniProxy, make_controller,
        logs: io.StringIO) -> None:
    provider, hv = kvm
    h = hv["host0"]
    # probes at their real pace (a refresh about once a minute) and no resync within the test: only the
    # event can wake the reconcile that restarts the VM.
    c = make_controller({PROVIDER: provider}, probe_time_scale=1.0)
    kube.create_proxy("px1", kvm_spec(proxy_server))
    name = await boot(kube, h)
    await eventually(lambda: phase(kube) == "Ready")
    await eventually(lambda: len(h.listeners) == 1, what="the controller follows host0's events")

    h.domain_destroy_flags(h.domains[name].handle(), 0)  # virsh destroy
    await eventually(lambda: kube.reasons("px1").count("Restarted") == 1, what="restarted on the event")
    assert h.domains[name].id != -1
    [line] = lines(logs, "instance event; reconciling its Proxy")
    assert (line["proxy"], line["instance"], line["change"], line["detail"]) == (
        "default/px1", name, "Stopped", "destroyed")

    # Ready again (a VM stopping again before that is in a restart loop: restarted on its growing delay)
    await eventually(lambda: phase(kube) == "Ready" and c.reconciler.memory.peek(KEY).restarts == 0,
                     what="Ready again")
    h.pause(name)  # virsh suspend
    await eventually(lambda: h.domains[name].state == 1, what="resumed on the event")
    changes = [r["change"] for r in lines(logs, "instance event; reconciling its Proxy")]
    assert changes == ["Stopped", "Paused"]
    await eventually(lambda: phase(kube) == "Ready", what="Ready again")


async def test_an_event_does_not_bypass_a_failing_proxys_backoff(
        kube: FakeKube, kvm: tuple[KvmProvider, FakeHypervisors], proxy_server: MiniProxy, make_controller,
        logs: io.StringIO) -> None:
    provider, hv = kvm
    h = hv["host0"]
    c = make_controller({PROVIDER: provider}, probe_time_scale=1.0, transient_backoff=Backoff(3600, 3600))
    kube.create_proxy("px1", kvm_spec(proxy_server))
    name = await boot(kube, h)
    await eventually(lambda: phase(kube) == "Ready")
    await eventually(lambda: len(h.listeners) == 1, what="the controller follows host0's events")
    key = KEY
    c.queue.add_rate_limited(key)  # as after a failed reconcile: retried in an hour

    h.domain_destroy_flags(h.domains[name].handle(), 0)
    backing_off = "instance event; its Proxy is backing off, reconciled on its schedule"
    await eventually(lambda: lines(logs, backing_off), what="the event heard")
    [line] = lines(logs, backing_off)
    assert (line["instance"], line["failures"]) == (name, 1)
    assert lines(logs, "instance event; reconciling its Proxy") == []
    assert key not in c.queue.processing() and len(c.queue) == 0 and key in c.queue.pending_delayed()


async def test_watches_follow_a_providers_reload_and_end_with_the_controller(kube: FakeKube,
                                                                             make_controller) -> None:
    from fakes import fake_kvm_provider

    old, old_hv = fake_kvm_provider(hosts=["host0"], cluster_id="c1")
    new, new_hv = fake_kvm_provider(hosts=["host0"], cluster_id="c1")
    try:
        c = make_controller({PROVIDER: old})
        await eventually(lambda: len(old_hv["host0"].listeners) == 1, what="the first provider watched")
        c.update_providers({PROVIDER: new}, "h2")
        await eventually(lambda: len(new_hv["host0"].listeners) == 1, what="the new provider watched")
        # The replaced provider is closed by the process a minute later; its watch ends now.
        await eventually(lambda: old_hv["host0"].listeners == [], what="the replaced provider unwatched")
        await c.stop(timeout=1.0)
        assert new_hv["host0"].listeners == []
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("lifecycle events ")]
    finally:
        await old.close()
        await new.close()
