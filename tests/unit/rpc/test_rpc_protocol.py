"""The sans-IO protocol core, driven with bytes and a fake clock only: no sockets, no event loop.

The server's side of each exchange is built from the same framing/messages code a server uses
(classify_from_client, encode_reply, ...), so these tests also prove that part works server-side.
"""

from __future__ import annotations

import pytest
import xdrlib3

import rpc
from rpc.constants import KEEPALIVE_PROGRAM, REMOTE_PROGRAM, DomainEventID, MessageStatus, MessageType
from rpc.framing import PacketDecoder, encode_packet
from rpc.messages import (
    PING,
    PONG,
    Call,
    StreamAborted,
    StreamFinished,
    classify_from_client,
    encode_error_reply,
    encode_event,
    encode_reply,
)
from rpc.procedures import BY_NUMBER, LIFECYCLE_MSG
from rpc.protocol import (
    MAX_TOMBSTONES,
    AgentLifecycleReceived,
    CallDone,
    CallFailed,
    ClientProtocol,
    ConnectionClosed,
    EventMalformed,
    LifecycleReceived,
    StreamChanged,
    SubscriptionFailed,
)
from rpc.trace import Direction, PacketTrace
from rpc.types import Domain, LifecycleEvent, RemoteError, StorageVol

LIB_VERSION = BY_NUMBER[157]
HOSTNAME = BY_NUMBER[59]
REGISTER = BY_NUMBER[316]
UPLOAD = BY_NUMBER[208]
DOWNLOAD = BY_NUMBER[209]
VOL = StorageVol("default", "v.raw", "/var/lib/libvirt/images/v.raw")
DOM = Domain("vm1", b"\x01" * 16, 3)


def client(now: float = 0.0, **kw: object) -> ClientProtocol:
    return ClientProtocol(now=now, description="test", **kw)  # type: ignore[arg-type]


def server_sees(data: bytes) -> list[object]:
    return [classify_from_client(p) for p in PacketDecoder().feed(data)]


def reply_to(data: bytes, value: object) -> bytes:
    (call,) = server_sees(data)
    assert isinstance(call, Call)
    return encode_reply(proc=call.proc, serial=call.serial, payload=BY_NUMBER[call.proc].encode_ret(value))


def stream_packet(serial: int, status: int, payload: bytes = b"", *, proc: int = 209, type: int = 3) -> bytes:
    return encode_packet(
        prog=REMOTE_PROGRAM, vers=1, proc=proc, type=type, serial=serial, status=status, payload=payload
    )


def remote_error(code: int, message: str) -> RemoteError:
    return RemoteError(code, 10, message, 2, None, None, None, None, 0, 0, None)


# -- calls ------------------------------------------------------------------------------------------


def test_a_call_is_bytes_out_and_its_reply_is_one_event_however_the_bytes_are_split() -> None:
    cuts = 0
    for cut in range(1, 36):  # the reply below is 36 bytes: every split point inside it
        p = client()
        serial, data = p.send_call(LIB_VERSION, (), now=0, timeout=5, token="t")
        (call,) = server_sees(data)
        assert call == Call(serial, 157, b"")
        reply = reply_to(data, 9_000_000)
        assert len(reply) == 36
        cuts += 1
        events = p.receive_data(reply[:cut], now=1) + p.receive_data(reply[cut:], now=1)
        assert events == [CallDone(serial, "t", 9_000_000)]
        assert p.pending == 0 and p.at_boundary
    assert cuts == 35


def test_replies_out_of_order_reach_their_own_calls() -> None:
    p = client()
    s1, d1 = p.send_call(LIB_VERSION, (), now=0, timeout=5, token=1)
    s2, d2 = p.send_call(HOSTNAME, (), now=0, timeout=5, token=2)
    events = p.receive_data(reply_to(d2, "h") + reply_to(d1, 7), now=0)
    assert events == [CallDone(s2, 2, "h"), CallDone(s1, 1, 7)]


def test_an_error_reply_fails_its_call_with_the_daemons_error_class() -> None:
    p = client()
    serial, _ = p.send_call(BY_NUMBER[23], ("nope",), now=0, timeout=5, token="t")
    (ev,) = p.receive_data(
        encode_error_reply(proc=23, serial=serial, error=remote_error(42, "no domain")), now=0
    )
    assert isinstance(ev, CallFailed) and isinstance(ev.error, rpc.NotFoundError)
    assert p.closed is None


