"""Paused VMs through the controller and the real KvmProvider over the fake libvirt: the plan's START for
a Paused instance reaches provider.start, which resumes the same domain; one paused on an I/O error stays
QuotaExceeded while the pool is full and runs again, on the quota backoff's retry, once space is freed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from fakes import FakeHypervisors, fake_kvm_provider

from egress_kvm.providers.kvm import KvmProvider, addresses
from rpc.constants import DomainState

from .conftest import eventually
from .fakekube import FakeKube
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, phase
from .test_with_kvm_provider import PROVIDER, boot, kvm_spec


@pytest.fixture
async def kvm(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[KvmProvider, FakeHypervisors]]:
    # The "VM" answering probes is the test's proxy on 127.0.0.1: accept loopback as its address.
    real = addresses.usable_ipv4
    monkeypatch.setattr(addresses, "usable_ipv4", lambda a: a.startswith("127.") or real(a))
    provider, hv = fake_kvm_provider(hosts=["host0"], cluster_id="c1")
    yield provider, hv
    await provider.close()


async def test_a_paused_vm_is_resumed_not_recreated(kube: FakeKube, kvm, proxy_server: MiniProxy,  # type: ignore[no-untyped-def]
                                                    make_controller) -> None:
    provider, hv = kvm
    h = hv["host0"]
    c = make_controller({PROVIDER: provider})
    kube.create_proxy("px1", kvm_spec(proxy_server))
    name = await boot(kube, h)
    await eventually(lambda: phase(kube) == "Ready")
    dom_id = h.domains[name].id
    h.pause(name)  # `virsh suspend`
    c.enqueue(KEY)
    await eventually(lambda: "Restarted" in kube.reasons("px1"))
    assert h.domains[name].state == DomainState.RUNNING and h.domains[name].id == dom_id
    assert "domain_resume" in h.calls and h.calls.count("domain_define_xml") == 1
    await eventually(lambda: phase(kube) == "Ready")


async def test_io_error_pause_is_quota_until_space_is_freed_then_resumed(  # type: ignore[no-untyped-def]
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    provider, hv = kvm
    h = hv["host0"]
    c = make_controller({PROVIDER: provider})
    kube.create_proxy("px1", kvm_spec(proxy_server))
    name = await boot(kube, h)
    await eventually(lambda: phase(kube) == "Ready")
    h.pause_on_io_error(name)  # the pool filled up
    c.enqueue(KEY)
    await eventually(lambda: "QuotaExceeded" in kube.reasons("px1"))
    msg = kube.status(KEY)["message"]
    assert msg.startswith("out of capacity: ") and "paused on an I/O error" in msg
    assert "pool 'default' (pool available 0.0 MiB, resuming needs 10.0 GiB)" in msg
    assert "domain_resume" not in h.calls
    assert h.domains[name].state == DomainState.PAUSED

    h.free_pool_space()  # nothing enqueues the Proxy: the quota backoff's retry finds the room
    await eventually(lambda: "Restarted" in kube.reasons("px1"))
    assert h.domains[name].state == DomainState.RUNNING
    assert h.calls.count("domain_define_xml") == 1  # the same VM, its disk and data kept
    await eventually(lambda: phase(kube) == "Ready")
