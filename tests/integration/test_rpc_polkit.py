"""AUTH_POLKIT against a live polkitd: libvirt's stock rule lets group `libvirt` in and nobody else.

The lab's libvirtd runs without polkit (auth_unix_rw = "none"), so this test runs its own: a libvirtd
with auth_unix_rw = "polkit" beside a private system D-Bus and polkitd (rpc_polkit.py). The handshake
is the one connect_unix/connect_ssh run; the test driver (test:///default) keeps QEMU out of it.
"""

from __future__ import annotations

import asyncio

import pytest
import rpc_polkit as P

import rpc
from rpc.link import Link
from rpc.transport import _open_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def polkit_daemon(lab_host):  # type: ignore[no-untyped-def]
    # lab_host: the lab creates the `virt` user in group libvirt, the identity polkit must let in
    reason = P.unavailable_reason()
    if reason:
        pytest.skip(f"polkit test: {reason}")
    with P.polkit_libvirtd() as daemon:
        yield daemon


async def open_as(daemon: P.PolkitDaemon, user: str, records: list[rpc.CallRecord]) -> rpc.Client:
    with P.peer_socket(daemon.socket, user) as sock:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        link = Link(reader, writer, description=f"unix:{daemon.socket} as {user}")
        return await _open_client(
            link,
            uri="test:///default",
            timeout=30,
            call_timeout=30,
            observer=records.append,
            keepalive_interval=5,
            keepalive_count=5,
            readonly=False,
            event_queue_max=100,
        )


async def test_polkit_lets_the_libvirt_group_in(polkit_daemon: P.PolkitDaemon) -> None:
    records: list[rpc.CallRecord] = []
    client = await open_as(polkit_daemon, "virt", records)
    async with client:
        assert await client.connect_get_type() == "TEST"
        assert (await client.connect_list_all_domains()).ret >= 1  # the test driver's "test" domain
    by_method = {r.method: r for r in records}
    assert by_method["auth_list"].result == (rpc.AuthType.POLKIT,)
    assert by_method["auth_polkit"].result == 1
    assert [r.method for r in records][:4] == [
        "auth_list",
        "auth_polkit",
        "connect_supports_feature",
        "connect_open",
    ]


async def test_polkit_refusal_is_the_daemons_error(polkit_daemon: P.PolkitDaemon) -> None:
    records: list[rpc.CallRecord] = []
    with pytest.raises(rpc.LibvirtError) as ei:
        await open_as(polkit_daemon, "nobody", records)
    # no rule for `nobody`: polkit wants an authentication agent, and there is none
    assert (ei.value.code, ei.value.code_name) == (94, "AUTH_UNAVAILABLE")
    assert "org.libvirt.unix.manage" in ei.value.message
    assert [r.method for r in records] == ["auth_list", "auth_polkit"]
