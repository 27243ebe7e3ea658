"""rpc/coalesce.py: the writes of one loop turn leave in one send, in order; close flushes, abort drops;
and an SSH connection opened with coalesce=True works end to end against an in-process SSH server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncssh
import pytest

import rpc
from rpc.coalesce import CoalescingTransport

pytestmark = pytest.mark.timeout(20)


class _Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sends: list[list[bytes]] = []  # one entry per write/writelines call
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        self.sends.append([bytes(data)])

    def writelines(self, list_of_data: Any) -> None:
        self.sends.append([bytes(d) for d in list_of_data])

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_write_buffer_size(self) -> int:
        return 0


async def _turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_writes_of_one_turn_leave_in_one_send_in_order() -> None:
    real = _Recorder()
    t = CoalescingTransport(real, asyncio.get_running_loop())
    t.write(b"ignore")
    t.write(bytearray(b"call-1"))
    t.write(memoryview(b"call-2"))
    assert real.sends == []  # nothing leaves before the turn ends
    assert t.get_write_buffer_size() == 18
    await _turn()
    assert real.sends == [[b"ignore", b"call-1", b"call-2"]]
    t.write(b"next")
    await _turn()
    assert real.sends[1:] == [[b"next"]]  # a lone write goes out as a plain write, one turn later at most


async def test_close_sends_what_was_written_first_and_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    real = _Recorder()
    t = CoalescingTransport(real, loop)
    t.write(b"disconnect")
    t.close()
    assert real.sends == [[b"disconnect"]] and real.closed
    t.write(b"late")
    await _turn()
    assert real.sends == [[b"disconnect"]]  # written after the close: dropped, as a plain transport does

    other = _Recorder()
    t2 = CoalescingTransport(other, loop)
    t2.write(b"half")
    t2.abort()
    await _turn()
    assert other.sends == [] and other.aborted


async def test_a_send_that_fails_otherwise_than_a_lost_connection_ends_it() -> None:
    """The send runs in a loop callback, where asyncssh would never hear of the error: the connection
    must not go on with bytes missing from its stream."""
    loop = asyncio.get_running_loop()
    seen: list[object] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context.get("exception")))

    class _Broken(_Recorder):
        def writelines(self, list_of_data: Any) -> None:
            raise RuntimeError("cannot write")

    real = _Broken()
    t = CoalescingTransport(real, loop)
    t.write(b"a")
    t.write(b"b")
    await _turn()
    loop.set_exception_handler(None)
    assert real.aborted and [type(e) for e in seen] == [RuntimeError]


async def test_coalesce_refuses_what_it_would_bypass(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    with pytest.raises(ValueError, match="config=None"):
        await rpc.open_ssh("127.0.0.1", 1, known_hosts=kh, coalesce=True)  # an ssh config could ProxyJump
    with pytest.raises(ValueError, match="tunnel"):
        await rpc.open_ssh("127.0.0.1", 1, known_hosts=kh, coalesce=True, config=None, tunnel="jump")
    proxied = asyncssh.SSHClientConnectionOptions(proxy_command="nc jump 22")  # would go unused
    with pytest.raises(ValueError, match="options"):
        await rpc.open_ssh("127.0.0.1", 1, known_hosts=kh, coalesce=True, config=None, options=proxied)


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return False  # no authentication: the test is about the bytes, not the login


async def _echo(process: asyncssh.SSHServerProcess[str]) -> None:
    async for line in process.stdin:
        process.stdout.write(line.upper())
    process.exit(0)


async def test_an_ssh_connection_with_coalesced_writes_carries_sessions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sends: list[int] = []  # writes per send: the connection really goes through the coalescing transport
    real_flush = CoalescingTransport._flush

    def counting(self: CoalescingTransport) -> None:
        sends.append(len(self._pending))
        real_flush(self)

    monkeypatch.setattr(CoalescingTransport, "_flush", counting)
    await _sessions()
    assert sends and max(sends) > 1


def test_the_same_on_uvloop() -> None:
    """The operator's loop: uvloop's TCP transport is no asyncio.Transport subclass."""
    import uvloop

    uvloop.run(_sessions())


async def _sessions() -> None:
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    server = await asyncssh.create_server(_Server, "127.0.0.1", 0, server_host_keys=[host_key],
                                          process_factory=_echo)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = await rpc.open_ssh("127.0.0.1", port, username="u", known_hosts=None, coalesce=True,
                                  config=None, agent_path=None, client_keys=[])
        async with conn:
            # several sessions in flight at once: their packets share sends and must stay in order
            async def one(i: int) -> str:
                result = await conn.run("echo", input="".join(f"line {i} {n}\n" for n in range(50)))
                return str(result.stdout)
            outs = await asyncio.gather(*(one(i) for i in range(8)))
            assert outs == ["".join(f"LINE {i} {n}\n" for n in range(50)) for i in range(8)]
            assert isinstance(conn.get_extra_info("peername"), tuple)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_failed_tcp_connect_makes_no_ssh_connection_object() -> None:
    """As asyncssh's own direct connect: the connection (and the 2-minute login timer it starts when made)
    exists only once TCP is connected, so a dial to a host that is down leaves nothing behind."""
    import socket

    from rpc.coalesce import CoalescingConnector

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    made: list[object] = []

    def factory() -> asyncio.Protocol:
        made.append(object())
        return asyncio.Protocol()

    with pytest.raises(OSError):
        await CoalescingConnector().create_connection(factory, "127.0.0.1", port)
    assert made == []


async def test_host_keys_are_checked_as_on_a_direct_connection(tmp_path: Path) -> None:
    """The coalescing path opens the TCP connection itself; asyncssh still checks the host key against
    known_hosts by the host and port asked for: the right key connects, another key is refused."""
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    other = asyncssh.generate_private_key("ssh-ed25519")
    server = await asyncssh.create_server(_Server, "127.0.0.1", 0, server_host_keys=[host_key],
                                          process_factory=_echo)
    port = server.sockets[0].getsockname()[1]
    try:
        for key, accepted in ((host_key, True), (other, False)):
            kh = tmp_path / "known_hosts"
            kh.write_bytes(b"[127.0.0.1]:%d " % port + key.export_public_key())
            opening = rpc.open_ssh("127.0.0.1", port, username="u", known_hosts=kh, coalesce=True,
                                   config=None, agent_path=None, client_keys=[])
            if accepted:
                async with await opening as conn:
                    assert (await conn.run("echo", input="ok\n")).stdout == "OK\n"
            else:
                with pytest.raises(rpc.HostKeyRejected):
                    await opening
    finally:
        server.close()
        await server.wait_closed()
