"""The asyncio connection against an in-process server speaking the protocol over a real socket pair."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import pytest
import xdrlib3
from rpc_fake_server import NO_REPLY, FakeError, FakeServer, Received, open_client

import rpc
from rpc.constants import KEEPALIVE_PROC_PONG, KEEPALIVE_PROGRAM, STREAM_CHUNK, MessageStatus, MessageType
from rpc.procedures import BY_NUMBER, LIFECYCLE_MSG

pytestmark = pytest.mark.timeout(20)

DOM = rpc.Domain("vm1", bytes(range(16)), 4)
POOL = rpc.StoragePool("default", bytes(16))
VOL = rpc.StorageVol("default", "v1", "/images/v1")


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    s = FakeServer()
    yield s
    await s.stop()


async def next_call(server: FakeServer, proc: int) -> Received:
    while True:
        rec = await asyncio.wait_for(server.calls.get(), 5)
        if rec.proc == proc:
            return rec


def reply(server: FakeServer, rec: Received, value: object) -> None:
    server.reply(rec, BY_NUMBER[rec.proc].encode_ret(value))


# -- calls -------------------------------------------------------------------------------------------


async def test_many_calls_in_flight_matched_by_serial_when_replies_come_out_of_order(
    server: FakeServer,
) -> None:
    server.handlers[23] = lambda name: NO_REPLY
    client = await open_client(server)
    tasks = [asyncio.create_task(client.domain_lookup_by_name(f"vm{i}")) for i in range(5)]
    recs = [await next_call(server, 23) for _ in range(5)]
    for rec in reversed(recs):
        (name,) = BY_NUMBER[23].decode_args(rec.payload)
        reply(server, rec, rpc.Domain(name, bytes(16), int(name[2:])))
    results = await asyncio.gather(*tasks)
    assert [d.name for d in results] == [f"vm{i}" for i in range(5)]
    assert [d.id for d in results] == list(range(5))
    assert len({r.serial for r in recs}) == 5
    await client.close()


async def test_error_reply_raises_libvirt_error_with_code_name(server: FakeServer) -> None:
    def lookup(name: str) -> None:
        raise FakeError(42, f"Domain not found: no domain with matching name '{name}'")

    server.handlers[23] = lookup
    server.handlers[9] = lambda dom: (_ for _ in ()).throw(FakeError(55, "Requested operation is not valid"))
    client = await open_client(server)
    with pytest.raises(rpc.NotFoundError) as ei:
        await client.domain_lookup_by_name("nope")
    assert (ei.value.code, ei.value.code_name, ei.value.domain) == (42, "NO_DOMAIN", 10)
    assert "no domain with matching name 'nope'" in ei.value.message
    with pytest.raises(rpc.LibvirtError) as ei2:
        await client.domain_create(DOM)
    assert not isinstance(ei2.value, rpc.NotFoundError)
    assert ei2.value.code_name == "OPERATION_INVALID"
    assert await client.connect_supports_feature(10) == 1  # still usable
    await client.close()


async def test_unknown_procedure_is_reported_as_unsupported(server: FakeServer) -> None:
    client = await open_client(server)  # the fake has no handler for 378
    with pytest.raises(rpc.LibvirtError) as ei:
        await client.storage_vol_get_info_flags(VOL)
    assert ei.value.code == 39 and ei.value.is_unsupported
    await client.close()


async def test_deadline_then_late_reply_is_dropped_and_connection_stays_usable(server: FakeServer) -> None:
    server.handlers[157] = lambda: NO_REPLY
    client = await open_client(server)
    with pytest.raises(rpc.DeadlineExceeded, match="connect_get_lib_version: no reply"):
        await client.connect_get_lib_version(timeout=0.05)
    rec = await next_call(server, 157)
    reply(server, rec, 9000000)  # the late reply
    server.handlers[157] = lambda: 9001000
    assert await client.connect_get_lib_version() == 9001000
    assert client.late_replies == 1
    assert client.protocol.pending == 0
    await client.close()


async def test_default_call_timeout_applies(server: FakeServer) -> None:
    server.handlers[59] = lambda: NO_REPLY
    client = await open_client(server, call_timeout=0.05)
    with pytest.raises(TimeoutError):
        await client.connect_get_hostname()
    await client.close()


async def test_cancelled_call_leaves_no_trace_and_its_reply_is_dropped(server: FakeServer) -> None:
    server.handlers[59] = lambda: NO_REPLY
    client = await open_client(server)
    task = asyncio.create_task(client.connect_get_hostname())
    rec = await next_call(server, 59)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.protocol.pending == 0
    reply(server, rec, "host0")
    server.handlers[59] = lambda: "host1"
    assert await client.connect_get_hostname() == "host1"
    assert client.late_replies == 1
    await client.close()


async def test_peer_close_fails_every_in_flight_call_with_connection_lost(server: FakeServer) -> None:
    server.handlers[157] = lambda: NO_REPLY
    client = await open_client(server)
    tasks = [asyncio.create_task(client.connect_get_lib_version()) for _ in range(3)]
    for _ in range(3):
        await next_call(server, 157)
    server.close()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, rpc.ConnectionLost) for r in results), results
    assert not client.is_connected
    with pytest.raises(rpc.ConnectionLost, match="closed"):
        await client.connect_get_lib_version()
    await client.close()


async def test_bad_length_word_drops_the_link_and_waiters_get_connection_lost(server: FakeServer) -> None:
    server.handlers[157] = lambda: NO_REPLY
    client = await open_client(server)
    task = asyncio.create_task(client.connect_get_lib_version())
    await next_call(server, 157)
    server.send_raw(struct.pack(">I", 0xFFFFFFF0))  # a 4 GiB packet: refused from the length word alone
    # The link is dropped for it: callers that reconnect on ConnectionLost must see exactly that, with
    # the protocol error kept as the cause.
    with pytest.raises(rpc.ConnectionLost, match=r"protocol error: .*exceeds the maximum") as ei:
        await task
    assert isinstance(ei.value.__cause__, rpc.ProtocolError)
    assert client.protocol.at_boundary
    with pytest.raises(rpc.ConnectionLost):
        await client.connect_get_lib_version()
    await client.close()


async def test_truncated_packet_then_eof_is_connection_lost(server: FakeServer) -> None:
    server.handlers[157] = lambda: NO_REPLY
    client = await open_client(server)
    task = asyncio.create_task(client.connect_get_lib_version())
    await next_call(server, 157)
    server.send_raw(struct.pack(">I", 100) + b"\0" * 10)
    server.close()
    with pytest.raises(rpc.ConnectionLost, match="middle of a packet"):
        await task
    await client.close()


async def test_malformed_reply_body_fails_only_that_call(server: FakeServer) -> None:
    server.handlers[59] = lambda: NO_REPLY
    client = await open_client(server)
    task = asyncio.create_task(client.connect_get_hostname())
    rec = await next_call(server, 59)
    server.reply(rec, struct.pack(">I", 4194305))  # a string longer than REMOTE_STRING_MAX
    with pytest.raises(rpc.ProtocolError, match="more than the limit"):
        await task
    server.handlers[59] = lambda: "ok"
    assert await client.connect_get_hostname() == "ok"
    await client.close()


async def test_reply_naming_another_procedure_is_a_protocol_error(server: FakeServer) -> None:
    server.handlers[59] = lambda: NO_REPLY
    client = await open_client(server)
    task = asyncio.create_task(client.connect_get_hostname())
    rec = await next_call(server, 59)
    server.send_packet(proc=157, type=MessageType.REPLY, serial=rec.serial, status=0, payload=b"\0" * 8)
    with pytest.raises(rpc.ProtocolError, match="names procedure 157"):
        await task
    await client.close()


async def test_bad_arguments_raise_before_anything_is_sent(server: FakeServer) -> None:
    client = await open_client(server)
    before = len(server.received)
    with pytest.raises(TypeError, match="domain_lookup_by_name: argument name"):
        await client.domain_lookup_by_name(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be positive"):
        await client.connect_get_hostname(timeout=0)
    await asyncio.sleep(0.01)
    assert len(server.received) == before
    await client.close()


async def test_close_sends_connect_close_and_leaves_no_tasks(server: FakeServer) -> None:
    client = await open_client(server)
    await client.close()
    await client.close()  # idempotent
    assert [r.proc for r in server.received][-1] == 2
    assert not client.is_connected
    # the link's reader (a pump task for this stream-pair link) has ended with the close
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert all("libvirt" not in t.get_name() for t in others)


async def test_async_context_manager_closes(server: FakeServer) -> None:
    async with await open_client(server) as client:
        assert client.is_connected
    assert not client.is_connected


# -- handshake -------------------------------------------------------------------------------------


async def test_handshake_order_without_auth(server: FakeServer) -> None:
    client = await open_client(server, keepalive_interval=5)
    procs = [r.proc for r in server.received]
    assert procs == [66, 60, 1]
    assert BY_NUMBER[60].decode_args(server.received[1].payload) == (10,)
    assert BY_NUMBER[1].decode_args(server.received[2].payload) == ("test:///default", 0)
    assert client.keepalive_interval == 5
    await client.close()


async def test_handshake_refuses_sasl_only(server: FakeServer) -> None:
    server.handlers[66] = lambda: (1,)
    with pytest.raises(rpc.ConnectFailed, match="SASL"):
        await open_client(server)


async def test_handshake_polkit_incomplete_is_refused(server: FakeServer) -> None:
    server.handlers[66] = lambda: (2,)
    server.handlers[70] = lambda: 0
    with pytest.raises(rpc.ConnectFailed, match="polkit"):
        await open_client(server)


async def test_polkit_handshake_against_recorded_packets() -> None:
    """AUTH_POLKIT checked byte for byte against packets written out by hand from the protocol.

    No polkitd runs here, so this is the proof for the polkit path: the exact bytes the client must send,
    and the daemon's answers as they appear on the wire.
    """
    script = [
        # client: AUTH_LIST call, serial 1          daemon: REPLY OK, types<> = [POLKIT]
        ("0000001c 20008086 00000001 00000042 00000000 00000001 00000000",
         "00000024 20008086 00000001 00000042 00000001 00000001 00000000 00000001 00000002"),
        # client: AUTH_POLKIT call, serial 2        daemon: REPLY OK, complete = 1
        ("0000001c 20008086 00000001 00000046 00000000 00000002 00000000",
         "00000020 20008086 00000001 00000046 00000001 00000002 00000000 00000001"),
        # client: CONNECT_OPEN("qemu:///system", 0), serial 3   daemon: REPLY OK, void
        ("00000038 20008086 00000001 00000001 00000000 00000003 00000000 00000001 0000000e"
         + (b"qemu:///system\0\0").hex() + "00000000",
         "0000001c 20008086 00000001 00000001 00000001 00000003 00000000"),
    ]  # fmt: skip
    server_reader, server_writer = None, None
    done = asyncio.get_running_loop().create_future()

    async def daemon(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for want_hex, answer_hex in script:
                want = bytes.fromhex(want_hex.replace(" ", ""))
                got = await reader.readexactly(len(want))
                assert got == want, (got.hex(), want.hex())
                writer.write(bytes.fromhex(answer_hex.replace(" ", "")))
            done.set_result(None)
        except BaseException as e:  # surface the mismatch in the test
            done.set_exception(e)

    import socket

    a, b = socket.socketpair()
    server_reader, server_writer = await asyncio.open_connection(sock=a)
    daemon_task = asyncio.create_task(daemon(server_reader, server_writer))
    reader, writer = await asyncio.open_connection(sock=b)
    client = rpc.Client(rpc.link.Link(reader, writer, description="recorded"), call_timeout=5)
    handshake = asyncio.create_task(
        client._handshake(uri="qemu:///system", keepalive_interval=None, keepalive_count=0)
    )
    await asyncio.wait_for(done, 5)  # raises the byte mismatch, if any
    await handshake
    await daemon_task
    server_writer.close()
    await client.close()


# -- keepalive -------------------------------------------------------------------------------------


async def test_ping_from_daemon_is_answered_with_pong(server: FakeServer) -> None:
    client = await open_client(server)
    server.send_keepalive()
    for _ in range(100):
        if any(r.prog == KEEPALIVE_PROGRAM and r.proc == KEEPALIVE_PROC_PONG for r in server.received):
            break
        await asyncio.sleep(0.01)
    pong = [r for r in server.received if r.prog == KEEPALIVE_PROGRAM]
    assert pong and pong[0].proc == KEEPALIVE_PROC_PONG and pong[0].type == MessageType.MESSAGE
    assert client.pings_received == 1
    await client.close()


async def test_silent_peer_fails_in_flight_calls_with_connection_lost(server: FakeServer) -> None:
    client = await open_client(server, keepalive_interval=0.05, keepalive_count=2)
    server.frozen = True  # the daemon hangs: reads, answers nothing, not even PINGs
    with pytest.raises(rpc.ConnectionLost, match="keepalive"):
        await client.connect_get_hostname(timeout=15)
    pings = [r for r in server.received if r.prog == KEEPALIVE_PROGRAM and r.proc == 1]
    assert len(pings) >= 2  # it probed before giving up
    await client.close()


async def test_answered_pings_keep_an_idle_connection_alive(server: FakeServer) -> None:
    server.handlers[59] = lambda: "host"
    client = await open_client(server, keepalive_interval=0.1, keepalive_count=2)
    await asyncio.sleep(1.0)  # over three times the 0.3 s dead-peer window, idle
    assert client.is_connected
    assert client.pongs_received >= 2
    assert await client.connect_get_hostname() == "host"
    await client.close()


# -- events ----------------------------------------------------------------------------------------


async def test_lifecycle_subscription_routes_by_callback_id_and_deregisters(server: FakeServer) -> None:
    server.handlers[316] = lambda event_id, dom: 11
    server.handlers[317] = lambda callback_id: None
    client = await open_client(server)
    async with client.lifecycle_events() as events:
        rec = await next_call(server, 316)
        assert BY_NUMBER[316].decode_args(rec.payload) == (0, None)
        server.send_lifecycle(99, DOM, 0)  # someone else's callback id: not ours
        server.send_lifecycle(11, DOM, rpc.DomainEventType.STARTED, 1)
        ev = await asyncio.wait_for(events.__anext__(), 5)
        assert ev == rpc.LifecycleEvent(11, DOM, 2, 1)
    rec = await next_call(server, 317)
    assert BY_NUMBER[317].decode_args(rec.payload) == (11,)
    assert client.protocol.subscriptions == frozenset()
    await client.close()


async def test_event_in_the_same_read_as_the_registration_reply_is_not_lost(server: FakeServer) -> None:
    server.handlers[316] = lambda event_id, dom: NO_REPLY
    server.handlers[317] = lambda callback_id: None
    client = await open_client(server)
    sub = client.lifecycle_events(DOM)
    enter = asyncio.create_task(sub.__aenter__())
    rec = await next_call(server, 316)
    assert BY_NUMBER[316].decode_args(rec.payload) == (0, DOM)
    from rpc.framing import encode_packet

    reply_bytes = encode_packet(
        prog=0x20008086, vers=1, proc=316, type=1, serial=rec.serial, status=0, payload=struct.pack(">i", 5)
    )
    p = xdrlib3.Packer()
    LIFECYCLE_MSG.pack(p, rpc.LifecycleEvent(5, DOM, 0, 0))
    event_bytes = encode_packet(
        prog=0x20008086, vers=1, proc=318, type=2, serial=0, status=0, payload=p.get_buffer()
    )
    server.send_raw(reply_bytes + event_bytes)  # one write: one read on the client
    await enter
    ev = await asyncio.wait_for(sub.__anext__(), 5)
    assert ev.event == rpc.DomainEventType.DEFINED
    await sub.aclose()
    await client.close()


async def test_slow_consumer_never_blocks_replies_and_learns_it_lost_events(server: FakeServer) -> None:
    server.handlers[316] = lambda event_id, dom: 3
    server.handlers[317] = lambda callback_id: None
    server.handlers[59] = lambda: "still answering"
    client = await open_client(server)
    async with client.lifecycle_events(max_queue=4) as events:
        for i in range(50):
            server.send_lifecycle(3, DOM, 0, i)
        assert await client.connect_get_hostname() == "still answering"  # nobody consumed a thing
        got = [await events.__anext__() for _ in range(4)]
        assert [e.detail for e in got] == [0, 1, 2, 3]
        with pytest.raises(rpc.EventsLost, match="46 lifecycle events dropped"):
            await events.__anext__()
        server.send_lifecycle(3, DOM, 5, 77)
        assert (await asyncio.wait_for(events.__anext__(), 5)).detail == 77
    await client.close()


async def test_subscription_raises_connection_lost_when_the_link_drops(server: FakeServer) -> None:
    server.handlers[316] = lambda event_id, dom: 1
    client = await open_client(server)
    async with client.lifecycle_events() as events:
        waiting = asyncio.create_task(events.__anext__())
        await asyncio.sleep(0.01)
        server.close()
        with pytest.raises(rpc.ConnectionLost):
            await waiting
    await client.close()


async def test_events_queued_before_the_link_drops_come_out_before_connection_lost(
        server: FakeServer) -> None:
    """A closed connection ends its subscriptions (SubscriptionFailed, always a ConnectionLost), but what
    arrived before is still the consumer's: a watcher learns of a VM stopped just before the drop."""
    server.handlers[316] = lambda event_id, dom: 4
    server.handlers[59] = lambda: "read"
    client = await open_client(server)
    async with client.lifecycle_events() as events:
        server.send_lifecycle(4, DOM, rpc.DomainEventType.STOPPED, 1)
        server.send_lifecycle(4, DOM, rpc.DomainEventType.STARTED, 2)
        assert await client.connect_get_hostname() == "read"  # the reply comes after both events
        server.close()
        with pytest.raises(rpc.ConnectionLost):  # the drop is seen before anything is read from the queue
            await asyncio.wait_for(client.connect_get_hostname(), 5)
        got = [(await asyncio.wait_for(events.__anext__(), 5)).detail for _ in range(2)]
        assert got == [1, 2]
        with pytest.raises(rpc.ConnectionLost):
            await asyncio.wait_for(events.__anext__(), 5)
    await client.close()