def test_serials_wrap_past_zero() -> None:
    p = client()
    p._serial = 0xFFFFFFFF
    serial, _ = p.send_call(LIB_VERSION, (), now=0, timeout=5)
    assert serial == 1


# -- deadlines, late replies, tombstones -----------------------------------------------------------


def test_a_deadline_fires_only_when_its_time_has_come_and_the_late_reply_is_dropped() -> None:
    p = client()
    _, data = p.send_call(LIB_VERSION, (), now=10, timeout=5, token="t")
    assert p.next_wakeup() == 15
    assert p.tick(14.999) == []
    (ev,) = p.tick(15)
    assert isinstance(ev, CallFailed) and isinstance(ev.error, rpc.DeadlineExceeded)
    assert "connect_get_lib_version: no reply from test within 5 s" in str(ev.error)
    assert p.next_wakeup() is None
    assert p.receive_data(reply_to(data, 1), now=16) == []
    assert p.late_replies == 1 and p.closed is None


def test_the_deadline_heap_stays_small_under_many_answered_calls() -> None:
    p = client()
    for i in range(10_000):
        _, data = p.send_call(LIB_VERSION, (), now=i, timeout=60)
        p.receive_data(reply_to(data, 1), now=i)
    assert len(p._deadlines) < 200


def test_an_abandoned_stream_call_aborts_the_stream_its_late_reply_opens() -> None:
    p = client()
    serial, data = p.send_call(UPLOAD, (VOL, 0, 0, 0), now=0, timeout=5)
    p.abandon(serial)
    assert p.tombstones == 1 and p.streams == {}
    assert p.receive_data(reply_to(data, None), now=1) == []
    assert server_sees(p.data_to_send()) == [StreamAborted(serial, 208)]
    assert p.tombstones == 0


def test_an_abandoned_registration_is_deregistered_when_its_late_reply_comes() -> None:
    p = client()
    _, data = p.send_call(REGISTER, (0, None), now=0, timeout=5)
    p.tick(5)  # its deadline
    p.receive_data(reply_to(data, 77), now=6)
    (dereg,) = server_sees(p.data_to_send())
    assert isinstance(dereg, Call) and dereg.proc == 317
    assert BY_NUMBER[317].decode_args(dereg.payload) == (77,)
    # the deregistration's own reply is ours: dropped silently, not a late reply
    late = p.late_replies
    assert p.receive_data(encode_reply(proc=317, serial=dereg.serial, payload=b""), now=7) == []
    assert p.late_replies == late and p.tombstones == 0
    assert p.subscriptions == frozenset()


def test_abandoning_after_the_reply_undoes_at_once() -> None:
    p = client()
    serial, data = p.send_call(REGISTER, (0, None), now=0, timeout=5)
    p.receive_data(reply_to(data, 5), now=0)
    assert p.subscriptions == {5}
    p.abandon(serial)  # the caller was cancelled after the reply was read
    (dereg,) = server_sees(p.data_to_send())
    assert isinstance(dereg, Call) and dereg.proc == 317 and p.subscriptions == frozenset()
    serial, data = p.send_call(DOWNLOAD, (VOL, 0, 0, 0), now=0, timeout=5)
    p.receive_data(reply_to(data, None), now=0)
    p.abandon(serial)
    assert server_sees(p.data_to_send()) == [StreamAborted(serial, 209)]


def test_a_refused_abandoned_call_undoes_nothing() -> None:
    p = client()
    serial, _ = p.send_call(UPLOAD, (VOL, 0, 0, 0), now=0, timeout=5)
    p.abandon(serial)
    p.receive_data(encode_error_reply(proc=208, serial=serial, error=remote_error(38, "no")), now=1)
    assert p.data_to_send() == b"" and p.tombstones == 0


def test_tombstones_are_bounded() -> None:
    p = client()
    for _ in range(MAX_TOMBSTONES + 10):
        serial, _ = p.send_call(UPLOAD, (VOL, 0, 0, 0), now=0, timeout=5)
        p.abandon(serial)
    assert p.tombstones == MAX_TOMBSTONES


# -- keepalive --------------------------------------------------------------------------------------


