"""The procedure table against the wire facts, independently of the table's own codecs.

The table in libvirt-rpc.md is copied here as data (number, name, args, ret). Expected bytes come from a
tiny XDR writer in this file built on `struct` alone (4-byte ints, 8-byte hypers, padded strings, 0/1 +
value for optional pointers, count + items for lists), so a wrong width, order, optionality, number,
field name or list limit in rpc/procedures.py fails here even though the table round-trips with itself.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest

import rpc
from rpc.errors import ProtocolError
from rpc.procedures import BY_NUMBER, LIFECYCLE_MSG, PROCEDURES

# -- the wire facts (libvirt-rpc.md, "Procedures") ---------------------------------------------------
# Types: str (nonnull string), ostr (remote_string: optional), i32, u32, u64, char/uchar (4 bytes),
# model (char[32], fixed), uuid (16 fixed bytes), dom/pool/vol (nonnull handles), odom (optional dom),
# "T<N>" a list of at most N items, ifaces (the interface-address list).
F = tuple[tuple[str, str], ...]
VOID: F = ()
TABLE: list[tuple[int, str, F, F]] = [
    (1, "CONNECT_OPEN", (("name", "ostr"), ("flags", "u32")), VOID),
    (2, "CONNECT_CLOSE", VOID, VOID),
    (3, "CONNECT_GET_TYPE", VOID, (("type_", "str"),)),
    (4, "CONNECT_GET_VERSION", VOID, (("hv_ver", "u64"),)),
    (6, "NODE_GET_INFO", VOID, (("model", "model"), ("memory", "u64"), ("cpus", "i32"), ("mhz", "i32"),
                                ("nodes", "i32"), ("sockets", "i32"), ("cores", "i32"), ("threads", "i32"))),
    (9, "DOMAIN_CREATE", (("dom", "dom"),), VOID),
    (11, "DOMAIN_DEFINE_XML", (("xml", "str"),), (("dom", "dom"),)),
    (12, "DOMAIN_DESTROY", (("dom", "dom"),), VOID),
    (14, "DOMAIN_GET_XML_DESC", (("dom", "dom"), ("flags", "u32")), (("xml", "str"),)),
    (23, "DOMAIN_LOOKUP_BY_NAME", (("name", "str"),), (("dom", "dom"),)),
    (24, "DOMAIN_LOOKUP_BY_UUID", (("uuid", "uuid"),), (("dom", "dom"),)),
    (28, "DOMAIN_RESUME", (("dom", "dom"),), VOID),
    (34, "DOMAIN_SUSPEND", (("dom", "dom"),), VOID),
    (35, "DOMAIN_UNDEFINE", (("dom", "dom"),), VOID),
    (59, "CONNECT_GET_HOSTNAME", VOID, (("hostname", "str"),)),
    (60, "CONNECT_SUPPORTS_FEATURE", (("feature", "i32"),), (("supported", "i32"),)),
    (66, "AUTH_LIST", VOID, (("types", "i32<20>"),)),
    (70, "AUTH_POLKIT", VOID, (("complete", "i32"),)),
    (83, "STORAGE_POOL_REFRESH", (("pool", "pool"), ("flags", "u32")), VOID),
    (84, "STORAGE_POOL_LOOKUP_BY_NAME", (("name", "str"),), (("pool", "pool"),)),
    (87, "STORAGE_POOL_GET_INFO", (("pool", "pool"),),
     (("state", "uchar"), ("capacity", "u64"), ("allocation", "u64"), ("available", "u64"))),
    (93, "STORAGE_VOL_CREATE_XML", (("pool", "pool"), ("xml", "str"), ("flags", "u32")), (("vol", "vol"),)),
    (94, "STORAGE_VOL_DELETE", (("vol", "vol"), ("flags", "u32")), VOID),
    (95, "STORAGE_VOL_LOOKUP_BY_NAME", (("pool", "pool"), ("name", "str")), (("vol", "vol"),)),
    (98, "STORAGE_VOL_GET_INFO", (("vol", "vol"),),
     (("type_", "char"), ("capacity", "u64"), ("allocation", "u64"))),
    (99, "STORAGE_VOL_GET_XML_DESC", (("vol", "vol"), ("flags", "u32")), (("xml", "str"),)),
    # remote_protocol.x names this field `name` (libvirt-rpc.md says `path`; the bytes are the same)
    (100, "STORAGE_VOL_GET_PATH", (("vol", "vol"),), (("name", "str"),)),
    (102, "NODE_GET_FREE_MEMORY", VOID, (("free_mem", "u64"),)),
    (110, "CONNECT_GET_URI", VOID, (("uri", "str"),)),
    (125, "STORAGE_VOL_CREATE_XML_FROM",
     (("pool", "pool"), ("xml", "str"), ("clonevol", "vol"), ("flags", "u32")), (("vol", "vol"),)),
    (150, "DOMAIN_IS_ACTIVE", (("dom", "dom"),), (("active", "i32"),)),
    (157, "CONNECT_GET_LIB_VERSION", VOID, (("lib_ver", "u64"),)),
    (196, "DOMAIN_CREATE_WITH_FLAGS", (("dom", "dom"), ("flags", "u32")), (("dom", "dom"),)),
    (208, "STORAGE_VOL_UPLOAD", (("vol", "vol"), ("offset", "u64"), ("length", "u64"), ("flags", "u32")),
     VOID),
    (209, "STORAGE_VOL_DOWNLOAD", (("vol", "vol"), ("offset", "u64"), ("length", "u64"), ("flags", "u32")),
     VOID),
    (212, "DOMAIN_GET_STATE", (("dom", "dom"), ("flags", "u32")), (("state", "i32"), ("reason", "i32"))),
    (231, "DOMAIN_UNDEFINE_FLAGS", (("dom", "dom"), ("flags", "u32")), VOID),
    (234, "DOMAIN_DESTROY_FLAGS", (("dom", "dom"), ("flags", "u32")), VOID),
    (258, "DOMAIN_SHUTDOWN_FLAGS", (("dom", "dom"), ("flags", "u32")), VOID),
    (260, "STORAGE_VOL_RESIZE", (("vol", "vol"), ("capacity", "u64"), ("flags", "u32")), VOID),
    (264, "DOMAIN_SET_METADATA", (("dom", "dom"), ("type_", "i32"), ("metadata", "ostr"), ("key", "ostr"),
                                  ("uri", "ostr"), ("flags", "u32")), VOID),
    (265, "DOMAIN_GET_METADATA", (("dom", "dom"), ("type_", "i32"), ("uri", "ostr"), ("flags", "u32")),
     (("metadata", "str"),)),
    (273, "CONNECT_LIST_ALL_DOMAINS", (("need_results", "i32"), ("flags", "u32")),
     (("domains", "dom<16384>"), ("ret", "u32"))),
    (281, "CONNECT_LIST_ALL_STORAGE_POOLS", (("need_results", "i32"), ("flags", "u32")),
     (("pools", "pool<16384>"), ("ret", "u32"))),
    (282, "STORAGE_POOL_LIST_ALL_VOLUMES", (("pool", "pool"), ("need_results", "i32"), ("flags", "u32")),
     (("vols", "vol<16384>"), ("ret", "u32"))),
    (316, "CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY", (("event_id", "i32"), ("dom", "odom")),
     (("callback_id", "i32"),)),
    (317, "CONNECT_DOMAIN_EVENT_CALLBACK_DEREGISTER_ANY", (("callback_id", "i32"),), VOID),
    (350, "DOMAIN_DEFINE_XML_FLAGS", (("xml", "str"), ("flags", "u32")), (("dom", "dom"),)),
    (353, "DOMAIN_INTERFACE_ADDRESSES", (("dom", "dom"), ("source", "u32"), ("flags", "u32")),
     (("ifaces", "ifaces"),)),
    (378, "STORAGE_VOL_GET_INFO_FLAGS", (("vol", "vol"), ("flags", "u32")),
     (("type_", "char"), ("capacity", "u64"), ("allocation", "u64"))),
]
LIST_LIMITS = {"dom": 16384, "pool": 16384, "vol": 16384, "i32": 20, "iface": 2048, "addr": 2048}

# -- an independent XDR writer and sample values ------------------------------------------------------


def w_int(v: int) -> bytes:
    return struct.pack(">i", v)


def w_uint(v: int) -> bytes:
    return struct.pack(">I", v)


def w_str(s: str) -> bytes:
    b = s.encode()
    return w_uint(len(b)) + b + b"\0" * (-len(b) % 4)


UUID = bytes(range(16))
DOM = rpc.Domain("vm-1", UUID, 3)
POOL = rpc.StoragePool("default", bytes(range(16, 32)))
VOL = rpc.StorageVol("default", "disk.qcow2", "/var/lib/libvirt/images/disk.qcow2")
IFACES = (
    rpc.DomainInterface("vnet0", "52:54:00:aa:bb:cc", (rpc.DomainIPAddr(0, "10.231.0.5", 24),
                                                       rpc.DomainIPAddr(1, "fd00::5", 64))),
    rpc.DomainInterface("lo", None, ()),
)


class Sample:
    """Distinct values per field, so that two swapped fields of one type are told apart."""

    def __init__(self) -> None:
        self.n = 0

    def value(self, t: str) -> Any:
        self.n += 1
        n = self.n
        if "<" in t:
            inner = t.split("<")[0]
            return (self.value(inner), self.value(inner))
        return {
            "str": f"s{n}-é",
            "ostr": f"o{n}",
            "i32": -n,
            "char": -n,
            "u32": 4_000_000_000 + n,
            "uchar": n,
            "u64": 2**40 + n,
            "model": "x86_64",
            "uuid": UUID,
            "dom": DOM,
            "odom": DOM,
            "pool": POOL,
            "vol": VOL,
            "ifaces": IFACES,
        }[t]


def encode(t: str, v: Any) -> bytes:
    if "<" in t:
        inner = t.split("<")[0]
        return w_uint(len(v)) + b"".join(encode(inner, x) for x in v)
    if t == "str":
        return w_str(v)
    if t in ("ostr", "odom"):
        return w_uint(0) if v is None else w_uint(1) + encode(t[1:] if t == "odom" else "str", v)
    if t in ("i32", "char"):
        return w_int(v)
    if t in ("u32", "uchar"):
        return w_uint(v)
    if t == "u64":
        return struct.pack(">Q", v)
    if t == "model":
        return b"".join(w_int(c) for c in v.encode().ljust(32, b"\0"))  # char[32]: 32 ints
    if t == "uuid":
        return v
    if t == "dom":
        return w_str(v.name) + v.uuid + w_int(v.id)
    if t == "pool":
        return w_str(v.name) + v.uuid
    if t == "vol":
        return w_str(v.pool) + w_str(v.name) + w_str(v.key)
    if t == "ifaces":
        out = w_uint(len(v))
        for i in v:
            out += w_str(i.name) + encode("ostr", i.hwaddr) + w_uint(len(i.addrs))
            out += b"".join(w_int(a.type_) + w_str(a.addr) + w_uint(a.prefix) for a in i.addrs)
        return out
    raise AssertionError(t)


def test_the_table_has_every_documented_procedure() -> None:
    assert {(n, name) for n, name, _, _ in TABLE} <= {(p.number, p.name) for p in PROCEDURES}


@pytest.mark.parametrize(("number", "name", "args", "ret"), TABLE, ids=[t[1] for t in TABLE])
def test_procedure_bytes_match_the_wire_facts(number: int, name: str, args: F, ret: F) -> None:
    proc = BY_NUMBER[number]
    assert proc.name == name
    # args: the client's bytes are what the protocol says
    s = Sample()
    values = tuple(s.value(t) for _, t in args)
    expected = b"".join(encode(t, v) for (_, t), v in zip(args, values, strict=True))
    assert ([n for n, _ in proc.args.fields] if proc.args else []) == [n for n, _ in args]
    assert proc.encode_args(values) == expected
    # ret: the protocol's bytes decode to the right values under the protocol's field names
    if not ret:
        assert proc.ret is None
        return
    assert [n for n, _ in proc.ret.fields] == [n for n, _ in ret]
    rvalues = [s.value(t) for _, t in ret]
    wire = b"".join(encode(t, v) for (_, t), v in zip(ret, rvalues, strict=True))
    got = proc.decode_ret(wire)
    if len(ret) == 1:
        assert got == rvalues[0]
    else:
        assert dataclasses.astuple(got) == dataclasses.astuple(proc.ret.factory(*rvalues))
        assert [getattr(got, n) for n, _ in ret] == rvalues


def test_lifecycle_message_bytes() -> None:
    from rpc.xdr import Reader

    wire = w_int(7) + encode("dom", DOM) + w_int(5) + w_int(1)
    r = Reader(wire, what="lifecycle event")
    assert LIFECYCLE_MSG.unpack(r) == rpc.LifecycleEvent(7, DOM, 5, 1)
    r.finish()


@pytest.mark.parametrize(
    ("number", "kind"),
    [(273, "dom"), (281, "pool"), (282, "vol"), (66, "i32"), (353, "iface"), (353, "addr")],
)
def test_each_list_refuses_one_item_past_its_limit_before_building_any(number: int, kind: str) -> None:
    limit = LIST_LIMITS[kind]
    proc = BY_NUMBER[number]
    if kind == "addr":  # one interface whose address list is too long
        wire = w_uint(1) + w_str("vnet0") + w_uint(0) + w_uint(limit + 1)
        addr = w_int(0) + w_str("a") + w_uint(8)
        ok = w_uint(1) + w_str("vnet0") + w_uint(0) + w_uint(limit) + addr * limit
    else:
        one = {"dom": encode("dom", DOM), "pool": encode("pool", POOL), "vol": encode("vol", VOL),
               "i32": w_int(0), "iface": w_str("x") + w_uint(0) + w_uint(0)}[kind]
        tail = b"" if kind in ("i32", "iface") else w_uint(0)
        wire = w_uint(limit + 1)  # nothing follows: the count alone must be refused
        ok = w_uint(limit) + one * limit + tail
    with pytest.raises(ProtocolError, match=f"more than the limit {limit}"):
        proc.decode_ret(wire)
    proc.decode_ret(ok)  # exactly the limit is fine
