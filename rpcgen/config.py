"""What the .x files do not say and the generator needs: C constants, wire facts of a few procedures,
and the Python names this package already promised.

Each entry is a fact checked against libvirt's sources (include/libvirt/*.h, src/remote/remote_driver.c)
or a name a caller already uses; the generator refuses anything it cannot place rather than guess.
"""

from __future__ import annotations

#: C constants the .x files use but define in libvirt's public headers (libvirt-host.h, libvirt-common.h).
EXTERNAL_CONSTANTS = {
    "VIR_UUID_BUFLEN": 16,
    "VIR_SECURITY_MODEL_BUFLEN": 256 + 1,
    "VIR_SECURITY_LABEL_BUFLEN": 4096 + 1,
    "VIR_SECURITY_DOI_BUFLEN": 256 + 1,
    "VIR_TYPED_PARAM_INT": 1,
    "VIR_TYPED_PARAM_UINT": 2,
    "VIR_TYPED_PARAM_LLONG": 3,
    "VIR_TYPED_PARAM_ULLONG": 4,
    "VIR_TYPED_PARAM_DOUBLE": 5,
    "VIR_TYPED_PARAM_BOOLEAN": 6,
    "VIR_TYPED_PARAM_STRING": 7,
}

#: Procedures whose call or reply carries file descriptors (CALL_WITH_FDS / REPLY_WITH_FDS over a unix
#: socket): their payload alone is not the call, and an SSH channel cannot carry descriptors at all.
FD_PROCEDURES = {
    249: "the call passes a descriptor (virDomainOpenGraphics)",
    309: "the call passes descriptors (virDomainCreateXMLWithFiles)",
    310: "the call passes descriptors (virDomainCreateWithFiles)",
    343: "the reply passes a descriptor (virDomainOpenGraphicsFD)",
    443: "the call passes descriptors (virDomainFDAssociate)",
}

#: Stream procedures the .x does not annotate (@readstream/@writestream) but remote_driver.c opens a
#: stream for: "upload" = client to daemon.
UNANNOTATED_STREAMS = {304: "upload"}  # DOMAIN_MIGRATE_PREPARE_TUNNEL3_PARAMS

#: Streams the client speaks, by hand-written methods (rpc/client.py); every other stream procedure is
#: in the table (so the generic call path refuses it) but has no method.
SPOKEN_STREAMS = {208, 209}

#: Python classes written by hand (rpc/handles.py) for these structs: they carry helpers (uuid_str, a
#: readable repr) callers use. The generator builds their codecs and checks the fields match.
HAND_WRITTEN = {
    "remote_nonnull_domain": "Domain",
    "remote_nonnull_network": "Network",
    "remote_nonnull_storage_pool": "StoragePool",
    "remote_nonnull_storage_vol": "StorageVol",
}

#: Class names that differ from the struct's CamelCase name (names callers already use), or that two
#: structs of identical fields share (STORAGE_VOL_GET_INFO and _FLAGS return the same thing).
CLASS_NAMES = {
    "remote_error": "RemoteError",
    "remote_domain_ip_addr": "DomainIPAddr",
    "remote_storage_vol_get_info_flags_ret": "StorageVolGetInfoRet",
}

#: Structs emitted flattened (a nested struct field's fields inlined), under these names: codec
#: constant, class. The wire bytes are the same; LifecycleEvent predates the generator.
FLATTENED = {
    "remote_domain_event_callback_lifecycle_msg": ("LIFECYCLE_MSG", "LifecycleEvent"),
}

#: Short aliases for codecs other modules import by these names.
CODEC_ALIASES = {
    "STRING": "REMOTE_NONNULL_STRING",
    "OPT_STRING": "REMOTE_STRING",
    "DOMAIN": "REMOTE_NONNULL_DOMAIN",
    "POOL": "REMOTE_NONNULL_STORAGE_POOL",
    "VOL": "REMOTE_NONNULL_STORAGE_VOL",
    "NETWORK": "REMOTE_NONNULL_NETWORK",
    "STREAM_HOLE": "VIR_NET_STREAM_HOLE",
}

#: Argument defaults (applied only where every later argument has one too).
ARG_DEFAULTS = {"flags": "0", "need_results": "1"}

#: Names a method argument may not take: the keyword-only deadline and the method's own `self`.
RESERVED_ARGS = {"self", "timeout"}

#: Docstrings for classes and methods whose behaviour a caller needs to know beyond the protocol.
CLASS_DOCS = {
    "RemoteError": "remote_error, in wire order.",
    "NodeGetInfoRet": "`model` is char[32] on the wire, trimmed at the first NUL; `memory` in KiB.",
    "StoragePoolGetInfoRet": "Sizes in bytes; `state` a StoragePoolState value.",
    "StorageVolGetInfoRet": "Sizes in bytes; `type_` (protocol `type`) a StorageVolType value.",
    "DomainIPAddr": "remote_domain_ip_addr; `type_` (protocol `type`) is IPAddrType (0 v4, 1 v6).",
    "DomainInterface": "remote_domain_interface; DOMAIN_INTERFACE_ADDRESSES returns a tuple of these.",
    "LifecycleEvent": (
        "remote_domain_event_callback_lifecycle_msg, flattened: {callbackID, msg: {dom, event, detail}}."
    ),
    "TypedParamValue": (
        "remote_typed_param_value: `type_` a VIR_TYPED_PARAM_* number, `value` the arm's value."
    ),
}
METHOD_DOCS = {
    "domain_resume": "Run a paused domain's vCPUs again; OPERATION_INVALID (55) if it is not paused.",
    "domain_suspend": (
        "Pause a running domain's vCPUs (state PAUSED, reason USER); the memory stays allocated."
    ),
}

#: The libvirt release the vendored .x files come from (rpc/protocol/README.md says where and why).
LIBVIRT_RELEASE = "9.0.0"