def test_keepalive_pings_after_silence_and_declares_the_peer_dead_after_interval_times_count_plus_one() -> (
    None
):
    p = client()
    p.enable_keepalive(interval=5, count=2, now=0)
    assert p.next_wakeup() == 5
    assert p.tick(4.9) == [] and p.data_to_send() == b""
    assert p.tick(5) == [] and p.data_to_send() == PING
    assert p.tick(6) == [] and p.data_to_send() == b""  # one PING per interval
    p.receive_data(PONG, now=7)  # any packet is liveness
    assert p.pongs_received == 1
    assert p.tick(21.9) == [] and p.data_to_send() == PING
    assert p.next_wakeup() == 22  # the peer's death is due before the next PING would be
    events = p.tick(22)
    assert isinstance(events[-1], ConnectionClosed)
    assert "no data from test for 15.0 s (keepalive: interval 5 s x 3)" in str(events[-1].error)


def test_a_ping_is_answered_while_the_send_buffer_drains_and_not_after() -> None:
    p = client()
    ping = encode_packet(prog=KEEPALIVE_PROGRAM, vers=1, proc=1, type=2, serial=0, status=0)
    p.receive_data(ping, now=0)
    assert p.data_to_send() == PONG
    p.write_backlog = lambda: 10 * 1024 * 1024
    p.receive_data(ping * 3, now=0)
    assert p.data_to_send() == b"" and p.pings_received == 4


# -- events -----------------------------------------------------------------------------------------


def lifecycle(callback_id: int, event: int = 2) -> bytes:
    pk = xdrlib3.Packer()
    LIFECYCLE_MSG.pack(pk, LifecycleEvent(callback_id, DOM, event, 0))
    return encode_event(proc=318, payload=pk.get_buffer())


def test_events_go_only_to_registered_callbacks_from_the_reply_on() -> None:
    p = client()
    _, data = p.send_call(REGISTER, (0, None), now=0, timeout=5)
    before = p.receive_data(lifecycle(9), now=0)
    assert before == []  # not registered yet
    events = p.receive_data(reply_to(data, 9) + lifecycle(9) + lifecycle(8), now=0)
    assert [type(e) for e in events] == [CallDone, LifecycleReceived]
    assert events[1] == LifecycleReceived(9, LifecycleEvent(9, DOM, 2, 0))


def test_a_malformed_event_costs_only_that_event() -> None:
    """Well framed, its body truncated: reported to its subscription in its place, and the events around
    it still arrive; neither the connection nor the subscription ends."""
    p = client()
    _, data = p.send_call(REGISTER, (0, None), now=0, timeout=5)
    p.receive_data(reply_to(data, 9), now=0)
    bad = encode_event(proc=318, payload=(9).to_bytes(4, "big") + b"\0\0")
    events = p.receive_data(lifecycle(9, 1) + bad + lifecycle(9, 5), now=0)
    assert [type(e) for e in events] == [LifecycleReceived, EventMalformed, LifecycleReceived]
    ev = events[1]
    assert isinstance(ev, EventMalformed) and (ev.callback_id, ev.event_id) == (9, DomainEventID.LIFECYCLE)
    assert isinstance(ev.error, rpc.MalformedEvent)
    assert "malformed lifecycle event for callback 9" in str(ev.error)
    assert events[2] == LifecycleReceived(9, LifecycleEvent(9, DOM, 5, 0))
    assert p.bad_events == 1 and p.closed is None and p.subscriptions == frozenset({9})


@pytest.mark.parametrize("reads", [1, 2])
def test_a_desync_behind_a_short_event_still_ends_the_connection(reads: int) -> None:
    """An event whose length word is 8 bytes short looks, on its own, like a well-framed event with a
    truncated body (if it is all a read holds, it is reported as one); but its last 8 bytes are then read
    as the next packet's start, which is no packet: that desync still closes the connection, and the
    subscription hears ConnectionLost, not MalformedEvent."""
    p = client()
    _, data = p.send_call(REGISTER, (0, None), now=0, timeout=5)
    p.receive_data(reply_to(data, 9), now=0)
    whole = lifecycle(9, 2)
    short = (len(whole) - 8).to_bytes(4, "big") + whole[4:]
    cut = len(short) - 8 if reads == 2 else len(short)
    events = p.receive_data(short[:cut], now=0) + p.receive_data(short[cut:], now=0)
    expected = [SubscriptionFailed, ConnectionClosed]
    assert [type(e) for e in events] == ([EventMalformed] if reads == 2 else []) + expected
    assert isinstance(events[-2], SubscriptionFailed) and isinstance(events[-2].error, rpc.ConnectionLost)
    assert p.closed is not None and "protocol error" in str(p.closed)


