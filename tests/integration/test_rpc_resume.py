"""domain_suspend / domain_resume against the lab's real libvirtd through real SSH, checked with virsh;
and the KVM provider resuming a really paused domain through them.

A diskless `qemu` domain (rpc_lab.domain_xml) is enough: suspend and resume only stop and restart the
vCPUs, no guest needs to boot. The error cases pin what libvirt 9.0 answers, which the provider and the
fake libvirt (tests/fakes/libvirt.py) rely on.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import rpc_lab as L
import yaml

import rpc
from egress_kvm.config import parse_providers
from egress_kvm.providers.base import PowerState
from egress_kvm.providers.kvm import KvmProvider, metadata
from egress_kvm.providers.registry import build_providers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PAUSED_USER = 1  # virDomainPausedReason
RUNNING_UNPAUSED = 5  # virDomainRunningReason


@pytest.fixture
async def client(lab_host):  # type: ignore[no-untyped-def]
    c = await L.connect_ssh(lab_host)
    yield c
    await c.close()


async def next_event(events: rpc.LifecycleSubscription, name: str) -> rpc.LifecycleEvent:
    while True:
        ev = await asyncio.wait_for(events.__anext__(), 30)
        if ev.dom.name == name:
            return ev


async def test_suspend_and_resume_agree_with_virsh_and_send_events(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    name = L.unique("resume")
    try:
        dom = await client.domain_create_with_flags(await client.domain_define_xml(L.domain_xml(name)))
        async with client.lifecycle_events(dom) as events:
            assert await client.domain_suspend(dom) is None
            assert L.virsh(lab_host, "domstate", "--reason", name).strip() == "paused (user)"
            assert await client.domain_get_state(dom) == rpc.DomainGetStateRet(rpc.DomainState.PAUSED,
                                                                                  PAUSED_USER)
            ev = await next_event(events, name)
            assert (ev.event, ev.detail) == (rpc.DomainEventType.SUSPENDED, 0)  # detail PAUSED

            await client.domain_suspend(dom)  # suspending a paused domain: accepted, nothing changes
            assert L.virsh(lab_host, "domstate", name).strip() == "paused"

            assert await client.domain_resume(dom) is None
            assert L.virsh(lab_host, "domstate", "--reason", name).strip() == "running (unpaused)"
            assert await client.domain_get_state(dom) == rpc.DomainGetStateRet(rpc.DomainState.RUNNING,
                                                                                  RUNNING_UNPAUSED)
            ev = await next_event(events, name)
            assert (ev.event, ev.detail) == (rpc.DomainEventType.RESUMED, 0)  # detail UNPAUSED
    finally:
        L.remove_domain(lab_host, name)


async def test_resume_of_a_domain_not_paused_is_operation_invalid(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    name = L.unique("notpaused")
    try:
        dom = await client.domain_define_xml(L.domain_xml(name))
        for call in (client.domain_resume, client.domain_suspend):  # shut off
            with pytest.raises(rpc.LibvirtError) as ei:
                await call(dom)
            assert (ei.value.code, ei.value.code_name) == (55, "OPERATION_INVALID")
            assert "domain is not running" in ei.value.message
        dom = await client.domain_create_with_flags(dom)
        with pytest.raises(rpc.LibvirtError) as ei:
            await client.domain_resume(dom)  # running
        assert (ei.value.code, ei.value.code_name) == (55, "OPERATION_INVALID")
        assert "domain is already running" in ei.value.message
        assert L.virsh(lab_host, "domstate", name).strip() == "running"  # and nothing happened to it
        await client.domain_destroy(dom)
        await client.domain_undefine(dom)
        with pytest.raises(rpc.NotFoundError) as nf:
            await client.domain_resume(dom)  # gone
        assert nf.value.code_name == "NO_DOMAIN"
    finally:
        L.remove_domain(lab_host, name)


def lab_provider(info, *, cluster_id: str) -> KvmProvider:  # type: ignore[no-untyped-def]
    """The lab's own providers file, built the way the operator builds it."""
    doc = yaml.safe_load(Path(info.providers_file).read_text())
    config = parse_providers(doc, source=info.providers_file)
    provider = build_providers(config, cluster_id=cluster_id)[config.providers[0].name]
    assert isinstance(provider, KvmProvider)
    return provider


async def test_provider_start_resumes_a_paused_domain_of_its_own(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    """The provider's get/start over the real client: Paused (user) is reported, then resumed in place."""
    cluster = "resume-test"
    name = f"proxy-resume-{uuid.uuid4().hex[:8]}"
    meta = metadata.InstanceMetadata(cluster_id=cluster, owner_uid="uid-1", created_at=datetime.now(UTC),
                                     zone="host0", machine_type="small")
    xml = L.domain_xml(name).replace("</vcpu>", f"</vcpu><metadata>{metadata.to_xml(meta)}</metadata>")
    provider = lab_provider(lab_host, cluster_id=cluster)
    try:
        dom = await client.domain_create_with_flags(await client.domain_define_xml(xml))
        await client.domain_suspend(dom)
        inst = await provider.get(name, "host0")
        assert inst is not None and inst.power_state is PowerState.PAUSED and inst.message == "paused (user)"
        await provider.start(name, "host0")
        assert L.virsh(lab_host, "domstate", "--reason", name).strip() == "running (unpaused)"
        assert (await client.domain_lookup_by_name(name)).id == dom.id  # the same QEMU process
        inst = await provider.get(name, "host0")
        assert inst is not None and inst.power_state is PowerState.RUNNING
    finally:
        await provider.close()
        L.remove_domain(lab_host, name)
