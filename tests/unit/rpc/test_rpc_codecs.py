"""XDR codecs and the procedure table: round trips, wire bytes checked by hand, limits before allocation."""

from __future__ import annotations

import contextlib
import inspect
import struct
from typing import Any

import pytest
import xdrlib3
from hypothesis import given, settings
from hypothesis import strategies as st

import rpc
from rpc import procedures as P
from rpc import xdr
from rpc.errors import ProtocolError
from rpc.procedures import BY_NAME, PROCEDURES

UUID = bytes(range(16))


def sample(codec: xdr.Codec, depth: int = 0) -> Any:
    """A representative value for any codec in the table (nested structs included)."""
    if codec is P.DOMAIN:
        return rpc.Domain("vm-1", UUID, 3)
    if codec is P.POOL:
        return rpc.StoragePool("default", UUID)
    if codec is P.VOL:
        return rpc.StorageVol("default", "disk.qcow2", "/var/lib/libvirt/images/disk.qcow2")
    if isinstance(codec, xdr.Optional):
        return sample(codec.inner, depth)
    if isinstance(codec, xdr.XdrUnion):  # every arm of the union, in turn
        arms = sorted(codec.arms.items())
        d, arm = arms[depth % len(arms)]
        return codec.factory(d, None if arm is None else sample(arm[1], depth + 1))
    if isinstance(codec, xdr.Opaque):
        return b"\x00\xffopaque"
    if codec is xdr.DOUBLE:
        return 2.5
    if codec is xdr.BOOL:
        return True
    if isinstance(codec, xdr.FixedArray):
        return tuple(sample(codec.inner, depth + 1) for _ in range(codec.n))
    if isinstance(codec, xdr.String):
        return "héllo wörld"
    if isinstance(codec, xdr.CharArray):
        return "x86_64"
    if isinstance(codec, xdr.FixedOpaque):
        return UUID
    if isinstance(codec, xdr.Array):
        return (sample(codec.inner, depth + 1), sample(codec.inner, depth + 1))
    if isinstance(codec, xdr.Struct):
        return codec.factory(*[sample(c, depth + 1) for _, c in codec.fields])
    if codec is P.UHYPER:
        return 2**40 + 5
    if codec is P.UINT:
        return 4000000000
    return 7


def test_table_matches_the_wire_facts() -> None:
    numbers = {p.name: p.number for p in PROCEDURES}
    assert numbers["CONNECT_OPEN"] == 1 and numbers["CONNECT_GET_LIB_VERSION"] == 157
    assert numbers["STORAGE_VOL_UPLOAD"] == 208 and numbers["DOMAIN_INTERFACE_ADDRESSES"] == 353
    # libvirt 9.0.0 declares 443; the 51 event messages and 5 descriptor-passing procedures are not calls.
    assert len(PROCEDURES) == len({p.number for p in PROCEDURES}) == 387


@pytest.mark.parametrize("proc", PROCEDURES, ids=lambda p: p.name)
def test_every_procedure_round_trips_args_and_ret(proc: P.Procedure) -> None:
    args = tuple(sample(c) for _, c in proc.args.fields) if proc.args else ()
    assert proc.decode_args(proc.encode_args(args)) == args
    if proc.ret is None:
        assert proc.decode_ret(b"") is None
        return
    if len(proc.ret.fields) == 1:
        value = sample(proc.ret.fields[0][1])
    else:
        value = proc.ret.factory(*[sample(c) for _, c in proc.ret.fields])
    payload = proc.encode_ret(value)
    assert proc.decode_ret(payload) == value
    if payload:
        with pytest.raises(ProtocolError, match=r"truncated|needs"):
            proc.decode_ret(payload[:-4])
    with pytest.raises(ProtocolError, match="trailing"):
        proc.decode_ret(payload + b"\0\0\0\0")


@pytest.mark.parametrize("proc", [p for p in PROCEDURES if not p.stream], ids=lambda p: p.name)
def test_client_has_a_method_per_procedure_with_protocol_argument_names(proc: P.Procedure) -> None:
    method = getattr(rpc.Client, proc.method)
    params = [
        n
        for n, prm in inspect.signature(method).parameters.items()
        if n != "self" and prm.kind != prm.KEYWORD_ONLY
    ]
    assert params == [n for n, _ in proc.args.fields] if proc.args else params == []
    assert inspect.signature(method).parameters["timeout"].kind == inspect.Parameter.KEYWORD_ONLY


def test_stream_methods_have_the_issue_signatures() -> None:
    up = inspect.signature(rpc.Client.storage_vol_upload).parameters
    assert list(up)[1:6] == ["vol", "offset", "length", "flags", "data"]
    down = inspect.signature(rpc.Client.storage_vol_download).parameters
    assert list(down)[1:5] == ["vol", "offset", "length", "flags"]
    assert inspect.signature(rpc.Client.connect_list_all_domains).parameters["need_results"].default == 1


def test_connect_open_args_on_the_wire() -> None:
    got = BY_NAME["CONNECT_OPEN"].encode_args(("qemu:///system", 0))
    want = bytes.fromhex("000000010000000e") + b"qemu:///system" + b"\0\0" + bytes.fromhex("00000000")
    assert got == want
    assert BY_NAME["CONNECT_OPEN"].encode_args((None, 1)) == bytes.fromhex("0000000000000001")


def test_domain_reply_decoded_from_hand_written_bytes() -> None:
    wire = bytes.fromhex("00000003") + b"vm1\0" + UUID + struct.pack(">i", -1)
    assert BY_NAME["DOMAIN_LOOKUP_BY_NAME"].decode_ret(wire) == rpc.Domain("vm1", UUID, -1)


