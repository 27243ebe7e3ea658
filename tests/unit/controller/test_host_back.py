"""A returning host re-queues its Proxies at once (issue 13 item 9): a delete pending while the host was
down completes within seconds of the host answering again, not after the per-Proxy backoff grown during
the outage; and no countdown is frozen into status."""

from __future__ import annotations

import asyncio

from egress_kvm.controller.queue import Backoff

from .conftest import eventually
from .fakekube import FakeKube
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, cond, phase
from .test_with_kvm_provider import PROVIDER, boot, instance_volumes, kvm, kvm_spec

_ = kvm  # the fixture


async def test_a_delete_pending_on_a_dead_host_completes_once_it_answers(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    provider, hv = kvm
    h = hv["host0"]
    c = make_controller({PROVIDER: provider}, transient_backoff=Backoff(60.0, 300.0))
    kube.create_proxy("px1", kvm_spec(proxy_server))
    name = await boot(kube, h)
    await eventually(lambda: phase(kube) == "Ready", what="Ready")

    hv.set_unreachable("host0")
    kube.delete(KEY)
    await eventually(lambda: c.queue.failures(KEY) >= 1, what="the delete failed on the dead host")
    message = kube.status(KEY)["message"]
    assert "unreachable" in message and "next dial in" not in message  # nothing that would freeze
    await asyncio.sleep(0.2)
    assert KEY in kube.objects and name in h.domains  # waiting on a 60 s backoff

    hv.set_unreachable("host0", False)
    await eventually(lambda: KEY not in kube.objects, what="deleted once the host answers")
    assert name not in h.domains and instance_volumes(h, name) == set()


async def test_a_proxy_made_after_its_host_went_down_is_deleted_without_waiting_for_it(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    """The session to the host dropped (it went down after serving px1): a new Proxy there is looked at
    before its create (planner.look_first: no live session), the look finds the host down, status names no
    instance, and deleting the Proxy finishes at once, the host still down."""
    provider, hv = kvm
    h = hv["host0"]
    make_controller({PROVIDER: provider})
    kube.create_proxy("px1", kvm_spec(proxy_server))
    await boot(kube, h)
    assert provider.connected("host0")

    hv.set_unreachable("host0")
    await eventually(lambda: not provider.connected("host0"), what="the session dropped")
    new = ("default", "px2")
    kube.create_proxy("px2", kvm_spec(proxy_server))
    await eventually(lambda: cond(kube, "HostReachable", new).get("status") == "False", what="unreachable")
    assert "instance" not in kube.status(new)
    kube.delete(new)
    await eventually(lambda: new not in kube.objects, what="deleted while the host is still down")
    assert not h.reachable


async def test_a_proxy_made_while_its_host_was_down_is_created_once_it_answers(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    """Its first pass found the host down before its status recorded an instance there, so no instance ties
    it to the host; the host's return wakes it all the same (KeyState.waits_on), not its 60 s backoff."""
    provider, hv = kvm
    h = hv["host0"]
    c = make_controller({PROVIDER: provider}, transient_backoff=Backoff(60.0, 300.0))
    kube.create_proxy("px1", kvm_spec(proxy_server))
    await boot(kube, h)

    hv.set_unreachable("host0")
    await eventually(lambda: not provider.connected("host0"), what="the session dropped")
    new = ("default", "px2")
    kube.create_proxy("px2", kvm_spec(proxy_server))
    await eventually(lambda: c.queue.failures(new) >= 1, what="px2's pass found the host down")
    assert "instance" not in kube.status(new)

    hv.set_unreachable("host0", False)
    await eventually(lambda: "instance" in kube.status(new), what="px2 created once the host answers")
    await eventually(lambda: kube.status(new)["instance"]["name"] in h.domains, what="its domain")
    await eventually(lambda: c.reconciler.memory.peek(new).waits_on is None, what="no longer waiting on it")


async def test_a_pass_that_finds_the_host_down_as_it_comes_back_runs_again(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller, monkeypatch) -> None:
    """The host answers again while a pass that found it down is writing HostUnreachable, before the pass
    records what it waits on (KeyState.waits_on): the wake runs that pass again once it ends, not after
    its 60 s backoff."""
    provider, hv = kvm
    h = hv["host0"]
    make_controller({PROVIDER: provider}, transient_backoff=Backoff(60.0, 300.0))
    kube.create_proxy("px1", kvm_spec(proxy_server))
    await boot(kube, h)
    hv.set_unreachable("host0")
    await eventually(lambda: not provider.connected("host0"), what="the session dropped")

    new = ("default", "px2")
    writing, release = asyncio.Event(), asyncio.Event()
    write = kube.update_proxy_status

    async def gated(obj, status):
        if (obj["metadata"]["name"] == "px2" and "unreachable" in status.get("message", "")
                and not release.is_set()):
            writing.set()
            await release.wait()
        return await write(obj, status)

    monkeypatch.setattr(kube, "update_proxy_status", gated)
    kube.create_proxy("px2", kvm_spec(proxy_server))
    await asyncio.wait_for(writing.wait(), 10)
    hv.set_unreachable("host0", False)
    await eventually(lambda: provider.connected("host0"), what="the host answers again")
    release.set()
    await eventually(lambda: "instance" in kube.status(new), what="px2 created once the host answers")


async def test_a_proxy_that_waited_on_a_host_and_then_failed_waits_on_it_no_more(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    """Any end but an unreachable host clears KeyState.waits_on: a Failed verdict too."""
    provider, hv = kvm
    c = make_controller({PROVIDER: provider}, transient_backoff=Backoff(0.2, 0.2))
    hv.set_unreachable("host0")
    kube.create_proxy("px2", kvm_spec(proxy_server))
    new = ("default", "px2")
    await eventually(lambda: c.reconciler.memory.peek(new).waits_on == (PROVIDER, "host0"), what="waiting")
    kube.set_spec(new, kvm_spec(proxy_server, placement={"zone": "host0", "machineType": "nope",
                                                        "image": "debian-12"}))
    await eventually(lambda: kube.status(new).get("phase") == "Failed", what="Failed")
    assert c.reconciler.memory.peek(new).waits_on is None
