"""The per-RPC `libvirt call` log lines (logger `kvm.libvirt`), fed by the rpc client's observer hook.

V(1): method, the identifiers it named (domain, pool, volume), curated results (state, path,
interfaces, ...), duration, and on failure error + libvirtCode/libvirtCodeName/libvirtMessage.
V(2) adds the bulky or sensitive-ish parts: domain/volume `xml`, the `metadata` element, interface
`addresses`, domain `names`. Stream payloads never reach a record (the rpc package hands us only the
byte count), so the seed ISO upload - the user's cloud-init - is logged as `length` and `duration` only.
V(5) (`--zap-log-level=5`) adds the raw wire tier: one `libvirt packet` line per packet in each direction
with the header fields (program, version, procedure, type, serial, status, length) and never the payload;
a stream's data packets come as one line per stream and direction (`packets`, total `length`).
"""

from __future__ import annotations

import contextvars
from typing import Any

from egress_kvm.log import Logger
from egress_kvm.metrics import LIBVIRT_RPC_DURATION
from rpc.constants import DomainState, StoragePoolState
from rpc.errors import LibvirtError, NotFoundError
from rpc.observe import CallRecord, Observer
from rpc.trace import PacketTrace, Tracer

#: The verbosity of the raw wire tier (one line per packet).
WIRE_V = 5

# The instance an operation is about, so RPC lines of a Create carry `name` even for volume calls.
current_instance: contextvars.ContextVar[str] = contextvars.ContextVar("current_instance", default="")


def _state_name(value: int, enum: Any) -> str:
    try:
        return str(enum(value).name).lower()
    except ValueError:
        return str(value)


def _curated(rec: CallRecord, verbose: bool) -> dict[str, Any]:
    p, result, args = rec.procedure, rec.result, rec.args
    out: dict[str, Any] = {}
    if rec.error is None:
        if p == "DOMAIN_GET_STATE":
            out["state"] = _state_name(result.state, DomainState)
            out["reason"] = result.reason
        elif p == "STORAGE_VOL_GET_PATH":
            out["path"] = result
        elif p == "DOMAIN_INTERFACE_ADDRESSES":
            out["interfaces"] = len(result)
            if verbose:
                out["addresses"] = [
                    {"name": i.name, "hwaddr": i.hwaddr, "addrs": [f"{a.addr}/{a.prefix}" for a in i.addrs]}
                    for i in result]
        elif p == "STORAGE_POOL_GET_INFO":
            out.update(state=_state_name(result.state, StoragePoolState), capacity=result.capacity,
                       allocation=result.allocation, available=result.available)
        elif p == "NODE_GET_FREE_MEMORY":
            out["freeMemory"] = result
        elif p in ("CONNECT_GET_LIB_VERSION", "CONNECT_GET_VERSION"):
            out["version"] = result
        elif p == "DOMAIN_IS_ACTIVE":
            out["active"] = bool(result)
        elif p == "CONNECT_LIST_ALL_DOMAINS":
            out["count"] = len(result.domains)
            if verbose:
                out["names"] = [d.name for d in result.domains]
        elif p == "STORAGE_POOL_LIST_ALL_VOLUMES":
            out["count"] = len(result.vols)
            if verbose:
                out["names"] = [v.name for v in result.vols]
        elif p in ("STORAGE_VOL_UPLOAD", "STORAGE_VOL_DOWNLOAD"):
            out["length"] = result
        elif p == "STORAGE_VOL_GET_INFO":
            out.update(capacity=result.capacity, allocation=result.allocation)
        if verbose:
            if p in ("DOMAIN_GET_XML_DESC", "STORAGE_VOL_GET_XML_DESC"):
                out["xml"] = result
            elif p == "DOMAIN_GET_METADATA":
                out["metadata"] = result
    if verbose:
        if p in ("DOMAIN_DEFINE_XML", "DOMAIN_DEFINE_XML_FLAGS", "STORAGE_VOL_CREATE_XML"):
            out["xml"] = args.get("xml")
        elif p == "DOMAIN_SET_METADATA":
            out["metadata"] = args.get("metadata")
    return out


def make_observer(log: Logger, *, host: str) -> Observer:
    """An observer for one host's client: logs at V(1)/V(2) and records the RPC duration metric."""
    call_log = log.with_name("libvirt").with_values(host=host)

    def observe(rec: CallRecord) -> None:
        err = rec.error
        result = "ok" if err is None else ("not_found" if isinstance(err, NotFoundError) else "error")
        LIBVIRT_RPC_DURATION.labels(host, rec.method, result).observe(rec.duration)
        line = call_log.v(1)
        if not line.enabled():
            return
        fields: dict[str, Any] = {"method": rec.method}
        ids = rec.identifiers
        fields.update(ids)
        name = current_instance.get() or ids.get("domain", "")
        if name:
            fields["name"] = name
        fields.update(_curated(rec, verbose=call_log.enabled(2)))
        fields["duration"] = round(rec.duration, 6)
        if err is not None:
            fields["error"] = str(err)
            if isinstance(err, LibvirtError):
                fields.update(libvirtCode=err.code, libvirtCodeName=err.code_name, libvirtMessage=err.message)
        line.info("libvirt call", **fields)

    return observe


def make_tracer(log: Logger, *, host: str) -> Tracer | None:
    """The V(5) wire tracer for one host's client, or None when V(5) is off: then the rpc client skips
    tracing altogether (it costs nothing per packet). Logging is configured before providers are made."""
    line = log.with_name("libvirt").with_values(host=host).v(WIRE_V)
    if not line.enabled():
        return None

    def trace(rec: PacketTrace) -> None:
        fields: dict[str, Any] = {
            "direction": rec.direction.value, "program": rec.program, "version": rec.version,
            "procedure": rec.procedure, "type": rec.type, "serial": rec.serial, "status": rec.status,
            "length": rec.length}
        if rec.packets != 1:
            fields["packets"] = rec.packets
        line.info("libvirt packet", **fields)

    return trace
