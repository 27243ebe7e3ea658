"""rpc when the real link fails mid-call: the SSH session killed, libvirtd killed, libvirtd frozen.

Each in-flight call must end with ConnectionLost well inside its deadline (never a hang), and a frozen
daemon must be detected by keepalive. libvirtd is frozen with SIGSTOP to hold a call in flight; the test
that kills libvirtd starts it again in the host's namespaces so later tests find the lab healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest
import rpc_lab as L

import rpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DEADLINE = (
    60.0  # far above what any of these should take: ConnectionLost, not DeadlineExceeded, must end them
)


async def wait_sent(client: rpc.Client, n: int = 1) -> None:
    """Let the call leave: its serial is in the map once it has been written."""
    for _ in range(200):
        if client.protocol.pending >= n:
            await asyncio.sleep(0.1)
            return
        await asyncio.sleep(0.01)
    raise AssertionError("call never sent")


async def test_killing_the_ssh_session_mid_call_is_connection_lost(lab_host) -> None:  # type: ignore[no-untyped-def]
    sshd = L.host(lab_host).sshd_pid
    before = L.descendants(sshd)
    client = await L.connect_ssh(lab_host)
    ours = L.descendants(sshd) - before
    assert ours, "no sshd session process appeared for our connection"
    try:
        with L.stopped(L.libvirtd_pid(lab_host)):
            calls = [asyncio.create_task(client.connect_get_hostname(timeout=DEADLINE)) for _ in range(3)]
            await wait_sent(client, 3)
            for pid in ours:
                with contextlib.suppress(ProcessLookupError):  # a short-lived helper may be gone already
                    os.kill(pid, signal.SIGKILL)
            results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, rpc.ConnectionLost) for r in results), results
        assert not client.is_connected
        with pytest.raises(rpc.ConnectionLost):
            await client.connect_get_hostname()
    finally:
        await client.close()
    async with await L.connect_ssh(lab_host) as again:  # the host is fine; a new connection works
        assert await again.connect_get_lib_version() > 0


async def test_frozen_libvirtd_is_detected_by_keepalive(lab_host) -> None:  # type: ignore[no-untyped-def]
    client = await L.connect_ssh(lab_host, keepalive_interval=0.5, keepalive_count=2)
    try:
        with L.stopped(L.libvirtd_pid(lab_host)), pytest.raises(rpc.ConnectionLost, match="keepalive"):
            await client.connect_get_hostname(timeout=DEADLINE)
    finally:
        await client.close()


async def test_deadline_on_a_frozen_libvirtd_then_the_late_reply_is_dropped(lab_host) -> None:  # type: ignore[no-untyped-def]
    async with await rpc.connect_unix(L.unix_socket_path(lab_host), keepalive_interval=30) as client:
        with L.stopped(L.libvirtd_pid(lab_host)), pytest.raises(rpc.DeadlineExceeded):
            await client.connect_get_hostname(timeout=0.5)
        # thawed, libvirtd answers the timed-out call: that reply is recognised and dropped
        for _ in range(200):
            if client.late_replies:
                break
            await asyncio.sleep(0.05)
        assert client.late_replies == 1
        assert await client.connect_get_lib_version(timeout=30) > 0
        assert client.is_connected and client.protocol.pending == 0


async def test_killing_libvirtd_mid_call_is_connection_lost_on_every_transport(lab_host) -> None:  # type: ignore[no-untyped-def]
    over_ssh = await L.connect_ssh(lab_host)
    direct = await rpc.connect_unix(L.unix_socket_path(lab_host))
    pid = L.libvirtd_pid(lab_host)
    try:
        with L.stopped(pid):
            calls = [
                asyncio.create_task(over_ssh.connect_get_hostname(timeout=DEADLINE)),
                asyncio.create_task(direct.connect_get_hostname(timeout=DEADLINE)),
            ]
            await wait_sent(over_ssh)
            await wait_sent(direct)
            os.kill(pid, signal.SIGKILL)
            results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, rpc.ConnectionLost) for r in results), results
    finally:
        await over_ssh.close()
        await direct.close()
        await asyncio.to_thread(L.wait_gone, pid)
        await asyncio.to_thread(L.restart_libvirtd, lab_host)
    async with await L.connect_ssh(lab_host) as again:
        assert await again.connect_get_lib_version() > 0


async def test_a_full_pool_mid_upload_ends_the_upload_at_once_with_the_daemons_error(lab_host) -> None:  # type: ignore[no-untyped-def]
    """libvirtd reports ENOSPC as an unasked STREAM/ERROR and drops everything after it: the upload must
    raise that error promptly (not hang waiting for a confirmation that never comes)."""
    pool_name, size = L.unique("small"), 64 << 20
    with L.small_pool(lab_host, pool_name, mib=16):
        async with await L.connect_ssh(lab_host) as client:
            pool = await client.storage_pool_lookup_by_name(pool_name)
            vol = await client.storage_vol_create_xml(
                pool,
                f"<volume><name>big.raw</name><capacity unit='bytes'>{size}</capacity>"
                "<allocation>0</allocation><target><format type='raw'/></target></volume>",
            )
            with pytest.raises(rpc.LibvirtError, match="No space left on device") as ei:
                await client.storage_vol_upload(vol, 0, size, 0, os.urandom(size), timeout=DEADLINE)
            assert ei.value.code_name == "SYSTEM_ERROR"
            assert client.protocol.streams == {}
            assert await client.connect_get_lib_version() > 0  # the connection is fine
            await client.storage_vol_delete(vol)
