"""Paused VMs over the fake libvirt: start (and create of an existing VM) resumes them; one paused on an
I/O error only once the pool has room again, until then the QuotaError names host, pool and figures."""

from __future__ import annotations

import dataclasses

import pytest
from fakes import fake_kvm_provider, overlay_of
from fakes.libvirt import lv_error
from provider_helpers import LogCapture, request

from egress_kvm.providers.base import PowerState, QuotaError, TransientError
from egress_kvm.providers.kvm.provider import RESUME_MIN_ROOM
from rpc.constants import DOMAIN_PAUSED_IOERROR, DomainState, ErrorCode

NAME = "proxy-abc"
GIB = 1024**3
PAUSED_USER, PAUSED_MIGRATION, PAUSED_WATCHDOG = 1, 2, 6
RUNNING_UNPAUSED = 5


@pytest.fixture
async def running():  # type: ignore[no-untyped-def]
    provider, hv = fake_kvm_provider(hosts=["host0"], cluster_id="c1")
    await provider.create(request())
    yield provider, hv["host0"]
    await provider.close()


@pytest.mark.parametrize("reason", [PAUSED_USER, PAUSED_WATCHDOG, 0])
async def test_start_resumes_a_paused_vm(running, logs: LogCapture, reason: int) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    h.pause(NAME, reason)
    inst = await provider.get(NAME, "host0")
    assert inst is not None and inst.power_state is PowerState.PAUSED
    dom_id = h.domains[NAME].id
    h.calls.clear()
    await provider.start(NAME, "host0")
    d = h.domains[NAME]
    assert (d.state, d.reason, d.id) == (DomainState.RUNNING, RUNNING_UNPAUSED, dom_id)  # same process
    assert "domain_resume" in h.calls and "domain_create_with_flags" not in h.calls
    assert "storage_pool_refresh" not in h.calls  # space matters only for an I/O-error pause
    [line] = logs.lines("KVM domain resumed")
    assert line["name"] == NAME and line["host"] == "host0" and line["level"] == "debug"


async def test_paused_instance_says_why(running) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    h.pause(NAME, PAUSED_USER)
    inst = await provider.get(NAME, "host0")
    assert inst is not None and inst.message == "paused (user)"


async def test_create_of_an_existing_paused_vm_resumes_it(running) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    h.pause(NAME)
    inst = await provider.create(request())
    assert inst.power_state is PowerState.RUNNING
    assert h.domains[NAME].state == DomainState.RUNNING
    assert h.calls.count("domain_define_xml") == 1  # the same domain, not a new one


async def test_io_error_pause_with_a_full_pool_is_quota_naming_host_pool_and_figures(running) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    h.pause_on_io_error(NAME)  # the pool filled up outside libvirt
    for call in (lambda: provider.start(NAME, "host0"), lambda: provider.get(NAME, "host0"),
                 lambda: provider.create(request())):
        with pytest.raises(QuotaError) as ei:
            await call()
        msg = str(ei.value)
        assert f"VM '{NAME}' on host 'host0' is paused on an I/O error" in msg
        assert "pool 'default' (pool available 0.0 MiB, resuming needs 10.0 GiB)" in msg
    assert "domain_resume" not in h.calls
    assert (h.domains[NAME].state, h.domains[NAME].reason) == (DomainState.PAUSED, DOMAIN_PAUSED_IOERROR)


async def test_io_error_pause_with_room_again_is_resumed_and_logged(running, logs: LogCapture) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    h.pause_on_io_error(NAME)
    with pytest.raises(QuotaError):
        await provider.start(NAME, "host0")
    h.free_pool_space()  # freed outside libvirt: only a pool refresh shows it
    inst = await provider.get(NAME, "host0")  # reported Paused, so the controller calls start
    assert inst is not None and inst.power_state is PowerState.PAUSED
    assert "paused on an I/O error; pool 'default' has room again" in inst.message
    await provider.start(NAME, "host0")
    assert h.domains[NAME].state == DomainState.RUNNING
    [line] = logs.lines("VM paused on an I/O error resumed: the pool has room again")
    overlay = h.volumes[overlay_of(NAME, cluster_id="c1")]
    assert line["level"] == "info" and line["pool"] == "default" and line["name"] == NAME
    assert line["needed"] == overlay.capacity - overlay.allocation
    assert line["available"] == h.pool_available() >= line["needed"]


async def test_io_error_resume_needs_what_the_overlay_may_still_grow_by(running) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    overlay = h.volumes[overlay_of(NAME, cluster_id="c1")]
    grow = overlay.capacity - overlay.allocation
    h.pause_on_io_error(NAME)
    h.free_pool_space(grow - 1)  # one byte short
    with pytest.raises(QuotaError, match=r"resuming needs 10\.0 GiB"):
        await provider.start(NAME, "host0")
    h.free_pool_space(1)
    await provider.start(NAME, "host0")
    assert h.domains[NAME].state == DomainState.RUNNING


