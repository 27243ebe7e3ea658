"""DOMAIN_RESUME (28) and DOMAIN_SUSPEND (34): the table entries, the wire bytes, the client methods."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator

import pytest
from rpc_fake_server import FakeError, FakeServer, open_client

import rpc
from rpc.constants import REMOTE_PROGRAM, MessageType
from rpc.framing import PacketDecoder
from rpc.messages import encode_call
from rpc.procedures import BY_NAME, BY_NUMBER

pytestmark = pytest.mark.timeout(20)

UUID = bytes(range(16))
DOM = rpc.Domain("vm1", UUID, 4)
# remote_nonnull_domain {name, uuid[16], id}: string "vm1" (length + 3 bytes + 1 pad), 16 raw bytes, int 4.
DOM_WIRE = bytes.fromhex("00000003") + b"vm1\0" + UUID + bytes.fromhex("00000004")


@pytest.mark.parametrize(("name", "number"), [("DOMAIN_RESUME", 28), ("DOMAIN_SUSPEND", 34)])
def test_table_entry_numbers_and_shapes(name: str, number: int) -> None:
    proc = BY_NAME[name]
    assert proc.number == number and BY_NUMBER[number] is proc
    assert [n for n, _ in proc.args.fields] == ["dom"]
    assert proc.ret is None and proc.stream is None  # void reply
    assert proc.method == name.lower()


@pytest.mark.parametrize("name", ["DOMAIN_RESUME", "DOMAIN_SUSPEND"])
def test_args_on_the_wire(name: str) -> None:
    proc = BY_NAME[name]
    assert proc.encode_args((DOM,)) == DOM_WIRE
    assert proc.decode_args(DOM_WIRE) == (DOM,)
    assert proc.decode_ret(b"") is None


def test_whole_call_packet_for_resume() -> None:
    packet = encode_call(proc=28, serial=7, payload=BY_NAME["DOMAIN_RESUME"].encode_args((DOM,)))
    # length word (itself included), then prog, vers 1, proc 28, type CALL 0, serial 7, status OK 0.
    header = struct.pack(">IIIiIiI", 4 + 24 + len(DOM_WIRE), REMOTE_PROGRAM, 1, 28, 0, 7, 0)
    assert packet == header + DOM_WIRE
    [decoded] = PacketDecoder().feed(packet)
    assert (decoded.header.proc, decoded.header.type, decoded.payload) == (28, MessageType.CALL, DOM_WIRE)


def test_void_reply_with_a_body_is_refused() -> None:
    with pytest.raises(rpc.ProtocolError, match="trailing"):
        BY_NAME["DOMAIN_RESUME"].decode_ret(b"\0\0\0\0")


def test_bad_domain_argument_is_refused_before_sending() -> None:
    with pytest.raises(TypeError, match=r"domain_suspend: argument dom='vm1'"):
        BY_NAME["DOMAIN_SUSPEND"].encode_args(("vm1",))


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    s = FakeServer()
    yield s
    await s.stop()


async def test_client_methods_send_the_domain_and_return_none(server: FakeServer) -> None:
    seen: list[tuple[int, rpc.Domain]] = []
    server.handlers[34] = lambda dom: seen.append((34, dom))
    server.handlers[28] = lambda dom: seen.append((28, dom))
    records: list[rpc.CallRecord] = []
    client = await open_client(server, observer=records.append)
    assert await client.domain_suspend(DOM) is None
    assert await client.domain_resume(DOM) is None
    assert seen == [(34, DOM), (28, DOM)]
    [suspend, resume] = [r for r in records if r.procedure in ("DOMAIN_SUSPEND", "DOMAIN_RESUME")]
    assert (suspend.method, suspend.args, suspend.ok) == ("domain_suspend", {"dom": DOM}, True)
    assert resume.identifiers.get("domain") == "vm1"
    await client.close()


async def test_resume_of_a_shut_off_domain_raises_operation_invalid(server: FakeServer) -> None:
    def resume(dom: rpc.Domain) -> None:
        raise FakeError(55, "Requested operation is not valid: domain is not running")

    server.handlers[28] = resume
    client = await open_client(server)
    with pytest.raises(rpc.LibvirtError) as ei:
        await client.domain_resume(rpc.Domain("vm1", UUID, -1))
    assert (ei.value.code, ei.value.code_name) == (55, "OPERATION_INVALID")
    assert not isinstance(ei.value, rpc.NotFoundError)
    await client.close()