def agent_lifecycle(callback_id: int, state: int, reason: int) -> bytes:
    """Proc 348's body laid out by hand from remote_protocol.x: int callbackID; remote_nonnull_domain dom
    (string name, 4-byte padded; 16-byte uuid; int id); int state; int reason."""
    body = (callback_id.to_bytes(4, "big") + (3).to_bytes(4, "big") + b"vm1\0" + DOM.uuid
            + (3).to_bytes(4, "big") + state.to_bytes(4, "big") + reason.to_bytes(4, "big"))
    return encode_event(proc=348, payload=body)


def test_agent_lifecycle_events_decode_typed_for_their_registration() -> None:
    p = client()
    _, data = p.send_call(REGISTER, (18, None), now=0, timeout=5)
    assert p.receive_data(agent_lifecycle(4, 1, 2), now=0) == []  # not registered yet
    events = p.receive_data(reply_to(data, 4) + agent_lifecycle(4, 1, 2) + agent_lifecycle(4, 2, 0)
                            + agent_lifecycle(5, 1, 1) + agent_lifecycle(4, 7, 9), now=0)
    assert [type(e) for e in events] == [CallDone] + [AgentLifecycleReceived] * 3
    got = [e.event for e in events[1:]]  # type: ignore[union-attr]
    assert got == [rpc.AgentLifecycleEvent(4, DOM, 1, 2), rpc.AgentLifecycleEvent(4, DOM, 2, 0),
                   rpc.AgentLifecycleEvent(4, DOM, 7, 9)]
    assert (got[0].state, got[0].reason) == (rpc.AgentLifecycleState.CONNECTED,
                                             rpc.AgentLifecycleReason.CHANNEL)
    assert type(got[0].state) is rpc.AgentLifecycleState and type(got[1].reason) is rpc.AgentLifecycleReason
    assert got[1].state is rpc.AgentLifecycleState.DISCONNECTED
    assert type(got[2].state) is int and type(got[2].reason) is int  # a later libvirt's value: kept as is


def test_a_malformed_agent_event_costs_only_that_event() -> None:
    p = client()
    _, data = p.send_call(REGISTER, (18, None), now=0, timeout=5)
    p.receive_data(reply_to(data, 4), now=0)
    trailing = agent_lifecycle(4, 1, 2)  # a well-formed body with 4 bytes too many (length fixed up)
    trailing = (len(trailing) + 4).to_bytes(4, "big") + trailing[4:] + bytes(4)
    truncated = encode_event(proc=348, payload=(4).to_bytes(4, "big") + b"\0\0")
    nobodys = encode_event(proc=348, payload=(99).to_bytes(4, "big"))
    events = p.receive_data(truncated + trailing + nobodys + agent_lifecycle(4, 1, 2), now=0)
    assert [type(e) for e in events] == [EventMalformed, EventMalformed, AgentLifecycleReceived]
    for e in events[:2]:
        assert isinstance(e, EventMalformed) and e.event_id == DomainEventID.AGENT_LIFECYCLE
        assert "malformed agent lifecycle event" in str(e.error)
    assert p.bad_events == 3 and p.closed is None  # callback 99 is nobody's: counted, reported to no one


def test_a_short_event_body_with_no_callback_id_is_counted_only() -> None:
    p = client()
    _, data = p.send_call(REGISTER, (18, None), now=0, timeout=5)
    p.receive_data(reply_to(data, 4), now=0)
    assert p.receive_data(encode_event(proc=348, payload=b"\0\0"), now=0) == []
    assert p.bad_events == 1 and p.closed is None


# -- streams ----------------------------------------------------------------------------------------


def open_download(p: ClientProtocol, **kw: object) -> int:
    serial, data = p.send_call(DOWNLOAD, (VOL, 0, 0, 0), now=0, timeout=5)
    p.receive_data(reply_to(data, None), now=0)
    return serial


