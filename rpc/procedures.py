"""The REMOTE program's procedures this client speaks: number, argument struct, return struct.

One table drives everything: the client's generic call path encodes a procedure's arguments and decodes
its reply from here, the observer names calls from here, and the tests walk it to prove every entry
round-trips. Procedure numbers are append-only in libvirt, so a number here never changes meaning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xdrlib3

from . import types as t
from .constants import (
    NODE_INFO_MODEL_LEN,
    REMOTE_AUTH_TYPE_LIST_MAX,
    REMOTE_DOMAIN_INTERFACE_MAX,
    REMOTE_DOMAIN_IP_ADDR_MAX,
    REMOTE_DOMAIN_LIST_MAX,
    REMOTE_STORAGE_POOL_LIST_MAX,
    REMOTE_STORAGE_VOL_LIST_MAX,
)
from .errors import ProtocolError
from .xdr import (
    CHAR,
    ENUM,
    INT,
    UCHAR,
    UHYPER,
    UINT,
    UUID,
    Array,
    CharArray,
    Codec,
    Optional,
    Reader,
    String,
    Struct,
)

# -- shared struct codecs ---------------------------------------------------------------------------
STRING = String()
OPT_STRING = Optional(STRING)  # remote_string
DOMAIN = Struct("remote_nonnull_domain", [("name", STRING), ("uuid", UUID), ("id", INT)], t.Domain)
POOL = Struct("remote_nonnull_storage_pool", [("name", STRING), ("uuid", UUID)], t.StoragePool)
VOL = Struct(
    "remote_nonnull_storage_vol", [("pool", STRING), ("name", STRING), ("key", STRING)], t.StorageVol
)
NETWORK = Struct("remote_nonnull_network", [("name", STRING), ("uuid", UUID)], t.Network)

REMOTE_ERROR = Struct(
    "remote_error",
    [
        ("code", INT),
        ("domain", INT),
        ("message", OPT_STRING),
        ("level", INT),
        ("dom", Optional(DOMAIN)),
        ("str1", OPT_STRING),
        ("str2", OPT_STRING),
        ("str3", OPT_STRING),
        ("int1", INT),
        ("int2", INT),
        ("net", Optional(NETWORK)),
    ],
    t.RemoteError,
)

LIFECYCLE_MSG = Struct(
    "remote_domain_event_callback_lifecycle_msg",
    [("callback_id", INT), ("dom", DOMAIN), ("event", INT), ("detail", INT)],
    t.LifecycleEvent,
)

IP_ADDR = Struct(
    "remote_domain_ip_addr", [("type_", INT), ("addr", STRING), ("prefix", UINT)], t.DomainIPAddr
)
INTERFACE = Struct(
    "remote_domain_interface",
    [("name", STRING), ("hwaddr", OPT_STRING), ("addrs", Array(IP_ADDR, REMOTE_DOMAIN_IP_ADDR_MAX))],
    t.DomainInterface,
)


def _args(*fields: tuple[str, Codec]) -> Struct:
    return Struct("args", fields, tuple)


def _ret(*fields: tuple[str, Codec], factory: Any = None) -> Struct:
    if len(fields) > 1 and factory is None:
        raise AssertionError("a multi-field return needs its dataclass")
    return Struct("ret", fields, factory or (lambda v: v))


@dataclass(frozen=True)
class Procedure:
    """One REMOTE procedure. `ret` of None is void; a one-field ret decodes to that field's value."""

    number: int
    name: str
    args: Struct | None
    ret: Struct | None
    stream: str | None = None  # "upload" / "download": the reply opens a stream with this call's serial

    @property
    def method(self) -> str:
        return self.name.lower()

    def encode_args(self, values: Sequence[Any]) -> bytes:
        if self.args is None:
            if values:
                raise TypeError(f"{self.method} takes no arguments")
            return b""
        if len(values) != len(self.args.fields):
            raise TypeError(f"{self.method} takes {len(self.args.fields)} arguments, got {len(values)}")
        p = xdrlib3.Packer()
        self.args.pack_values(p, values, where=self.method)
        return p.get_buffer()

    def decode_args(self, payload: bytes) -> tuple[Any, ...]:
        if self.args is None:
            Reader(payload, what=f"{self.name} args").finish()
            return ()
        r = Reader(payload, what=f"{self.name} args")
        values = tuple(codec.unpack(r) for _, codec in self.args.fields)
        r.finish()
        return values

    def decode_ret(self, payload: bytes) -> Any:
        r = Reader(payload, what=f"{self.name} reply")
        if self.ret is None:
            r.finish()
            return None
        try:
            fields = self.ret.fields
            value = fields[0][1].unpack(r) if len(fields) == 1 else self.ret.unpack(r)
        except EOFError:
            raise ProtocolError(f"{r.what}: truncated") from None
        r.finish()
        return value

    def encode_ret(self, value: Any) -> bytes:
        """The reply payload for `value` (what a server sends); used by tests and the fake server."""
        if self.ret is None:
            return b""
        p = xdrlib3.Packer()
        if len(self.ret.fields) == 1:
            self.ret.fields[0][1].pack(p, value)
        else:
            self.ret.pack(p, value)
        return p.get_buffer()


