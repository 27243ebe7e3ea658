"""A Proxy that goes away while its pass runs (its finalizer removed by hand) leaves nothing behind: the
pass, finishing after the DELETED event, must not count it in `egress_kvm_proxies` again, nor keep its
per-key memory (memory.KeyState) or its probes, whatever it did on its way out.

The pass is made to read the Proxy just before it goes: the rest of it works from what it read, as a
real pass does while the watch delivers the DELETED.
"""

from __future__ import annotations

import asyncio

import pytest

from egress_kvm import metrics
from egress_kvm.controller.manager import PHASES, Controller
from egress_kvm.controller.verdict import ProbeKey

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, phase, spec_for


def gauge() -> dict[str, float]:
    return {p: metrics.REGISTRY.get_sample_value("egress_kvm_proxies", {"phase": p}) or 0.0 for p in PHASES}


def gone_after_the_next_read(kube: FakeKube, c: Controller) -> list[object]:
    """The next fresh read of px1 returns it, then the Proxy is removed (finalizer stripped by hand) and
    its DELETED handled by the controller before the pass goes on. Returns the list of finished passes."""
    real_get = kube.get_proxy
    armed = [True]

    async def read_then_gone(namespace: str, name: str):  # type: ignore[no-untyped-def]
        obj = await real_get(namespace, name)
        if armed[0] and (namespace, name) == KEY and obj is not None:
            armed[0] = False
            deleted = asyncio.Event()
            kube.watch(lambda kind, o: deleted.set() if kind == "DELETED" else None)
            kube.force_remove(KEY)
            await deleted.wait()  # the controller's handler ran before ours (registered first)
            assert KEY not in c.reconciler.memory  # DELETED did forget it; the pass goes on from here
        return obj

    kube.get_proxy = read_then_gone  # type: ignore[method-assign]
    done: list[object] = []
    real_reconcile = c.reconciler.reconcile

    async def counted(key, **kw):  # type: ignore[no-untyped-def]
        try:
            return await real_reconcile(key, **kw)
        finally:
            done.append(key)

    c.reconciler.reconcile = counted  # type: ignore[method-assign]
    return done


@pytest.mark.parametrize("case", ["ready", "delete-blocked"])
async def test_a_proxy_gone_during_its_pass_is_neither_counted_nor_remembered(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller, case: str) -> None:
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    await eventually(lambda: gauge()["Ready"] == 1)
    if case == "delete-blocked":  # its provider entry gone: the deletion waits, retried (deletion.py)
        c.update_providers({}, "without kvm-home")
        kube.delete(KEY)
        await eventually(lambda: "DeleteBlocked" in kube.reasons("px1"))
        await eventually(lambda: gauge()["Deleting"] == 1)
    done = gone_after_the_next_read(kube, c)
    c.enqueue(KEY)
    await eventually(lambda: KEY in done and KEY not in c.queue.processing(),
                     what="the pass that read px1 before it went")
    assert KEY not in kube.objects
    # Nor a retry or requeue of it (DELETED dropped its backoff and timers): it would only read it again.
    assert KEY not in c.queue.pending_delayed() and c.queue.failures(KEY) == 0 and len(c.queue) == 0
    assert not c._gone_mid_pass  # the pass's end took px1 out of it again
    assert gauge() == dict.fromkeys(PHASES, 0.0)
    assert len(c.reconciler.memory) == 0  # no KeyState (nor phase) left for the gone Proxy
    assert c.prober.target(ProbeKey(KEY)) is None  # and no probe


async def test_the_gauge_drops_a_deleted_proxy_without_waiting_for_another_reconcile(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The gauge used to move only when a reconcile ended: the last Proxy deleted stayed counted."""
    make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: gauge()["Ready"] == 1)
    kube.force_remove(KEY)
    await eventually(lambda: gauge() == dict.fromkeys(PHASES, 0.0), what="the gauge without px1")


async def test_a_proxy_recreated_during_its_pass_is_reconciled_and_counted_afresh(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """Deleted and created again under the same name while a pass runs: what the old pass left goes, but
    the new Proxy (queued by its ADDED) is reconciled once the pass ends, counted and remembered."""
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: gauge()["Ready"] == 1)
    real_get = kube.get_proxy
    old_uid = kube.objects[KEY]["metadata"]["uid"]
    mid_pass: list[bool] = []  # per re-creation: whether it came while px1's pass ran

    async def read_then_recreated(namespace: str, name: str):  # type: ignore[no-untyped-def]
        obj = await real_get(namespace, name)
        if (namespace, name) == KEY and obj is not None and obj["metadata"]["uid"] == old_uid:
            added = asyncio.Event()
            kube.watch(lambda kind, o: added.set() if kind == "ADDED" else None)
            kube.force_remove(KEY)
            kube.create_proxy("px1", spec_for(proxy_server))
            await added.wait()  # the controller handled the DELETED, then the ADDED (registered first)
            mid_pass.append(KEY in c._running_since and KEY in c._gone_mid_pass)
        return obj

    kube.get_proxy = read_then_recreated  # type: ignore[method-assign]
    c.enqueue(KEY)
    await eventually(lambda: kube.objects[KEY]["metadata"]["uid"] != old_uid, what="px1 re-created")
    await eventually(lambda: phase(kube) == "Ready", what="the new px1 Ready")
    await eventually(lambda: gauge()["Ready"] == 1 and KEY not in c.queue.processing() and len(c.queue) == 0)
    assert gauge() == {**dict.fromkeys(PHASES, 0.0), "Ready": 1.0}
    assert mid_pass == [True]
    assert KEY in c.reconciler.memory and not c._gone_mid_pass