async def test_iterating_without_async_with_is_an_error(server: FakeServer) -> None:
    client = await open_client(server)
    with pytest.raises(RuntimeError, match="async with"):
        await client.lifecycle_events().__anext__()
    await client.close()


# -- streams ---------------------------------------------------------------------------------------


async def collect_upload(server: FakeServer, *, confirm: bool = True) -> tuple[bytes, list[Received]]:
    """Gather STREAM packets until the client's finish (or abort); confirm the finish like libvirtd."""
    parts: list[bytes] = []
    packets: list[Received] = []
    while True:
        rec = await asyncio.wait_for(server.stream_packets.get(), 10)
        packets.append(rec)
        if rec.status == MessageStatus.CONTINUE:
            parts.append(rec.payload)
            continue
        if rec.status == MessageStatus.OK and confirm:
            server.send_stream(rec, MessageStatus.OK)
        return b"".join(parts), packets


async def test_upload_bytes_in_protocol_sized_chunks(server: FakeServer) -> None:
    server.handlers[208] = lambda vol, offset, length, flags: None
    client = await open_client(server)
    data = bytes(range(256)) * 5000  # 1.28 MB: several chunks and a partial one
    collector = asyncio.create_task(collect_upload(server))
    sent = await client.storage_vol_upload(VOL, 0, len(data), 0, data)
    got, packets = await collector
    assert sent == len(data) and got == data
    assert max(len(p.payload) for p in packets) == STREAM_CHUNK
    assert packets[-1].status == MessageStatus.OK and packets[-1].payload == b""
    call = next(r for r in server.received if r.proc == 208 and r.type == MessageType.CALL)
    assert all(p.serial == call.serial for p in packets)
    assert BY_NUMBER[208].decode_args(call.payload) == (VOL, 0, len(data), 0)
    assert client.protocol.streams == {}
    await client.close()


