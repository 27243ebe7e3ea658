"""Transports without a lab: a real unix socket served by the fake daemon, and the SSH argument checks."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from rpc_fake_server import FakeServer

import rpc

pytestmark = pytest.mark.timeout(20)


async def test_connect_unix_does_the_handshake_and_calls(tmp_path: Path) -> None:
    path = str(tmp_path / "libvirt-sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    records: list[rpc.CallRecord] = []
    connecting = asyncio.create_task(rpc.connect_unix(path, "test:///default", observer=records.append))
    conn, _ = await loop.sock_accept(listener)
    server = FakeServer(sock=conn, handlers={157: lambda: 9000000})
    await server.start()
    client = await connecting
    try:
        assert client.description == f"unix:{path}"
        assert await client.connect_get_lib_version() == 9000000
        assert [r.proc for r in server.received][:3] == [66, 60, 1]
        assert client.keepalive_interval == 5.0
    finally:
        await client.close()
        await server.stop()
        listener.close()
    assert [r.method for r in records] == [
        "auth_list",
        "connect_supports_feature",
        "connect_open",
        "connect_get_lib_version",
        "connect_close",
    ]


async def test_connect_unix_missing_socket_is_connect_failed(tmp_path: Path) -> None:
    with pytest.raises(rpc.ConnectFailed, match="No such file"):
        await rpc.connect_unix(str(tmp_path / "absent"))


async def test_connect_unix_handshake_timeout_is_connect_failed(tmp_path: Path) -> None:
    path = str(tmp_path / "mute")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)  # accepts (in the kernel) and never answers
    try:
        with pytest.raises(rpc.ConnectFailed, match="handshake"):
            await rpc.connect_unix(path, timeout=0.2)
    finally:
        listener.close()


async def test_known_hosts_has_no_default() -> None:
    with pytest.raises(TypeError, match="known_hosts"):
        await rpc.connect_ssh("127.0.0.1", username="virt")  # type: ignore[call-arg]


async def test_missing_known_hosts_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(rpc.ConnectFailed, match=r"known_hosts file .*nope.* does not exist"):
        await rpc.connect_ssh("127.0.0.1", username="virt", known_hosts=str(tmp_path / "nope"))


async def test_bad_timeout_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="call_timeout must be a positive number"):
        await rpc.connect_unix("/nonexistent", call_timeout=0)


async def test_unreadable_client_key_is_named(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    with pytest.raises(rpc.ConnectFailed, match="No such file or directory: '/nonexistent/key'"):
        await rpc.connect_ssh(
            "127.0.0.1", 1, username="virt", client_keys=["/nonexistent/key"], known_hosts=str(kh)
        )
    bad = tmp_path / "not-a-key"
    bad.write_text("hello\n")
    with pytest.raises(rpc.ConnectFailed, match=r"client_keys \[.*not-a-key'\]: cannot load a key"):
        await rpc.connect_ssh("127.0.0.1", 1, username="virt", client_keys=[str(bad)], known_hosts=str(kh))


async def test_nothing_listening_is_connect_failed(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    with pytest.raises(rpc.ConnectFailed, match=r"ssh://virt@127\.0\.0\.1:1: .*refused"):
        await rpc.connect_ssh("127.0.0.1", 1, username="virt", known_hosts=str(kh), client_keys=[])


async def test_timeout_bounds_the_whole_handshake_not_each_step(tmp_path: Path) -> None:
    """Each handshake step answers well inside `timeout`, but together they take longer: refused."""
    path = str(tmp_path / "slow")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.setblocking(False)
    servers: list[FakeServer] = []

    async def slow(value: object) -> object:
        await asyncio.sleep(0.4)
        return value

    async def serve() -> None:
        sock, _ = await asyncio.get_running_loop().sock_accept(listener)
        server = FakeServer(sock=sock)
        server.handlers[66] = lambda: slow(())
        server.handlers[60] = lambda feature: slow(1)
        server.handlers[1] = lambda name, flags: slow(None)
        servers.append(server)
        await server.start()

    serving = asyncio.create_task(serve())
    try:
        with pytest.raises(rpc.ConnectFailed, match="handshake not done within"):
            await rpc.connect_unix(path, timeout=1.0)  # three steps of 0.4 s each
        await serving
        assert [r.proc for r in servers[0].received][:2] == [66, 60]
    finally:
        for server in servers:
            await server.stop()
        listener.close()