async def test_io_error_resume_of_a_fully_allocated_overlay_needs_the_floor(running) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    overlay = h.volumes[overlay_of(NAME, cluster_id="c1")]
    overlay.capacity = overlay.allocation  # grown to its full size: nothing left to grow by
    h.pause_on_io_error(NAME)
    h.free_pool_space(RESUME_MIN_ROOM - 1)
    with pytest.raises(QuotaError, match=r"resuming needs 64\.0 MiB"):
        await provider.start(NAME, "host0")
    h.free_pool_space(1)
    await provider.start(NAME, "host0")
    assert h.domains[NAME].state == DomainState.RUNNING


async def test_io_error_pause_without_its_overlay_needs_the_full_disk_size(running) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    h.pause_on_io_error(NAME, fill_pool=False)
    del h.volumes[overlay_of(NAME, cluster_id="c1")]  # someone deleted the disk under the paused VM
    h.outside_usage = h.pool_capacity - 10 * GIB + 1
    with pytest.raises(QuotaError, match=r"resuming needs 10\.0 GiB"):
        await provider.start(NAME, "host0")
    assert "domain_resume" not in h.calls


async def test_io_error_pause_with_unreadable_pool_figures_is_not_resumed(running) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    h.pause_on_io_error(NAME, fill_pool=False)  # plenty of room, but libvirt will not say so
    h.fail["storage_pool_get_info"] = lv_error(ErrorCode.INTERNAL_ERROR, "internal error: boom")
    with pytest.raises(QuotaError, match=r"paused on an I/O error, usually a full pool 'default'; free"):
        await provider.start(NAME, "host0")
    assert "domain_resume" not in h.calls
    await provider.start(NAME, "host0")  # figures readable again: it runs
    assert h.domains[NAME].state == DomainState.RUNNING


async def test_a_refused_pool_refresh_decides_on_libvirts_last_figures(running, logs: LogCapture) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    h.pause_on_io_error(NAME, fill_pool=False)
    h.fail["storage_pool_refresh"] = lv_error(ErrorCode.INTERNAL_ERROR,
                                              "internal error: pool 'default' has asynchronous jobs running.")
    await provider.start(NAME, "host0")
    assert h.domains[NAME].state == DomainState.RUNNING
    assert logs.lines("pool refresh refused")[0]["error"].endswith("asynchronous jobs running.")


async def test_a_pause_held_by_a_libvirt_job_is_left_alone(running) -> None:  # type: ignore[no-untyped-def]
    provider, h = running
    h.pause(NAME, PAUSED_MIGRATION)
    inst = await provider.get(NAME, "host0")
    assert inst is not None and inst.message == "paused (migration)"
    with pytest.raises(TransientError, match=r"paused during a migration \(libvirt's own operation\)"):
        await provider.start(NAME, "host0")
    assert "domain_resume" not in h.calls and h.domains[NAME].state == DomainState.PAUSED


@pytest.mark.parametrize("meanwhile", ["resumed", "stopped"])
async def test_resume_racing_a_state_change(running, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                            meanwhile: str) -> None:
    """The domain stops being paused between our state read and our resume: libvirt answers 55."""
    provider, h = running
    h.pause(NAME)
    client_cls = type(h.sessions[0].libvirt)
    real_resume = client_cls.domain_resume

    async def racing_resume(self, dom):  # type: ignore[no-untyped-def]
        if meanwhile == "resumed":
            h.domains[NAME].state, h.domains[NAME].reason = DomainState.RUNNING, RUNNING_UNPAUSED
        else:
            h.shut_off(NAME)
        return await real_resume(self, dom)

    monkeypatch.setattr(client_cls, "domain_resume", racing_resume)
    if meanwhile == "resumed":
        await provider.start(NAME, "host0")  # running is what we wanted
        assert h.domains[NAME].state == DomainState.RUNNING
    else:
        with pytest.raises(TransientError, match=r"could not be resumed: .*domain is not running"):
            await provider.start(NAME, "host0")  # the next reconcile sees it shut off and starts it
        assert h.domains[NAME].state == DomainState.SHUTOFF


async def test_io_error_resume_of_a_vm_from_the_previous_release_finds_its_untagged_overlay(running) -> None:  # type: ignore[no-untyped-def]
    """Upgrade: a VM created before volumes carried the cluster tag has `<name>.qcow2`; its room check
    must find that overlay (else it would wait for room for a whole new disk)."""
    provider, h = running
    tagged = h.volumes.pop(overlay_of(NAME, cluster_id="c1"))
    legacy = f"{NAME}.qcow2"
    h.volumes[legacy] = dataclasses.replace(tagged, name=legacy, path=f"{h.pool_path}/{legacy}")
    grow = tagged.capacity - tagged.allocation
    h.pause_on_io_error(NAME)
    h.free_pool_space(grow - 1)
    with pytest.raises(QuotaError):
        await provider.start(NAME, "host0")
    h.free_pool_space(1)  # exactly what its overlay may still grow by
    await provider.start(NAME, "host0")
    assert h.domains[NAME].state == DomainState.RUNNING