def test_a_download_buffers_data_until_its_end_and_is_acknowledged() -> None:
    p = client()
    serial = open_download(p)
    stream = p.stream(serial)
    assert stream is not None and stream.open
    events = p.receive_data(stream_packet(serial, 2, b"abc") + stream_packet(serial, 2, b"de"), now=0)
    assert events == [StreamChanged(stream), StreamChanged(stream)]
    assert stream.take() == b"abc" and stream.take() == b"de" and stream.take() is None
    p.receive_data(stream_packet(serial, 2), now=0)
    assert stream.eof
    assert server_sees(p.finish_stream(stream)) == [StreamFinished(serial, 209)]
    p.receive_data(stream_packet(serial, 0), now=0)
    assert stream.finished
    p.close_stream(stream, abort=False)
    assert p.streams == {} and p.data_to_send() == b""


def test_a_download_whose_consumer_falls_behind_fails_alone() -> None:
    p = client(download_high_water=1000)
    serial = open_download(p)
    stream = p.stream(serial)
    assert stream is not None
    p.receive_data(stream_packet(serial, 2, b"x" * 600) * 2, now=0)
    assert isinstance(stream.error, rpc.DownloadOverrun) and stream.buffered == 0
    assert server_sees(p.data_to_send()) == [StreamAborted(serial, 209)]
    assert p.closed is None and p.streams == {}


def test_a_server_stream_error_fails_the_stream_and_upload_sends_are_refused_after_it() -> None:
    p = client()
    serial, data = p.send_call(UPLOAD, (VOL, 0, 0, 0), now=0, timeout=5)
    p.receive_data(reply_to(data, None), now=0)
    stream = p.stream(serial)
    assert stream is not None
    header = p.send_stream_data(stream, 4)
    assert server_sees(header + b"data")[0].data == b"data"  # type: ignore[union-attr]
    err = rpc.messages.encode_remote_error(remote_error(38, "No space left on device"))
    p.receive_data(stream_packet(serial, 1, err, proc=208), now=0)
    with pytest.raises(rpc.LibvirtError, match="No space left"):
        p.send_stream_data(stream, 4)
    with pytest.raises(rpc.LibvirtError, match="No space left"):
        p.finish_stream(stream)


def test_a_stream_hole_fails_that_stream_alone_and_aborts_it() -> None:
    p = client()
    serial = open_download(p)
    stream = p.stream(serial)
    assert stream is not None
    hole = stream_packet(serial, 2, (1 << 20).to_bytes(8, "big") + b"\0\0\0\0", type=MessageType.STREAM_HOLE)
    (ev,) = p.receive_data(hole, now=0)
    assert ev == StreamChanged(stream)
    assert isinstance(stream.error, rpc.ProtocolError) and "STREAM_HOLE" in str(stream.error)
    assert server_sees(p.data_to_send()) == [StreamAborted(serial, 209)]
    assert p.closed is None and p.unsupported_packets == 1
    # and the connection still answers calls
    s, data = p.send_call(LIB_VERSION, (), now=0, timeout=5, token="t")
    assert p.receive_data(reply_to(data, 3), now=0) == [CallDone(s, "t", 3)]


def test_a_reply_passing_file_descriptors_fails_its_call_alone() -> None:
    p = client()
    serial, _ = p.send_call(LIB_VERSION, (), now=0, timeout=5, token="t")
    with_fds = encode_packet(
        prog=REMOTE_PROGRAM,
        vers=1,
        proc=157,
        type=MessageType.REPLY_WITH_FDS,
        serial=serial,
        status=0,
        payload=b"\0\0\0\x01" + b"\0" * 8,
    )
    (ev,) = p.receive_data(with_fds, now=0)
    assert isinstance(ev, CallFailed) and isinstance(ev.error, rpc.ProtocolError)
    assert "REPLY_WITH_FDS" in str(ev.error)
    assert p.closed is None and p.pending == 0


# -- the end ----------------------------------------------------------------------------------------


def test_malformed_framing_fails_everything_with_one_connection_closed() -> None:
    p = client()
    s1, _ = p.send_call(LIB_VERSION, (), now=0, timeout=5, token=1)
    serial = open_download(p)
    events = p.receive_data(b"\x00\x00\x00\x05", now=0)  # a length below the minimum
    kinds = [type(e) for e in events]
    assert kinds == [CallFailed, StreamChanged, ConnectionClosed]
    assert isinstance(events[0].error, rpc.ConnectionLost)  # type: ignore[union-attr]
    assert "protocol error" in str(events[-1].error)  # type: ignore[union-attr]
    assert p.stream(serial) is None
    with pytest.raises(rpc.ConnectionLost):
        p.send_call(LIB_VERSION, (), now=0, timeout=5)
    assert p.receive_data(b"more", now=0) == [] and p.tick(100) == []
    assert s1


