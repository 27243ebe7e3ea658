"""Spec edits and providers-file changes that land while a reconcile is awaiting the provider: the
verdict must name the inputs it was computed from, so the newer ones are evaluated and not skipped."""

from __future__ import annotations

import asyncio
import io

from egress_kvm.providers.base import PermanentError

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, phase, spec_for


async def test_a_spec_fix_during_a_failing_create_is_evaluated_not_stamped_failed(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller,
        logs: io.StringIO) -> None:
    """The user fixes the image while the bad one downloads (generation 2); a progress write conflicts
    after the edit, then the old image fails permanently. Failed must not be recorded for generation 2."""
    gate = asyncio.Event()
    real_create = provider.create

    async def create(request, *, progress=None):
        if request.placement.image == "debian-13":
            provider.create_started.set()
            await gate.wait()
            await progress("fetching base image debian-13: 99%")  # written after the edit
            raise PermanentError("image 'debian-13': sha256 mismatch")
        return await real_create(request, progress=progress)

    provider.images = ("debian-13", "debian-12")
    provider.create = create  # type: ignore[method-assign]
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await provider.create_started.wait()
    kube.set_spec(KEY, {**spec, "placement": {**spec["placement"], "image": "debian-12"}})
    await asyncio.sleep(0.05)
    gate.set()
    await eventually(lambda: phase(kube) == "Ready", what="generation 2 (debian-12) evaluated and Ready")
    st = kube.status(KEY)
    assert st["observedGeneration"] == 2
    assert "debian-13" not in st["message"]
    assert kube.stale_rejected >= 1  # the Failed status computed from generation 1 was refused...
    assert "reconcile failed" not in logs.getvalue()  # ...and that is a restart, not an error


async def test_a_providers_fix_during_a_failing_create_is_tried(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The admin fixes the providers file while a create on the old one is in flight; the old create
    then fails permanently. That verdict belongs to the old file: the new one must be tried."""
    gate = asyncio.Event()
    fixed = FakeProvider()

    async def create(request, *, progress=None):
        provider.create_started.set()
        await gate.wait()
        raise PermanentError("image 'debian-13': sha256 mismatch (old providers file)")

    provider.create = create  # type: ignore[method-assign]
    c = make_controller({"kvm-home": provider}, providers_hash="old")
    kube.create_proxy("px1", spec_for(proxy_server))
    await provider.create_started.wait()
    c.update_providers({"kvm-home": fixed}, "new")
    await asyncio.sleep(0.05)
    gate.set()
    await eventually(lambda: phase(kube) == "Ready", what="the new providers file tried and Ready")
    assert any(op == "create" for op, _ in fixed.calls)
    assert c.reconciler.memory.peek(KEY).failed is None
