"""Host lifecycle events drive reconciles (issue 9 item 1): which Proxy an event concerns (a table over
the cached Proxies' status), and the controller over the real KvmProvider and the fake libvirt: a VM
destroyed or paused behind the operator's back is repaired on the event, with no probe, refresh or
resync to wake it."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from fakes import FakeHypervisors

from egress_kvm.backoff import Backoff
from egress_kvm.controller.hostevents import keys_for, wakes_now
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