def test_eof_in_the_middle_of_a_packet_says_so() -> None:
    p = client()
    p.receive_data(PONG[:10], now=0)
    (ev,) = p.receive_data(b"", now=0)
    assert isinstance(ev, ConnectionClosed) and "in the middle of a packet" in str(ev.error)


# -- the wire trace ---------------------------------------------------------------------------------


def test_the_trace_has_one_record_per_packet_with_header_fields_and_never_a_payload() -> None:
    marker = "#cloud-config SECRET-MARKER-4711"
    records: list[PacketTrace] = []
    p = client(tracer=records.append)
    serial, data = p.send_call(BY_NUMBER[11], (f"<domain>{marker}</domain>",), now=0, timeout=5)
    p.receive_data(reply_to(data, DOM), now=0)
    assert records[0] == PacketTrace(
        Direction.OUT, "REMOTE", 1, "DOMAIN_DEFINE_XML", "CALL", serial, "OK", len(data)
    )
    assert records[1].direction is Direction.IN and records[1].type == "REPLY"
    # an upload of 100 chunks and a download of 50: one summary line each, whatever the chunk count
    s_up, d_up = p.send_call(UPLOAD, (VOL, 0, 0, 0), now=0, timeout=5)
    p.receive_data(reply_to(d_up, None), now=0)
    up = p.stream(s_up)
    assert up is not None
    for _ in range(100):
        p.send_stream_data(up, len(marker))
    p.finish_stream(up)
    p.receive_data(stream_packet(s_up, 0, proc=208), now=0)
    s_down = open_download(p)
    for _ in range(50):
        p.receive_data(stream_packet(s_down, 2, marker.encode()), now=0)
    p.receive_data(stream_packet(s_down, 2), now=0)
    down = p.stream(s_down)
    assert down is not None
    p.finish_stream(down)
    p.receive_data(stream_packet(s_down, 0), now=0)
    p.close_stream(down, abort=False)
    data_lines = [r for r in records if r.type == "STREAM" and r.packets > 1]
    assert sorted((r.direction.value, r.procedure, r.packets) for r in data_lines) == [
        ("in", "STORAGE_VOL_DOWNLOAD", 50),
        ("out", "STORAGE_VOL_UPLOAD", 100),
    ]
    assert len(records) < 20
    assert all(marker not in repr(r) and "SECRET" not in repr(r) for r in records)
    keepalive = client(tracer=records.append)
    keepalive.receive_data(PING, now=0)
    keepalive.data_to_send()
    assert [(r.program, r.procedure) for r in records[-2:]] == [("KEEPALIVE", "PING"), ("KEEPALIVE", "PONG")]


def test_a_stream_cut_by_the_connections_end_still_gets_its_trace_summary() -> None:
    records: list[PacketTrace] = []
    p = client(tracer=records.append)
    s_up, d_up = p.send_call(UPLOAD, (VOL, 0, 0, 0), now=0, timeout=5)
    p.receive_data(reply_to(d_up, None), now=0)
    up = p.stream(s_up)
    assert up is not None
    for _ in range(7):
        p.send_stream_data(up, 1000)
    p.receive_data(b"", now=1)  # the daemon went away mid-upload
    summary = [r for r in records if r.type == "STREAM" and r.direction is Direction.OUT]
    assert [(r.serial, r.packets, r.length) for r in summary] == [(s_up, 7, 7 * 1028)]


def test_a_tracer_that_raises_does_not_break_the_protocol() -> None:
    def boom(_: PacketTrace) -> None:
        raise RuntimeError("tracer bug")

    p = client(tracer=boom)
    s, data = p.send_call(LIB_VERSION, (), now=0, timeout=5, token="t")
    assert p.receive_data(reply_to(data, 1), now=0) == [CallDone(s, "t", 1)]


def test_status_names_in_the_trace() -> None:
    records: list[PacketTrace] = []
    p = client(tracer=records.append)
    serial, _ = p.send_call(LIB_VERSION, (), now=0, timeout=5)
    p.receive_data(encode_error_reply(proc=157, serial=serial, error=remote_error(1, "x")), now=0)
    assert (records[-1].type, records[-1].status) == ("REPLY", "ERROR")
    assert MessageStatus.ERROR.name == "ERROR"
