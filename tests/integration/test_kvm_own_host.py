"""Optional: the provider against YOUR hypervisor, configured by environment variables (skipped otherwise).

    KVM_TEST_PROVIDERS_FILE=/path/providers.yaml   required: turns the test on
    KVM_TEST_PROVIDER=kvm-home                     default: the file's first kvm provider
    KVM_TEST_ZONE=nas1                             default: that provider's first host
    KVM_TEST_IMAGE=debian-13                       default: its first image (downloaded if not cached)
    KVM_TEST_MACHINE_TYPE=small                    default: its first machine type
    KVM_TEST_USER_DATA=/path/user-data             default: a minimal #cloud-config
    KVM_TEST_BOOT_TIMEOUT=600                      seconds to wait for the VM's IP
    KVM_TEST_LOG_LEVEL=1                           verbosity of the trace shown with -v (2: XML, metadata)

It runs preflight, creates one VM (`proxy-kvmtest-<random>`, under a cluster id of its own), waits for
`get` to report its IP, deletes it and checks nothing of it is left; the base image stays cached.
"""

from __future__ import annotations

import asyncio
import io
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from egress_kvm import log
from egress_kvm.config import load_providers_file
from egress_kvm.preflight import run_preflight
from egress_kvm.providers.base import CreateRequest, InProgress, Placement
from egress_kvm.providers.registry import build_providers
from tests.envknobs import boot_timeout

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not os.environ.get("KVM_TEST_PROVIDERS_FILE"),
                       reason="set KVM_TEST_PROVIDERS_FILE to run against your own hypervisor"),
]


def read_user_data(path: str | None) -> bytes:
    return Path(path).read_bytes() if path else b"#cloud-config\n"


async def test_create_get_delete_on_your_host(libvirt_trace: Callable[[str], None]) -> None:
    env = os.environ
    trace = io.StringIO()
    log.configure(str(max(0, int(env.get("KVM_TEST_LOG_LEVEL", "1")))), stream=trace)
    config = load_providers_file(env["KVM_TEST_PROVIDERS_FILE"])
    entries = [p for p in config.providers if p.type == "kvm" and p.kvm is not None]
    entry = next((p for p in entries if p.name == env.get("KVM_TEST_PROVIDER", p.name)), None)
    assert entry is not None and entry.kvm is not None, "no such kvm provider in the file"
    kvm = entry.kvm
    zone = env.get("KVM_TEST_ZONE", kvm.hosts[0].name)
    results = [r for r in await run_preflight(config, provider=entry.name) if r.host in (zone, None)]
    assert all(r.ok for r in results), "\n".join(r.line() for r in results)

    provider = build_providers(config, cluster_id=f"kvm-test-{uuid.uuid4().hex[:8]}")[entry.name]
    name = f"proxy-kvmtest-{uuid.uuid4().hex[:8]}"
    user_data = read_user_data(env.get("KVM_TEST_USER_DATA"))
    machine_type = env.get("KVM_TEST_MACHINE_TYPE", next(iter(kvm.machine_types)))
    placement = Placement(zone=zone, machine_type=machine_type,
                          image=env.get("KVM_TEST_IMAGE", next(iter(kvm.images), None)))
    try:
        req = CreateRequest(name=name, owner_uid="kvm-test", placement=provider.resolve(placement),
                            user_data=user_data)
        while True:  # a missing base is imported in the background: wait for it as the controller does
            try:
                await provider.create(req)
                break
            except InProgress as e:
                assert e.wake is not None
                await e.wake
        deadline = time.monotonic() + boot_timeout(600, env)
        ip = None
        while ip is None:
            inst = await provider.get(name, zone)
            assert inst is not None
            ip = inst.ip
            if ip is None:
                assert time.monotonic() < deadline, f"{name} reported no IP in time"
                await asyncio.sleep(5)
        print(f"\n{name} on {zone}: {ip}")
        assert [i.name for i in await provider.list_managed(zone)] == [name]
    finally:
        await provider.delete(name, zone)
        assert await provider.get(name, zone) is None
        assert await provider.list_managed(zone) == []
        await provider.close()
        log.configure("info")
        libvirt_trace(trace.getvalue())  # shown after the result line under -v (tests/conftest.py)