async def test_upload_from_async_iterable_coalesces_small_pieces(server: FakeServer) -> None:
    server.handlers[208] = lambda vol, offset, length, flags: None
    client = await open_client(server)

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(300):
            yield bytes([i % 256]) * 4096

    collector = asyncio.create_task(collect_upload(server))
    sent = await client.storage_vol_upload(VOL, 0, 0, 0, pieces())
    got, packets = await collector
    assert sent == 300 * 4096 == len(got)
    assert got == b"".join(bytes([i % 256]) * 4096 for i in range(300))
    assert len(packets) == 1 + -(-len(got) // STREAM_CHUNK)
    await client.close()


def test_an_upload_whose_source_reuses_its_buffer_sends_what_each_piece_held() -> None:
    """On uvloop a stream packet's data may wait in the transport after stream_write returns (it is not
    copied when it is immutable bytes); a source that refills one bytearray must still be sent as it
    was at each yield, so mutable data is copied when written."""
    import uvloop

    from rpc.client import Client
    from rpc.link import UnixLink

    async def main() -> None:
        server = FakeServer()
        server.handlers[208] = lambda vol, offset, length, flags: None
        await server.start()
        loop = asyncio.get_running_loop()
        _, link = await loop.create_unix_connection(
            lambda: UnixLink(description="fake"), sock=server.client_sock
        )
        client = Client(link)
        await client._handshake(uri="test:///default", keepalive_interval=None, keepalive_count=5)
        buf = bytearray(STREAM_CHUNK)

        async def pieces() -> AsyncIterator[bytearray]:
            for i in range(6):
                buf[:] = bytes([i + 1]) * len(buf)
                yield buf

        server.reading.clear()  # the daemon is slow: the client's packets wait in its transport
        collector = asyncio.create_task(collect_upload(server))
        upload = asyncio.create_task(client.storage_vol_upload(VOL, 0, 0, 0, pieces()))
        await asyncio.sleep(0.1)
        server.reading.set()
        await asyncio.wait_for(upload, 10)
        got, _ = await collector
        assert got == b"".join(bytes([i + 1]) * STREAM_CHUNK for i in range(6))
        await client.close()
        await server.stop()

    uvloop.run(main())


async def test_unasked_stream_error_ends_a_blocked_upload_at_once(server: FakeServer) -> None:
    def start(vol: rpc.StorageVol, offset: int, length: int, flags: int) -> None:
        server.reading.clear()  # like a daemon whose disk is full: it stops draining the socket
        return None

    server.handlers[208] = start
    client = await open_client(server)
    upload = asyncio.create_task(client.storage_vol_upload(VOL, 0, 0, 0, b"\0" * (64 << 20), timeout=15))
    rec = await next_call(server, 208)
    await asyncio.sleep(0.2)  # the client is now blocked on a full send buffer
    assert not upload.done()
    server.send_stream_error(rec, 38, "write failed: No space left on device")
    with pytest.raises(rpc.LibvirtError, match="No space left on device") as ei:
        await upload
    assert ei.value.code_name == "SYSTEM_ERROR"
    assert client.protocol.streams == {}
    server.reading.set()
    await client.close()


async def test_stream_error_before_finish_is_raised_not_swallowed(server: FakeServer) -> None:
    server.handlers[208] = lambda vol, offset, length, flags: None
    client = await open_client(server)

    async def slow() -> AsyncIterator[bytes]:
        yield b"a" * 10
        rec = await next_call_stream(server)
        server.send_stream_error(rec, 9, "operation failed: volume too small")
        await asyncio.sleep(0.05)
        yield b"b" * 10

    with pytest.raises(rpc.LibvirtError, match="volume too small"):
        await client.storage_vol_upload(VOL, 0, 0, 0, slow())
    await client.close()


async def next_call_stream(server: FakeServer) -> Received:
    return next(r for r in server.received if r.proc == 208 and r.type == MessageType.CALL)


async def test_upload_call_refused_raises_its_error(server: FakeServer) -> None:
    server.handlers[208] = lambda vol, offset, length, flags: (_ for _ in ()).throw(FakeError(50, "no vol"))
    client = await open_client(server)
    with pytest.raises(rpc.NotFoundError):
        await client.storage_vol_upload(VOL, 0, 0, 0, b"data")
    assert client.protocol.streams == {}
    await client.close()


async def test_failing_data_source_aborts_the_stream(server: FakeServer) -> None:
    server.handlers[208] = lambda vol, offset, length, flags: None
    client = await open_client(server)

    async def broken() -> AsyncIterator[bytes]:
        yield b"x" * STREAM_CHUNK
        raise OSError("source file vanished")

    collector = asyncio.create_task(collect_upload(server, confirm=False))
    with pytest.raises(OSError, match="vanished"):
        await client.storage_vol_upload(VOL, 0, 0, 0, broken())
    _, packets = await collector
    assert packets[-1].status == MessageStatus.ERROR and packets[-1].payload == b""  # the abort
    await client.close()


async def serve_download(server: FakeServer, data: bytes, *, error_after: int | None = None) -> None:
    rec = await next_call(server, 209)
    sent = 0
    for i in range(0, len(data), STREAM_CHUNK):
        if error_after is not None and sent >= error_after:
            server.send_stream_error(rec, 38, "read failed: Input/output error")
            return
        server.send_stream(rec, MessageStatus.CONTINUE, data[i : i + STREAM_CHUNK])
        sent += len(data[i : i + STREAM_CHUNK])
    server.send_stream(rec, MessageStatus.CONTINUE, b"")  # end of data
    fin = await asyncio.wait_for(server.stream_packets.get(), 5)
    assert fin.status == MessageStatus.OK and fin.serial == rec.serial
    server.send_stream(rec, MessageStatus.OK)


async def test_download_yields_the_bytes_and_completes_the_stream_handshake(server: FakeServer) -> None:
    server.handlers[209] = lambda vol, offset, length, flags: None
    client = await open_client(server)
    data = bytes(range(251)) * 7000
    feeder = asyncio.create_task(serve_download(server, data))
    got = await client.storage_vol_download(VOL, 0, 0).read_all()
    await feeder
    assert got == data
    assert client.protocol.streams == {}
    await client.close()


async def test_download_error_midway_raises_after_the_good_chunks(server: FakeServer) -> None:
    server.handlers[209] = lambda vol, offset, length, flags: None
    client = await open_client(server)
    feeder = asyncio.create_task(
        serve_download(server, b"z" * (STREAM_CHUNK * 4), error_after=STREAM_CHUNK * 2)
    )
    got = []
    with pytest.raises(rpc.LibvirtError, match="Input/output error"):
        async for chunk in client.storage_vol_download(VOL, 0, 0):
            got.append(chunk)
    await feeder
    assert sum(map(len, got)) == STREAM_CHUNK * 2
    await client.close()


async def test_download_left_early_aborts_the_stream(server: FakeServer) -> None:
    server.handlers[209] = lambda vol, offset, length, flags: None
    client = await open_client(server)
    rec_task = asyncio.create_task(next_call(server, 209))
    async with client.storage_vol_download(VOL, 0, 0) as chunks:
        first = asyncio.create_task(chunks.__anext__())
        rec = await rec_task
        server.send_stream(rec, MessageStatus.CONTINUE, b"abc")
        assert await first == b"abc"
    abort = await asyncio.wait_for(server.stream_packets.get(), 5)
    assert abort.status == MessageStatus.ERROR and abort.payload == b""
    assert client.protocol.streams == {}
    await client.close()


async def test_a_stalled_download_consumer_fails_alone_and_never_stalls_other_calls(
    server: FakeServer,
) -> None:
    server.handlers[209] = lambda vol, offset, length, flags: None
    server.handlers[59] = lambda: "still answering"
    client = await open_client(server, download_high_water=256 * 1024)
    rec_task = asyncio.create_task(next_call(server, 209))
    dl = client.storage_vol_download(VOL, 0, 0)
    first = asyncio.create_task(dl.__anext__())
    rec = await rec_task
    for _ in range(8):  # 2 MiB pushed; the consumer reads one chunk, then stalls
        server.send_stream(rec, MessageStatus.CONTINUE, b"d" * STREAM_CHUNK)
    assert await first == b"d" * STREAM_CHUNK
    # The reader keeps reading: a call on the same connection is answered well inside its deadline.
    assert await client.connect_get_hostname(timeout=5) == "still answering"
    abort = await asyncio.wait_for(server.stream_packets.get(), 5)
    assert (abort.serial, abort.status, abort.payload) == (rec.serial, MessageStatus.ERROR, b"")
    assert client.protocol.streams == {}  # its buffer is freed
    with pytest.raises(rpc.DownloadOverrun, match=r"consumer fell .* MiB behind"):
        await dl.__anext__()
    assert client.is_connected
    await client.close()


async def test_writes_never_interleave_under_concurrent_upload_and_calls(server: FakeServer) -> None:
    server.handlers[208] = lambda vol, offset, length, flags: None
    server.handlers[59] = lambda: "h"
    client = await open_client(server)
    data = bytes(range(256)) * 16384  # 4 MiB
    collector = asyncio.create_task(collect_upload(server))
    upload = asyncio.create_task(client.storage_vol_upload(VOL, 0, 0, 0, data))
    names = await asyncio.gather(*[client.connect_get_hostname() for _ in range(200)])
    await upload
    got, _ = await collector
    assert names == ["h"] * 200
    assert got == data  # the server's decoder would have failed on one interleaved byte
    await client.close()


# -- observer --------------------------------------------------------------------------------------


async def test_observer_sees_every_call_with_key_arguments_result_and_error(server: FakeServer) -> None:
    records: list[rpc.CallRecord] = []
    server.handlers[23] = lambda name: DOM if name == "vm1" else (_ for _ in ()).throw(FakeError(42, "gone"))
    server.handlers[208] = lambda vol, offset, length, flags: None
    client = await open_client(server, observer=records.append)
    await client.domain_lookup_by_name("vm1")
    with pytest.raises(rpc.NotFoundError):
        await client.domain_lookup_by_name("vm2")
    collector = asyncio.create_task(collect_upload(server))
    await client.storage_vol_upload(VOL, 0, 6, 0, b"secret")
    await collector
    assert [r.method for r in records] == [
        "auth_list",
        "connect_open",
        "domain_lookup_by_name",
        "domain_lookup_by_name",
        "storage_vol_upload",
    ]
    ok, bad, up = records[2], records[3], records[4]
    assert (
        ok.procedure == "DOMAIN_LOOKUP_BY_NAME" and ok.result == DOM and ok.error is None and ok.duration >= 0
    )
    assert ok.identifiers == {"domain": "vm1"}
    assert isinstance(bad.error, rpc.NotFoundError) and bad.identifiers == {"domain": "vm2"}
    assert bad.libvirt_error is bad.error and not bad.ok
    assert up.result == 6 and up.identifiers == {"pool": "default", "volume": "v1"}
    assert "secret" not in repr(up.args) and set(up.args) == {"vol", "offset", "length", "flags"}
    await client.close()


async def test_a_broken_observer_does_not_break_calls(server: FakeServer) -> None:
    def observer(record: rpc.CallRecord) -> None:
        raise RuntimeError("observer bug")

    server.handlers[59] = lambda: "h"
    client = await open_client(server, observer=observer)
    assert await client.connect_get_hostname() == "h"
    await client.close()


async def test_data_pushed_on_an_upload_stream_is_refused_not_buffered(server: FakeServer) -> None:
    server.handlers[208] = lambda vol, offset, length, flags: None
    client = await open_client(server)

    async def source() -> AsyncIterator[bytes]:
        yield b"a" * 100
        rec = await next_call_stream(server)
        for _ in range(20):
            server.send_stream(rec, MessageStatus.CONTINUE, b"\0" * STREAM_CHUNK)
        await asyncio.sleep(0.1)
        yield b"b" * 100

    with pytest.raises(rpc.ProtocolError, match="sent data on an upload stream"):
        await client.storage_vol_upload(VOL, 0, 0, 0, source())
    assert client.protocol.streams == {}
    server.handlers[59] = lambda: "alive"
    assert await client.connect_get_hostname() == "alive"
    await client.close()


@pytest.mark.parametrize("seed", range(40))
async def test_random_bytes_from_the_server_end_the_call_with_an_rpc_error(seed: int) -> None:
    """Garbage (sometimes after a valid header prefix) never hangs a call or raises anything else."""
    import random

    rnd = random.Random(seed)
    server = FakeServer(handlers={59: lambda: NO_REPLY})
    client = await open_client(server, call_timeout=5)
    try:
        task = asyncio.create_task(client.connect_get_hostname())
        rec = await next_call(server, 59)
        body = rnd.randbytes(rnd.randint(0, 300))
        if seed % 2:  # a plausible header with a random length word and payload
            header = struct.pack(">IIiiII", 0x20008086, 1, 59, 1, rec.serial, rnd.choice([0, 1, 2]))
            body = struct.pack(">I", rnd.choice([28, 32, 40, len(body) + 28, 1 << 30])) + header + body
        server.send_raw(body)
        server.close()
        result = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(result[0], rpc.RpcError | str), result
    finally:
        await client.close()
        await server.stop()


async def test_malformed_remote_error_fails_only_that_call(server: FakeServer) -> None:
    server.handlers[59] = lambda: NO_REPLY
    client = await open_client(server)
    task = asyncio.create_task(client.connect_get_hostname())
    rec = await next_call(server, 59)
    server.send_packet(proc=59, type=MessageType.REPLY, serial=rec.serial, status=1, payload=b"\0\0\0\x01")
    with pytest.raises(rpc.ProtocolError, match="remote_error"):
        await task
    server.handlers[59] = lambda: "fine"
    assert await client.connect_get_hostname() == "fine"
    await client.close()


async def test_a_ping_flood_from_a_peer_that_never_reads_stays_bounded(server: FakeServer) -> None:
    client = await open_client(server)
    server.reading.clear()  # the peer stops reading our side
    for _ in range(200_000):  # 5.6 MB of PINGs
        server.send_keepalive()
    await asyncio.sleep(0.5)
    for _ in range(100):
        if client.pings_received == 200_000:
            break
        await asyncio.sleep(0.05)
    assert client.pings_received == 200_000
    assert client._link.write_buffer_size() < 3 * 1024 * 1024  # not 200k PONGs
    server.reading.set()
    await client.close()


# -- a data source that is waiting must not hide a stream error or a dropped link ------------------


async def _upload_with_waiting_source(
    server: FakeServer, client: rpc.Client
) -> tuple[asyncio.Task[int], Received, asyncio.Event, list[str]]:
    release = asyncio.Event()
    log: list[str] = []

    async def source() -> AsyncIterator[bytes]:
        try:
            yield b"a" * 100
            await release.wait()  # an HTTP body or a pipe with nothing to give yet
            yield b"b" * 100
        finally:
            log.append("source closed")

    upload = asyncio.create_task(client.storage_vol_upload(VOL, 0, 0, 0, source(), timeout=15))
    rec = await next_call(server, 208)
    await asyncio.sleep(0.05)
    assert not upload.done()
    return upload, rec, release, log


async def test_stream_error_ends_an_upload_whose_source_is_waiting(server: FakeServer) -> None:
    server.handlers[208] = lambda vol, offset, length, flags: None
    client = await open_client(server)
    upload, rec, release, log = await _upload_with_waiting_source(server, client)
    server.send_stream_error(rec, 38, "write failed: No space left on device")
    with pytest.raises(rpc.LibvirtError, match="No space left on device"):
        await asyncio.wait_for(upload, 5)  # without the source ever being released
    assert not release.is_set() and log == ["source closed"]
    assert client.protocol.streams == {}
    await client.close()


async def test_dropped_link_ends_an_upload_whose_source_is_waiting(server: FakeServer) -> None:
    server.handlers[208] = lambda vol, offset, length, flags: None
    client = await open_client(server)
    upload, _, release, log = await _upload_with_waiting_source(server, client)
    server.close()
    with pytest.raises(rpc.ConnectionLost):
        await asyncio.wait_for(upload, 5)
    assert not release.is_set() and log == ["source closed"]
    await client.close()


async def test_dropped_link_fails_a_waiting_download_and_a_blocked_upload_at_once(server: FakeServer) -> None:
    def start_upload(vol: rpc.StorageVol, offset: int, length: int, flags: int) -> None:
        server.reading.clear()  # stop draining: the upload blocks on a full send buffer
        return None

    server.handlers[209] = lambda vol, offset, length, flags: None
    server.handlers[208] = start_upload
    client = await open_client(server)
    dl = client.storage_vol_download(VOL, 0, 0)
    download = asyncio.create_task(dl.__anext__())
    await next_call(server, 209)
    upload = asyncio.create_task(client.storage_vol_upload(VOL, 0, 0, 0, b"\0" * (64 << 20), timeout=15))
    await next_call(server, 208)
    await asyncio.sleep(0.2)
    assert not download.done() and not upload.done()
    server.close()
    results = await asyncio.wait_for(asyncio.gather(download, upload, return_exceptions=True), 5)
    assert all(isinstance(r, rpc.ConnectionLost) for r in results), results
    await client.close()


# -- every stream wait has a deadline ---------------------------------------------------------------


async def test_upload_whose_finish_is_never_confirmed_hits_its_deadline(server: FakeServer) -> None:
    server.handlers[208] = lambda vol, offset, length, flags: None
    client = await open_client(server)
    collector = asyncio.create_task(collect_upload(server, confirm=False))
    with pytest.raises(rpc.DeadlineExceeded, match="waiting for the upload to be confirmed"):
        await client.storage_vol_upload(VOL, 0, 0, 0, b"x" * 1000, timeout=0.3)
    await collector
    await client.close()


async def test_download_that_never_sends_data_hits_its_deadline(server: FakeServer) -> None:
    server.handlers[209] = lambda vol, offset, length, flags: None
    client = await open_client(server)
    with pytest.raises(rpc.DeadlineExceeded, match="waiting for data"):
        await client.storage_vol_download(VOL, 0, 0, timeout=0.3).read_all()
    await client.close()


async def test_download_whose_end_is_never_confirmed_hits_its_deadline(server: FakeServer) -> None:
    server.handlers[209] = lambda vol, offset, length, flags: None
    client = await open_client(server)

    async def serve() -> None:
        rec = await next_call(server, 209)
        server.send_stream(rec, MessageStatus.CONTINUE, b"abc")
        server.send_stream(rec, MessageStatus.CONTINUE, b"")  # end of data; then never the final OK

    feeder = asyncio.create_task(serve())
    with pytest.raises(rpc.DeadlineExceeded, match="waiting for the end of the download"):
        await client.storage_vol_download(VOL, 0, 0, timeout=0.3).read_all()
    await feeder
    await client.close()


# -- an abandoned call's late reply is undone, not just dropped --------------------------------------


@pytest.mark.parametrize("proc", [208, 209])
async def test_late_ok_to_a_timed_out_stream_call_makes_the_client_abort_the_stream(
    server: FakeServer, proc: int
) -> None:
    server.handlers[proc] = lambda vol, offset, length, flags: NO_REPLY
    client = await open_client(server)
    with pytest.raises(rpc.DeadlineExceeded):
        if proc == 208:
            await client.storage_vol_upload(VOL, 0, 0, 0, b"data", timeout=0.1)
        else:
            await client.storage_vol_download(VOL, 0, 0, timeout=0.1).read_all()
    rec = await next_call(server, proc)
    reply(server, rec, None)  # the daemon opened the stream after all
    if proc == 209:
        server.send_stream(rec, MessageStatus.CONTINUE, b"nobody reads this")
    abort = await asyncio.wait_for(server.stream_packets.get(), 5)
    assert (abort.proc, abort.serial) == (proc, rec.serial)
    assert (abort.status, abort.payload) == (MessageStatus.ERROR, b"")
    assert client.protocol.streams == {} and client.protocol.tombstones == 0
    await client.close()


async def test_late_error_to_a_timed_out_stream_call_sends_nothing(server: FakeServer) -> None:
    server.handlers[209] = lambda vol, offset, length, flags: NO_REPLY
    server.handlers[59] = lambda: "h"
    client = await open_client(server)
    with pytest.raises(rpc.DeadlineExceeded):
        await client.storage_vol_download(VOL, 0, 0, timeout=0.1).read_all()
    rec = await next_call(server, 209)
    server.reply_error(rec, rpc_fake_remote_error(50, "no vol"))
    assert await client.connect_get_hostname() == "h"  # the late error has been read by now
    assert server.stream_packets.empty() and client.protocol.tombstones == 0
    await client.close()


def rpc_fake_remote_error(code: int, message: str) -> rpc.RemoteError:
    from rpc_fake_server import remote_error

    return remote_error(code, message)


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_late_reply_to_an_abandoned_event_registration_is_deregistered(
    server: FakeServer, how: str
) -> None:
    server.handlers[316] = lambda event_id, dom: NO_REPLY
    server.handlers[317] = lambda callback_id: None
    client = await open_client(server)
    if how == "timeout":
        with pytest.raises(rpc.DeadlineExceeded):
            await client.lifecycle_events(timeout=0.1).__aenter__()
        rec = await next_call(server, 316)
    else:
        enter = asyncio.create_task(client.lifecycle_events().__aenter__())
        rec = await next_call(server, 316)
        enter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await enter
    reply(server, rec, 42)
    dereg = await next_call(server, 317)
    assert BY_NUMBER[317].decode_args(dereg.payload) == (42,)
    assert client.protocol.subscriptions == frozenset()
    await asyncio.sleep(0.05)  # the 317 reply arrives and is dropped quietly
    assert client.protocol.tombstones == 0
    await client.close()


async def test_registration_cancelled_after_its_reply_arrived_is_deregistered(server: FakeServer) -> None:
    server.handlers[316] = lambda event_id, dom: NO_REPLY
    server.handlers[317] = lambda callback_id: None
    client = await open_client(server)
    enter = asyncio.create_task(client.lifecycle_events().__aenter__())
    rec = await next_call(server, 316)
    reply(server, rec, 5)
    # Let the reader install the subscription (reply dispatched) but cancel the entering task before
    # it resumes.
    while 5 not in client.protocol.subscriptions:  # noqa: ASYNC110 - the reader's side effect is what we wait for
        await asyncio.sleep(0)
    enter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await enter
    dereg = await next_call(server, 317)
    assert BY_NUMBER[317].decode_args(dereg.payload) == (5,)
    assert client.protocol.subscriptions == frozenset()
    await client.close()


# -- a malformed event is dropped, the connection and the subscription stay --------------------------


async def test_a_malformed_lifecycle_event_costs_only_that_event(server: FakeServer) -> None:
    """A well-framed event whose body does not decode is raised (MalformedEvent) in its place, once; the
    same iterator then yields the next event, and the connection goes on answering calls."""
    server.handlers[316] = lambda event_id, dom: 4
    server.handlers[317] = lambda callback_id: None
    server.handlers[59] = lambda: "h"
    client = await open_client(server)
    async with client.lifecycle_events() as events:
        for callback_id in (99, 4):  # someone else's, then ours: both truncated after two ints
            body = struct.pack(">ii", callback_id, 3)
            server.send_packet(proc=318, type=MessageType.MESSAGE, serial=0, status=0, payload=body)
        pk = xdrlib3.Packer()
        LIFECYCLE_MSG.pack(pk, rpc.LifecycleEvent(4, DOM, 5, 1))
        server.send_packet(proc=318, type=MessageType.MESSAGE, serial=0, status=0, payload=pk.get_buffer())
        with pytest.raises(rpc.MalformedEvent, match="malformed lifecycle event for callback 4"):
            await asyncio.wait_for(events.__anext__(), 5)
        assert await asyncio.wait_for(events.__anext__(), 5) == rpc.LifecycleEvent(4, DOM, 5, 1)
        assert client.bad_events == 2
        assert await client.connect_get_hostname() == "h"
        assert client.is_connected
    await next_call(server, 317)  # still deregistered on exit
    await client.close()


async def test_malformed_events_take_places_in_the_bounded_queue(server: FakeServer) -> None:
    """A host that sends malformed events faster than they are read grows no queue: each takes a place
    like an event, and past `max_queue` it is a dropped event, reported as EventsLost after the kept ones."""
    server.handlers[316] = lambda event_id, dom: 4
    server.handlers[317] = lambda callback_id: None
    server.handlers[59] = lambda: "h"
    client = await open_client(server)
    bad = struct.pack(">ii", 4, 3)
    async with client.lifecycle_events(max_queue=2) as events:
        server.send_packet(proc=318, type=MessageType.MESSAGE, serial=0, status=0, payload=bad)
        server.send_lifecycle(4, DOM, 5, 1)
        for _ in range(3):
            server.send_packet(proc=318, type=MessageType.MESSAGE, serial=0, status=0, payload=bad)
        assert await client.connect_get_hostname() == "h"  # every event above has been read
        with pytest.raises(rpc.MalformedEvent):
            await asyncio.wait_for(events.__anext__(), 5)
        assert (await asyncio.wait_for(events.__anext__(), 5)).detail == 1
        with pytest.raises(rpc.EventsLost, match="3 lifecycle events dropped") as lost:
            await asyncio.wait_for(events.__anext__(), 5)
        assert type(lost.value) is rpc.EventsLost
        assert events.dropped == 3 and client.bad_events == 4
        server.send_lifecycle(4, DOM, 5, 2)
        assert (await asyncio.wait_for(events.__anext__(), 5)).detail == 2
    await next_call(server, 317)
    await client.close()


async def test_a_malformed_event_of_another_kind_is_not_raised_in_a_subscription(server: FakeServer) -> None:
    """A malformed agent event naming a lifecycle subscription's callback id is not that subscription's
    event (as a well-formed one would not be): it is counted, and the lifecycle iterator never raises for
    it (a MalformedEvent there would make the watcher reconcile a whole host for nothing)."""
    server.handlers[316] = lambda event_id, dom: 4
    server.handlers[317] = lambda callback_id: None
    client = await open_client(server)
    async with client.lifecycle_events() as events:
        server.send_packet(proc=348, type=MessageType.MESSAGE, serial=0, status=0,
                           payload=struct.pack(">ii", 4, 3))  # agent lifecycle (348), cut short
        pk = xdrlib3.Packer()
        LIFECYCLE_MSG.pack(pk, rpc.LifecycleEvent(4, DOM, 5, 1))
        server.send_packet(proc=318, type=MessageType.MESSAGE, serial=0, status=0, payload=pk.get_buffer())
        assert await asyncio.wait_for(events.__anext__(), 5) == rpc.LifecycleEvent(4, DOM, 5, 1)
        assert client.bad_events == 1
    await next_call(server, 317)
    await client.close()


async def test_a_drain_failing_with_its_stream_leaves_no_unretrieved_exception(server: FakeServer) -> None:
    """A dropped connection fails the stream and the buffer drain at once: the upload raises the stream's
    error and the drain's BrokenPipeError is retrieved too (it logged "Task exception was never
    retrieved" at ERROR, 40 s after a drop in the fault campaign). The autouse fixture in
    tests/conftest.py fails this test on any such log line."""
    server.handlers[208] = lambda vol, offset, length, flags: server.reading.clear()
    client = await open_client(server)

    async def broken_drain() -> None:  # the link dropped: every stream fails, and so does the drain
        for serial, stream in list(client._core.streams.items()):
            stream._fail(rpc.ConnectionLost("connection lost: Broken pipe"))
            waiter = client._stream_waiters.get(serial)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        raise BrokenPipeError(32, "Broken pipe")

    client._link.drain = broken_drain  # type: ignore[method-assign]
    with pytest.raises(rpc.ConnectionLost, match="Broken pipe"):
        await client.storage_vol_upload(VOL, 0, 0, 0, b"\0" * (64 << 20), timeout=15)
    server.reading.set()
    await client.close()