_P = Procedure
_DOM = ("dom", DOMAIN)
_POOL = ("pool", POOL)
_VOL = ("vol", VOL)
_FLAGS = ("flags", UINT)
_STREAM_ARGS = _args(_VOL, ("offset", UHYPER), ("length", UHYPER), _FLAGS)

PROCEDURES: tuple[Procedure, ...] = (
    _P(1, "CONNECT_OPEN", _args(("name", OPT_STRING), _FLAGS), None),
    _P(2, "CONNECT_CLOSE", None, None),
    _P(3, "CONNECT_GET_TYPE", None, _ret(("type_", STRING))),
    _P(4, "CONNECT_GET_VERSION", None, _ret(("hv_ver", UHYPER))),
    _P(
        6,
        "NODE_GET_INFO",
        None,
        _ret(
            ("model", CharArray(NODE_INFO_MODEL_LEN)),
            ("memory", UHYPER),
            ("cpus", INT),
            ("mhz", INT),
            ("nodes", INT),
            ("sockets", INT),
            ("cores", INT),
            ("threads", INT),
            factory=t.NodeGetInfoRet,
        ),
    ),
    _P(9, "DOMAIN_CREATE", _args(_DOM), None),
    _P(11, "DOMAIN_DEFINE_XML", _args(("xml", STRING)), _ret(_DOM)),
    _P(12, "DOMAIN_DESTROY", _args(_DOM), None),
    _P(14, "DOMAIN_GET_XML_DESC", _args(_DOM, _FLAGS), _ret(("xml", STRING))),
    _P(23, "DOMAIN_LOOKUP_BY_NAME", _args(("name", STRING)), _ret(_DOM)),
    _P(24, "DOMAIN_LOOKUP_BY_UUID", _args(("uuid", UUID)), _ret(_DOM)),
    _P(28, "DOMAIN_RESUME", _args(_DOM), None),
    _P(34, "DOMAIN_SUSPEND", _args(_DOM), None),
    _P(35, "DOMAIN_UNDEFINE", _args(_DOM), None),
    _P(59, "CONNECT_GET_HOSTNAME", None, _ret(("hostname", STRING))),
    _P(60, "CONNECT_SUPPORTS_FEATURE", _args(("feature", INT)), _ret(("supported", INT))),
    _P(66, "AUTH_LIST", None, _ret(("types", Array(ENUM, REMOTE_AUTH_TYPE_LIST_MAX)))),
    _P(70, "AUTH_POLKIT", None, _ret(("complete", INT))),
    _P(83, "STORAGE_POOL_REFRESH", _args(_POOL, _FLAGS), None),
    _P(84, "STORAGE_POOL_LOOKUP_BY_NAME", _args(("name", STRING)), _ret(_POOL)),
    _P(
        87,
        "STORAGE_POOL_GET_INFO",
        _args(_POOL),
        _ret(
            ("state", UCHAR),
            ("capacity", UHYPER),
            ("allocation", UHYPER),
            ("available", UHYPER),
            factory=t.StoragePoolGetInfoRet,
        ),
    ),
    _P(93, "STORAGE_VOL_CREATE_XML", _args(_POOL, ("xml", STRING), _FLAGS), _ret(_VOL)),
    _P(94, "STORAGE_VOL_DELETE", _args(_VOL, _FLAGS), None),
    _P(95, "STORAGE_VOL_LOOKUP_BY_NAME", _args(_POOL, ("name", STRING)), _ret(_VOL)),
    _P(
        98,
        "STORAGE_VOL_GET_INFO",
        _args(_VOL),
        _ret(("type_", CHAR), ("capacity", UHYPER), ("allocation", UHYPER), factory=t.StorageVolGetInfoRet),
    ),
    _P(99, "STORAGE_VOL_GET_XML_DESC", _args(_VOL, _FLAGS), _ret(("xml", STRING))),
    _P(100, "STORAGE_VOL_GET_PATH", _args(_VOL), _ret(("path", STRING))),
    _P(102, "NODE_GET_FREE_MEMORY", None, _ret(("free_mem", UHYPER))),
    _P(110, "CONNECT_GET_URI", None, _ret(("uri", STRING))),
    _P(
        125,
        "STORAGE_VOL_CREATE_XML_FROM",
        _args(_POOL, ("xml", STRING), ("clonevol", VOL), _FLAGS),
        _ret(_VOL),
    ),
    _P(150, "DOMAIN_IS_ACTIVE", _args(_DOM), _ret(("active", INT))),
    _P(157, "CONNECT_GET_LIB_VERSION", None, _ret(("lib_ver", UHYPER))),
    _P(196, "DOMAIN_CREATE_WITH_FLAGS", _args(_DOM, _FLAGS), _ret(_DOM)),
    _P(208, "STORAGE_VOL_UPLOAD", _STREAM_ARGS, None, stream="upload"),
    _P(209, "STORAGE_VOL_DOWNLOAD", _STREAM_ARGS, None, stream="download"),
    _P(
        212,
        "DOMAIN_GET_STATE",
        _args(_DOM, _FLAGS),
        _ret(("state", INT), ("reason", INT), factory=t.DomainGetStateRet),
    ),
    _P(231, "DOMAIN_UNDEFINE_FLAGS", _args(_DOM, _FLAGS), None),
    _P(234, "DOMAIN_DESTROY_FLAGS", _args(_DOM, _FLAGS), None),
    _P(258, "DOMAIN_SHUTDOWN_FLAGS", _args(_DOM, _FLAGS), None),
    _P(260, "STORAGE_VOL_RESIZE", _args(_VOL, ("capacity", UHYPER), _FLAGS), None),
    _P(
        264,
        "DOMAIN_SET_METADATA",
        _args(
            _DOM,
            ("type_", INT),
            ("metadata", OPT_STRING),
            ("key", OPT_STRING),
            ("uri", OPT_STRING),
            _FLAGS,
        ),
        None,
    ),
    _P(
        265,
        "DOMAIN_GET_METADATA",
        _args(_DOM, ("type_", INT), ("uri", OPT_STRING), _FLAGS),
        _ret(("metadata", STRING)),
    ),
    _P(
        273,
        "CONNECT_LIST_ALL_DOMAINS",
        _args(("need_results", INT), _FLAGS),
        _ret(
            ("domains", Array(DOMAIN, REMOTE_DOMAIN_LIST_MAX)),
            ("ret", UINT),
            factory=t.ConnectListAllDomainsRet,
        ),
    ),
    _P(
        281,
        "CONNECT_LIST_ALL_STORAGE_POOLS",
        _args(("need_results", INT), _FLAGS),
        _ret(
            ("pools", Array(POOL, REMOTE_STORAGE_POOL_LIST_MAX)),
            ("ret", UINT),
            factory=t.ConnectListAllStoragePoolsRet,
        ),
    ),
    _P(
        282,
        "STORAGE_POOL_LIST_ALL_VOLUMES",
        _args(_POOL, ("need_results", INT), _FLAGS),
        _ret(
            ("vols", Array(VOL, REMOTE_STORAGE_VOL_LIST_MAX)),
            ("ret", UINT),
            factory=t.StoragePoolListAllVolumesRet,
        ),
    ),
    _P(
        316,
        "CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY",
        _args(("event_id", INT), ("dom", Optional(DOMAIN))),
        _ret(("callback_id", INT)),
    ),
    _P(317, "CONNECT_DOMAIN_EVENT_CALLBACK_DEREGISTER_ANY", _args(("callback_id", INT)), None),
    _P(350, "DOMAIN_DEFINE_XML_FLAGS", _args(("xml", STRING), _FLAGS), _ret(_DOM)),
    _P(
        353,
        "DOMAIN_INTERFACE_ADDRESSES",
        _args(_DOM, ("source", UINT), _FLAGS),
        _ret(("ifaces", Array(INTERFACE, REMOTE_DOMAIN_INTERFACE_MAX))),
    ),
    _P(
        378,
        "STORAGE_VOL_GET_INFO_FLAGS",
        _args(_VOL, _FLAGS),
        _ret(("type_", CHAR), ("capacity", UHYPER), ("allocation", UHYPER), factory=t.StorageVolGetInfoRet),
    ),
)

#: MESSAGE procedure carrying lifecycle events (not callable).
PROC_DOMAIN_EVENT_CALLBACK_LIFECYCLE = 318

BY_NAME: dict[str, Procedure] = {p.name: p for p in PROCEDURES}
BY_NUMBER: dict[int, Procedure] = {p.number: p for p in PROCEDURES}
