"""A failing reconcile waits out its backoff: nothing the reconcile itself triggers may bypass it.

Found in the end-to-end run: a Proxy being deleted whose provider.delete kept failing was reconciled
thousands of times a minute although every attempt logged a multi-second retry delay.
"""

from __future__ import annotations

import asyncio

from egress_kvm.controller.queue import Backoff
from egress_kvm.kube.interfaces import FINALIZER
from egress_kvm.kube.rest import request_json
from egress_kvm.providers.base import PermanentError

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, cond, phase, spec_for
from .test_on_emulator import apply, path
from .test_on_emulator import cluster as cluster  # the fixture, re-exported for this module
from .test_on_emulator import spec_for as emu_spec_for


async def test_failing_delete_is_retried_on_backoff_not_in_a_loop(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider}, transient_backoff=Backoff(0.5, 5.0),
                    quota_backoff=Backoff(0.5, 5.0))
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready", what="Ready")

    async def refuse(name: str, zone: str, *, owner_uid: str | None = None) -> None:
        provider.calls.append(("delete", name))
        raise PermanentError(f"domain {name} on {zone} belongs to another cluster")

    provider.delete = refuse  # type: ignore[method-assign]
    kube.delete(KEY)
    await eventually(lambda: ("delete", kube.status(KEY).get("instance", {}).get("name")) in provider.calls,
                     what="first delete attempt")
    await asyncio.sleep(2.0)
    attempts = sum(1 for op, _ in provider.calls if op == "delete")
    # Backoff 0.5, 1, 2 s: at most 3-4 attempts in ~2 s; a hot loop makes hundreds.
    assert attempts <= 5, f"{attempts} delete attempts in 2 s"
    assert phase(kube) == "Deleting"
    # Blocked, not silently stuck: one Warning Event (not one per attempt) that says how to get out,
    # the Ready condition naming the reason, and the finalizer kept (dropping it would leak the VM).
    blocked = [(t, m) for t, r, m in kube.events_for("px1") if r == "DeleteBlocked"]
    assert len(blocked) == 1 and blocked[0][0] == "Warning"
    assert "belongs to another cluster" in blocked[0][1] and "remove the finalizer" in blocked[0][1]
    assert cond(kube, "Ready")["reason"] == "DeleteBlocked"
    assert kube.objects[KEY]["metadata"]["finalizers"] == [FINALIZER]


async def test_probe_refreshes_do_not_cut_a_failing_keys_backoff_short(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The host's libvirt is unreachable while the VM still answers its probes: the prober's periodic
    refresh (every 1.2 s here) must not re-run the failing reconcile before its 5 s backoff is up."""
    c = make_controller({"kvm-home": provider}, transient_backoff=Backoff(5.0, 5.0), probe_refresh=60.0)
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready", what="Ready")
    provider.unreachable.add("nas1")
    before = len(provider.calls)
    c.enqueue(KEY)
    await eventually(lambda: c.queue.failures(KEY) > 0, what="the first failed reconcile")
    await asyncio.sleep(3.0)  # 2 refreshes, still inside the backoff
    gets = [op for op, _ in provider.calls[before:] if op == "get"]
    assert gets == ["get"], f"{len(gets)} provider round trips during one 5 s backoff"
    assert phase(kube) == "Ready"  # the probes still pass: it keeps serving


async def test_failing_delete_through_the_real_kube_layer_waits_its_backoff(
        cluster, proxy_server: MiniProxy) -> None:
    c, hv = cluster
    c.controller.queue._transient = Backoff(0.5, 5.0)  # slower than the fixture's FAST
    c.controller.queue._quota = Backoff(0.5, 5.0)  # a blocked delete retries on this one
    h = hv["host0"]
    await apply(c, "px1", emu_spec_for(proxy_server))
    st = await c.until_status("px1", lambda s: (s.get("instance") or {}).get("name") in h.domains)
    provider = c.controller.reconciler.providers["kvm-test"]
    attempts: list[str] = []

    async def refuse(name: str, zone: str, *, owner_uid: str | None = None) -> None:
        attempts.append(name)
        raise PermanentError(f"domain {name} on {zone} belongs to another cluster")

    provider.delete = refuse  # type: ignore[method-assign]
    await request_json(c.client, "DELETE", path("px1"))
    await eventually(lambda: attempts, what="first delete attempt")
    await asyncio.sleep(2.0)
    assert len(attempts) <= 5, f"{len(attempts)} delete attempts in 2 s"
    assert st["instance"]["name"] in attempts