def test_node_info_model_is_32_four_byte_chars() -> None:
    model = b"x86_64".ljust(32, b"\0")
    wire = b"".join(struct.pack(">i", c) for c in model) + struct.pack(
        ">Qiiiiii", 8 << 20, 2, 2400, 1, 1, 2, 1
    )
    assert len(wire) == 128 + 8 + 24
    info = BY_NAME["NODE_GET_INFO"].decode_ret(wire)
    assert info == rpc.NodeGetInfoRet("x86_64", 8 << 20, 2, 2400, 1, 1, 2, 1)


def test_storage_vol_info_uses_type_underscore() -> None:
    wire = struct.pack(">iQQ", 0, 1 << 30, 4096)
    assert BY_NAME["STORAGE_VOL_GET_INFO"].decode_ret(wire) == rpc.StorageVolGetInfoRet(
        type_=0, capacity=1 << 30, allocation=4096
    )


def test_interface_addresses_nested_lists() -> None:
    wire = (
        struct.pack(">I", 1)
        + struct.pack(">I", 4) + b"eth0"
        + struct.pack(">II", 1, 17) + b"52:54:00:aa:bb:cc\0\0\0"
        + struct.pack(">I", 1)
        + struct.pack(">iI", 0, 11) + b"10.231.1.10\0"
        + struct.pack(">I", 24)
    )  # fmt: skip
    [iface] = BY_NAME["DOMAIN_INTERFACE_ADDRESSES"].decode_ret(wire)
    assert iface == rpc.DomainInterface(
        "eth0", "52:54:00:aa:bb:cc", (rpc.DomainIPAddr(0, "10.231.1.10", 24),)
    )


def test_string_longer_than_the_limit_refused_before_reading() -> None:
    r = xdr.Reader(struct.pack(">I", 4194305), what="t")
    with pytest.raises(ProtocolError, match="more than the limit 4194304"):
        xdr.String().unpack(r)


def test_string_longer_than_the_packet_refused() -> None:
    r = xdr.Reader(struct.pack(">I", 1000) + b"abc\0", what="t")
    with pytest.raises(ProtocolError, match="only 4 left"):
        xdr.String().unpack(r)


def test_list_count_over_the_maximum_refused() -> None:
    wire = struct.pack(">I", 16385)
    with pytest.raises(ProtocolError, match="more than the limit 16384"):
        BY_NAME["CONNECT_LIST_ALL_DOMAINS"].decode_ret(wire)


def test_list_count_over_the_bytes_left_refused_before_building() -> None:
    # 16384 domains would need >= 16384 * 24 bytes; only a few are there.
    wire = struct.pack(">I", 16384) + b"\0" * 40
    with pytest.raises(ProtocolError, match="items"):
        BY_NAME["CONNECT_LIST_ALL_DOMAINS"].decode_ret(wire)


def test_auth_list_maximum_is_20() -> None:
    ok = struct.pack(">I", 20) + b"\0" * 80
    assert BY_NAME["AUTH_LIST"].decode_ret(ok) == (0,) * 20
    with pytest.raises(ProtocolError):
        BY_NAME["AUTH_LIST"].decode_ret(struct.pack(">I", 21) + b"\0" * 84)


def test_optional_flag_other_than_0_or_1_refused() -> None:
    with pytest.raises(ProtocolError, match="flag must be 0 or 1"):
        xdr.Optional(xdr.String()).unpack(xdr.Reader(struct.pack(">I", 2), what="t"))


def test_bad_argument_named_in_the_error() -> None:
    with pytest.raises(TypeError, match="domain_lookup_by_name: argument name=5"):
        BY_NAME["DOMAIN_LOOKUP_BY_NAME"].encode_args((5,))
    with pytest.raises(ValueError, match="storage_vol_resize: argument capacity=-1: -1 out of range"):
        BY_NAME["STORAGE_VOL_RESIZE"].encode_args((rpc.StorageVol("p", "v", "k"), -1, 0))
    with pytest.raises(ValueError, match="uuid must be exactly 16 bytes"):
        BY_NAME["DOMAIN_LOOKUP_BY_UUID"].encode_args((b"short",))
    with pytest.raises(ValueError, match="exceeds the protocol limit"):
        BY_NAME["DOMAIN_DEFINE_XML"].encode_args(("x" * 4194305,))
    with pytest.raises(TypeError, match="takes 2 arguments"):
        BY_NAME["DOMAIN_GET_STATE"].encode_args((rpc.Domain("a", UUID, 1),))
    with pytest.raises(TypeError, match="bool"):
        BY_NAME["CONNECT_SUPPORTS_FEATURE"].encode_args((True,))


def test_non_utf8_names_round_trip_byte_for_byte() -> None:
    raw = b"\x00\x00\x00\x03v\xffm\x00" + UUID + b"\x00\x00\x00\x01"
    dom = BY_NAME["DOMAIN_LOOKUP_BY_NAME"].decode_ret(raw)
    assert BY_NAME["DOMAIN_CREATE"].encode_args((dom,)) == raw


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), n=st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_string_and_int_round_trip(text: str, n: int) -> None:
    p = xdrlib3.Packer()
    xdr.String().pack(p, text)
    xdr.INT.pack(p, n)
    r = xdr.Reader(p.get_buffer())
    assert xdr.String().unpack(r) == text
    assert xdr.INT.unpack(r) == n
    r.finish()


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400), proc=st.sampled_from([p for p in PROCEDURES if p.ret]))
def test_random_reply_bodies_decode_or_raise_protocol_error(data: bytes, proc: P.Procedure) -> None:
    # Anything but a value or ProtocolError (IndexError, EOFError, struct.error, MemoryError) fails.
    with contextlib.suppress(ProtocolError):
        proc.decode_ret(data)
