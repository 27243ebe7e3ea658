"""An in-memory libvirt hypervisor with the rpc client's method names, return shapes and error codes.

`FakeHypervisor` holds one host's state (domains, one storage pool of volumes with their bytes, free
memory, a neighbour table, a bridge list); `FakeLibvirtClient` exposes it through the same methods the
rpc client has (`domain_lookup_by_name`, `storage_vol_upload`, ...), returning rpc.types values and
raising rpc.errors with the codes a real libvirtd uses (NO_DOMAIN 42, NO_STORAGE_VOL 50,
OPERATION_INVALID 55 (also for resuming a domain that is not paused, as libvirt 9.0 does), OPERATION_FAILED
9 for a second define, NO_DOMAIN_METADATA 80,
STORAGE_VOL_EXIST 90, AGENT_UNRESPONSIVE 86, INTERNAL_ERROR "wrong nlmsg len" for the ARP source), and
feeding the same `observer` with rpc.observe.CallRecord values, so the provider cannot tell it from the
real client. Every call is also appended to `FakeHypervisor.calls` for counting.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid as uuidlib
from collections.abc import AsyncIterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lxml import etree

from egress_kvm.providers.kvm.session import DialOptions, ExecNotAllowed, ExecResult
from rpc import types as t
from rpc.constants import (
    DOMAIN_PAUSED_IOERROR,
    DomainState,
    ErrorCode,
    InterfaceAddressesSource,
    IPAddrType,
    StoragePoolState,
    error_code_name,
)
from rpc.errors import ConnectionLost, LibvirtError, NotFoundError
from rpc.observe import CallRecord, Observer
from rpc.procedures import BY_NAME

GIB = 1024**3
ERROR_DOMAIN_QEMU = 10
ERROR_DOMAIN_STORAGE = 18
ERROR_DOMAIN_DOMAIN = 20  # VIR_FROM_DOMAIN: libvirtd's "domain is not running" checks
DOMAIN_PAUSED_USER = 1  # virDomainPausedReason
DOMAIN_RUNNING_UNPAUSED = 5  # virDomainRunningReason


def lv_error(code: int, message: str, *, domain: int = ERROR_DOMAIN_QEMU) -> LibvirtError:
    cls = NotFoundError if code in (ErrorCode.NO_DOMAIN, ErrorCode.NO_STORAGE_POOL,
                                    ErrorCode.NO_STORAGE_VOL) else LibvirtError
    return cls(code, error_code_name(code), domain, message)


def no_pool(name: str) -> LibvirtError:
    return lv_error(ErrorCode.NO_STORAGE_POOL, f"Storage pool not found: no storage pool with matching name "
                    f"'{name}'", domain=ERROR_DOMAIN_STORAGE)


def no_vol(name: str) -> LibvirtError:
    return lv_error(ErrorCode.NO_STORAGE_VOL, f"Storage volume not found: no storage vol with matching name "
                    f"'{name}'", domain=ERROR_DOMAIN_STORAGE)


def invalid(what: str, *, domain: int = ERROR_DOMAIN_QEMU) -> LibvirtError:
    return lv_error(ErrorCode.OPERATION_INVALID, f"Requested operation is not valid: {what}", domain=domain)


def no_space(what: str) -> LibvirtError:
    return lv_error(ErrorCode.SYSTEM_ERROR, f"{what}: No space left on device", domain=ERROR_DOMAIN_STORAGE)


@dataclass
class FakeVolume:
    name: str
    path: str
    format: str
    capacity: int
    data: bytearray = field(default_factory=bytearray)
    backing_path: str | None = None
    backing_format: str | None = None
    xml: str = ""

    @property
    def allocation(self) -> int:
        return len(self.data) if self.backing_path is None else 196_608 + len(self.data)


@dataclass
class FakeDomain:
    name: str
    uuid: bytes
    xml: str
    memory_mib: int
    mac: str
    metadata: dict[str, str]  # namespace URI -> element XML
    state: int = DomainState.SHUTOFF
    reason: int = 0
    id: int = -1
    persistent: bool = True

    def handle(self) -> t.Domain:
        return t.Domain(name=self.name, uuid=self.uuid, id=self.id)


class FakeHypervisor:
    """One host. Mutate its attributes in tests to stage situations (agent up, pool full, host down)."""

    def __init__(self, name: str, *, pool: str = "default", pool_path: str = "/var/lib/libvirt/images",
                 pool_capacity: int = 100 * GIB, memory: int = 16 * GIB, bridges: Sequence[str] = ("br0",),
                 lib_version: int = 9_000_000) -> None:
        self.name = name
        self.pool_name = pool
        self.pool_path = pool_path
        self.pool_uuid = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"pool:{name}:{pool}").bytes
        self.pool_active = True
        self.pool_capacity = pool_capacity
        # Bytes taken on the pool's filesystem by what libvirt does not count as volumes (other files,
        # another tenant). The kernel's ENOSPC sees it at once; libvirt's pool info only after a refresh.
        self.outside_usage = 0
        self._outside_seen = 0
        self.memory = memory
        self.page_cache = 0  # reclaimable memory: in /proc/meminfo's MemAvailable, not in libvirt's free
        self.bridges = list(bridges)
        self.lib_version = lib_version
        self.domains: dict[str, FakeDomain] = {}
        self.volumes: dict[str, FakeVolume] = {}
        self.calls: list[str] = []
        self.reachable = True
        self.dial_error = "connection refused"
        self.exec_allowed = True
        self.exec_log: list[list[str]] = []
        self.arp_broken = False  # libvirt's ARP source errors like docs/lab.md quirk 2
        self.agent_ips: dict[str, str] = {}  # domain name -> IP the guest agent reports
        self.neighbours: dict[str, list[dict[str, Any]]] = {}  # bridge -> `ip -j neigh` entries
        self.fail: dict[str, LibvirtError] = {}  # method -> error raised once on its next call
        self.upload_fail_after: int | None = None  # bytes accepted before "No space left on device"
        self.upload_pieces: dict[str, int] = {}  # volume -> pieces of its last streamed upload
        self.sessions: list[FakeSession] = []
        self._next_id = 1

    # -- staging helpers for tests -------------------------------------------------------------

    def pool_available(self, *, as_libvirt_sees: bool = False) -> int:
        """Free bytes in the pool: the filesystem's truth, or libvirt's figure as of its last refresh."""
        outside = self._outside_seen if as_libvirt_sees else self.outside_usage
        return max(0, self.pool_capacity - outside - sum(v.allocation for v in self.volumes.values()))

    def free_memory(self) -> int:
        """What libvirt's NODE_GET_FREE_MEMORY reports (MemFree): page cache is not free."""
        used = sum(d.memory_mib * 1024 * 1024 for d in self.domains.values() if d.id != -1)
        return max(0, self.memory - used - self.page_cache)

    def set_vm_ip(self, name: str, ip: str, *, agent: bool = True, bridge: str | None = None) -> None:
        """Make the VM's address visible: to the guest agent (agent=True) and/or the neighbour table."""
        dom = self.domains[name]
        if agent:
            self.agent_ips[name] = ip
        entries = self.neighbours.setdefault(bridge or self.bridges[0], [])
        entries[:] = [e for e in entries if e.get("lladdr") != dom.mac]
        entries.append({"dst": ip, "dev": bridge or self.bridges[0], "lladdr": dom.mac,
                        "state": ["REACHABLE"]})

    def shut_off(self, name: str) -> None:
        dom = self.domains[name]
        dom.state, dom.reason, dom.id = DomainState.SHUTOFF, 1, -1

    def pause_on_io_error(self, name: str, *, fill_pool: bool = True) -> None:
        """The VM's disk write failed and QEMU paused it; by default because the pool filled up (something
        outside libvirt took the rest, which libvirt's pool info shows only after a refresh)."""
        dom = self.domains[name]
        dom.state, dom.reason = DomainState.PAUSED, DOMAIN_PAUSED_IOERROR
        if fill_pool:
            self.outside_usage += self.pool_available()

    def free_pool_space(self, nbytes: int | None = None) -> None:
        """Free `nbytes` (default: all) of what took the pool's space outside libvirt."""
        self.outside_usage = 0 if nbytes is None else max(0, self.outside_usage - nbytes)

    def pause(self, name: str, reason: int = DOMAIN_PAUSED_USER) -> None:
        """Pause a running VM with a virDomainPausedReason (USER: `virsh suspend`)."""
        dom = self.domains[name]
        dom.state, dom.reason = DomainState.PAUSED, reason

    def drop_connections(self, reason: str = "connection reset by peer") -> None:
        """The SSH connections die now (the provider hears of it like from asyncssh's connection_lost)."""
        for s in self.sessions:
            if s.lost is None:
                s.lost = reason
                for cb in s.callbacks:
                    cb(reason)

    def volume_names(self) -> set[str]:
        return set(self.volumes)

    def put_volume(self, name: str, data: bytes, *, fmt: str = "raw") -> FakeVolume:
        vol = FakeVolume(name=name, path=f"{self.pool_path}/{name}", format=fmt, capacity=len(data),
                         data=bytearray(data))
        self.volumes[name] = vol
        return vol

    # -- lookups used by the client ------------------------------------------------------------

    def pool_handle(self) -> t.StoragePool:
        return t.StoragePool(name=self.pool_name, uuid=self.pool_uuid)

    def vol_handle(self, vol: FakeVolume) -> t.StorageVol:
        return t.StorageVol(pool=self.pool_name, name=vol.name, key=vol.path)

    def domain(self, handle: t.Domain) -> FakeDomain:
        dom = self.domains.get(handle.name)
        if dom is None or dom.uuid != handle.uuid:
            raise lv_error(ErrorCode.NO_DOMAIN, f"Domain not found: no domain with matching uuid "
                                                f"'{uuidlib.UUID(bytes=handle.uuid)}' ({handle.name})")
        return dom

    def check_pool(self, handle: t.StoragePool | str) -> None:
        name = handle if isinstance(handle, str) else handle.name
        if name != self.pool_name:
            raise no_pool(name)
        if not self.pool_active:
            raise lv_error(ErrorCode.OPERATION_INVALID, f"storage pool '{name}' is not active",
                           domain=ERROR_DOMAIN_STORAGE)

    def volume(self, handle: t.StorageVol) -> FakeVolume:
        self.check_pool(handle.pool)
        vol = self.volumes.get(handle.name)
        if vol is None:
            raise no_vol(handle.name)
        return vol

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id


def _strip_namespaces(xml: str) -> str:
    """What libvirt's GET_METADATA returns: the element with its namespace removed."""
    root = etree.fromstring(xml.encode())
    for el in root.iter():
        el.tag = etree.QName(el).localname
    etree.cleanup_namespaces(root)
    return etree.tostring(root, encoding="unicode")


class _Download:
    def __init__(self, client: FakeLibvirtClient, vol: t.StorageVol, offset: int, length: int) -> None:
        self._client = client
        self._vol = vol
        self._offset = offset
        self._length = length
        self._chunks: list[bytes] | None = None

    async def __aenter__(self) -> _Download:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __aiter__(self) -> _Download:
        return self

    async def __anext__(self) -> bytes:
        if self._chunks is None:
            args = (self._vol, self._offset, self._length, 0)
            data = await self._client._call("storage_vol_download", args, self._read)
            self._chunks = [data[i:i + 262_120] for i in range(0, len(data), 262_120)]
        if not self._chunks:
            raise StopAsyncIteration
        return self._chunks.pop(0)

    def _read(self) -> bytes:
        vol = self._client.hyp.volume(self._vol)
        end = len(vol.data) if self._length == 0 else self._offset + self._length
        return bytes(vol.data[self._offset:end])

    async def read_all(self) -> bytes:
        return b"".join([c async for c in self])


def _arg_names(method: str, count: int) -> tuple[str, ...]:
    """The protocol's argument names, from the rpc package's own procedure table (as the real observer)."""
    proc = BY_NAME.get(method.upper())
    if proc is None or proc.args is None:
        return tuple(f"arg{i}" for i in range(count))
    return tuple(n for n, _ in proc.args.fields)


class FakeLibvirtClient:
    """The rpc client's surface over a FakeHypervisor (only what the provider and preflight use)."""

    def __init__(self, hyp: FakeHypervisor, session: FakeSession, observer: Observer | None) -> None:
        self.hyp = hyp
        self._session = session
        self.observer = observer

    @property
    def is_connected(self) -> bool:
        return self._session.lost is None

    async def close(self) -> None:
        self._session.lost = self._session.lost or "closed by the client"

    async def _call(self, method: str, args: tuple[Any, ...], fn: Any) -> Any:
        await asyncio.sleep(0)  # a real call always yields to the loop
        started = time.perf_counter()
        self.hyp.calls.append(method)
        result = None
        error: BaseException | None = None
        try:
            if self._session.lost is not None:
                raise ConnectionLost(f"connection to fake {self.hyp.name} lost: {self._session.lost}")
            injected = self.hyp.fail.pop(method, None)
            if injected is not None:
                raise injected
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            if self.observer is not None:
                names = _arg_names(method, len(args))
                record_args = dict(zip(names, args, strict=False))
                self.observer(CallRecord(procedure=method.upper(), method=method, args=record_args,
                                         result=result, error=error, duration=time.perf_counter() - started))

    # -- connection-level ------------------------------------------------------------------------

    async def connect_get_lib_version(self) -> int:
        return await self._call("connect_get_lib_version", (), lambda: self.hyp.lib_version)

    async def connect_get_version(self) -> int:
        return await self._call("connect_get_version", (), lambda: 7_002_000)

    async def connect_get_hostname(self) -> str:
        return await self._call("connect_get_hostname", (), lambda: self.hyp.name)

    async def node_get_free_memory(self) -> int:
        return await self._call("node_get_free_memory", (), self.hyp.free_memory)

    async def node_get_info(self) -> t.NodeGetInfoRet:
        return await self._call("node_get_info", (), lambda: t.NodeGetInfoRet(
            model="x86_64", memory=self.hyp.memory // 1024, cpus=2, mhz=2000, nodes=1, sockets=1, cores=2,
            threads=1))

    # -- domains ---------------------------------------------------------------------------------

    async def domain_lookup_by_name(self, name: str) -> t.Domain:
        def fn() -> t.Domain:
            dom = self.hyp.domains.get(name)
            if dom is None:
                raise lv_error(ErrorCode.NO_DOMAIN, f"Domain not found: no domain with matching name "
                                                    f"'{name}'")
            return dom.handle()
        return await self._call("domain_lookup_by_name", (name,), fn)

    async def domain_define_xml(self, xml: str) -> t.Domain:
        return await self._call("domain_define_xml", (xml,), lambda: self._define(xml))

    def _define(self, xml: str) -> t.Domain:
        try:
            root = etree.fromstring(xml.encode())
        except etree.XMLSyntaxError as exc:
            raise lv_error(ErrorCode.XML_ERROR, f"XML error: {exc}") from None
        name = root.findtext("name")
        if not name:
            raise lv_error(ErrorCode.XML_ERROR, "XML error: missing domain name")
        if root.get("type") not in ("kvm", "qemu"):
            raise lv_error(ErrorCode.CONFIG_UNSUPPORTED, f"unsupported domain type {root.get('type')!r}")
        if name in self.hyp.domains:
            existing = self.hyp.domains[name]
            raise lv_error(ErrorCode.OPERATION_FAILED, f"domain '{name}' already exists with uuid "
                                                       f"{uuidlib.UUID(bytes=existing.uuid)}")
        meta: dict[str, str] = {}
        md = root.find("metadata")
        if md is not None:
            for child in md:
                ns = etree.QName(child).namespace or ""
                meta[ns] = etree.tostring(child, encoding="unicode")
        mac_el = root.find("devices/interface/mac")
        dom = FakeDomain(name=name, uuid=uuidlib.uuid4().bytes, xml=xml,
                         memory_mib=int(root.findtext("memory") or 0),
                         mac=mac_el.get("address", "") if mac_el is not None else "", metadata=meta)
        for disk in root.iterfind("devices/disk"):
            src = disk.find("source")
            if src is not None and src.get("volume") and src.get("volume") not in self.hyp.volumes:
                # libvirt checks volumes at start, not define; remember for _start.
                pass
        self.hyp.domains[name] = dom
        return dom.handle()

    async def domain_create_with_flags(self, dom: t.Domain, flags: int = 0) -> t.Domain:
        return await self._call("domain_create_with_flags", (dom, flags), lambda: self._start(dom))

    async def domain_create(self, dom: t.Domain) -> None:
        await self._call("domain_create", (dom,), lambda: self._start(dom) and None)

    def _start(self, handle: t.Domain) -> t.Domain:
        dom = self.hyp.domain(handle)
        if dom.id != -1:
            raise invalid("domain is already running")
        root = etree.fromstring(dom.xml.encode())
        for disk in root.iterfind("devices/disk"):
            src = disk.find("source")
            vol = src.get("volume") if src is not None else None
            if vol and vol not in self.hyp.volumes:
                raise no_vol(vol)
        if dom.memory_mib * 1024 * 1024 > self.hyp.free_memory() + self.hyp.page_cache:
            raise lv_error(ErrorCode.INTERNAL_ERROR, "process exited while connecting to monitor: "
                                                     "cannot allocate memory")
        dom.state, dom.reason, dom.id = DomainState.RUNNING, 1, self.hyp.next_id()
        return dom.handle()

    async def domain_destroy_flags(self, dom: t.Domain, flags: int = 0) -> None:
        await self._call("domain_destroy_flags", (dom, flags), lambda: self._destroy(dom))

    async def domain_destroy(self, dom: t.Domain) -> None:
        await self._call("domain_destroy", (dom,), lambda: self._destroy(dom))

    def _destroy(self, handle: t.Domain) -> None:
        dom = self.hyp.domain(handle)
        if dom.id == -1:
            raise invalid("domain is not running")
        dom.state, dom.reason, dom.id = DomainState.SHUTOFF, 2, -1
        if not dom.persistent:
            del self.hyp.domains[dom.name]

    async def domain_suspend(self, dom: t.Domain) -> None:
        def fn() -> None:
            d = self.hyp.domain(dom)
            if d.id == -1:
                raise invalid("domain is not running", domain=ERROR_DOMAIN_DOMAIN)
            if d.state == DomainState.PMSUSPENDED:
                raise invalid("domain is pmsuspended")
            if d.state != DomainState.PAUSED:  # suspending a paused domain is a no-op, as in libvirt
                d.state, d.reason = DomainState.PAUSED, DOMAIN_PAUSED_USER
        await self._call("domain_suspend", (dom,), fn)

    async def domain_resume(self, dom: t.Domain) -> None:
        def fn() -> None:
            d = self.hyp.domain(dom)
            if d.id == -1:
                raise invalid("domain is not running", domain=ERROR_DOMAIN_DOMAIN)
            if d.state == DomainState.PMSUSPENDED:
                raise invalid("domain is pmsuspended")
            if d.state != DomainState.PAUSED:
                raise invalid("domain is already running")
            if d.reason == DOMAIN_PAUSED_IOERROR and self.hyp.pool_available() == 0:
                return  # QEMU retries the failed write, which fails again: paused on I/O error at once
            d.state, d.reason = DomainState.RUNNING, DOMAIN_RUNNING_UNPAUSED
        await self._call("domain_resume", (dom,), fn)

    async def domain_undefine_flags(self, dom: t.Domain, flags: int = 0) -> None:
        def fn() -> None:
            d = self.hyp.domain(dom)
            if d.id != -1:
                d.persistent = False  # a running domain becomes transient, like libvirt
            else:
                del self.hyp.domains[d.name]
        await self._call("domain_undefine_flags", (dom, flags), fn)

    async def domain_get_state(self, dom: t.Domain, flags: int = 0) -> t.DomainGetStateRet:
        def fn() -> t.DomainGetStateRet:
            d = self.hyp.domain(dom)
            return t.DomainGetStateRet(state=int(d.state), reason=d.reason)
        return await self._call("domain_get_state", (dom, flags), fn)

    async def domain_is_active(self, dom: t.Domain) -> int:
        return await self._call("domain_is_active", (dom,), lambda: int(self.hyp.domain(dom).id != -1))

    async def domain_get_xml_desc(self, dom: t.Domain, flags: int = 0) -> str:
        return await self._call("domain_get_xml_desc", (dom, flags), lambda: self.hyp.domain(dom).xml)

    async def domain_get_metadata(self, dom: t.Domain, type_: int, uri: str | None, flags: int = 0) -> str:
        def fn() -> str:
            d = self.hyp.domain(dom)
            if type_ != 2 or uri not in d.metadata:
                raise lv_error(ErrorCode.NO_DOMAIN_METADATA, "metadata not found: Requested metadata element "
                                                             "is not present")
            return _strip_namespaces(d.metadata[uri])
        return await self._call("domain_get_metadata", (dom, type_, uri, flags), fn)

    async def domain_interface_addresses(self, dom: t.Domain, source: int, flags: int = 0
                                         ) -> tuple[t.DomainInterface, ...]:
        def fn() -> tuple[t.DomainInterface, ...]:
            d = self.hyp.domain(dom)
            if d.id == -1:
                raise invalid("domain is not running")
            if source == InterfaceAddressesSource.AGENT:
                ip = self.hyp.agent_ips.get(d.name)
                if ip is None:
                    raise lv_error(ErrorCode.AGENT_UNRESPONSIVE, "Guest agent is not responding: QEMU guest "
                                                                 "agent is not connected")
                return (
                    t.DomainInterface(name="lo", hwaddr="00:00:00:00:00:00", addrs=(
                        t.DomainIPAddr(type_=IPAddrType.IPV4, addr="127.0.0.1", prefix=8),)),
                    t.DomainInterface(name="enp1s0", hwaddr=d.mac, addrs=(
                        t.DomainIPAddr(type_=IPAddrType.IPV6, addr="fe80::5054:ff:fe00:1", prefix=64),
                        t.DomainIPAddr(type_=IPAddrType.IPV4, addr="169.254.3.4", prefix=16),
                        t.DomainIPAddr(type_=IPAddrType.IPV4, addr=ip, prefix=24))),
                )
            if source == InterfaceAddressesSource.ARP:
                if self.hyp.arp_broken:
                    raise lv_error(ErrorCode.INTERNAL_ERROR, "internal error: wrong nlmsg len")
                out = []
                for entries in self.hyp.neighbours.values():
                    for e in entries:
                        if e.get("lladdr") == d.mac:
                            out.append(t.DomainInterface(name="vnet0", hwaddr=d.mac, addrs=(
                                t.DomainIPAddr(type_=IPAddrType.IPV4, addr=e["dst"], prefix=0),)))
                return tuple(out)
            raise lv_error(ErrorCode.ARGUMENT_UNSUPPORTED, f"unsupported address source {source}")
        return await self._call("domain_interface_addresses", (dom, source, flags), fn)

    async def connect_list_all_domains(self, need_results: int = 1, flags: int = 0
                                       ) -> t.ConnectListAllDomainsRet:
        def fn() -> t.ConnectListAllDomainsRet:
            doms = tuple(d.handle() for d in self.hyp.domains.values())
            return t.ConnectListAllDomainsRet(domains=doms, ret=len(doms))
        return await self._call("connect_list_all_domains", (need_results, flags), fn)

    # -- storage ---------------------------------------------------------------------------------

    async def storage_pool_lookup_by_name(self, name: str) -> t.StoragePool:
        def fn() -> t.StoragePool:
            if name != self.hyp.pool_name:
                raise no_pool(name)
            return self.hyp.pool_handle()
        return await self._call("storage_pool_lookup_by_name", (name,), fn)

    async def storage_pool_get_info(self, pool: t.StoragePool) -> t.StoragePoolGetInfoRet:
        def fn() -> t.StoragePoolGetInfoRet:
            if pool.name != self.hyp.pool_name:
                raise no_pool(pool.name)
            avail = self.hyp.pool_available(as_libvirt_sees=True)
            state = StoragePoolState.RUNNING if self.hyp.pool_active else StoragePoolState.INACTIVE
            return t.StoragePoolGetInfoRet(state=int(state), capacity=self.hyp.pool_capacity,
                                           allocation=self.hyp.pool_capacity - avail, available=avail)
        return await self._call("storage_pool_get_info", (pool,), fn)

    async def storage_pool_refresh(self, pool: t.StoragePool, flags: int = 0) -> None:
        def fn() -> None:
            self.hyp.check_pool(pool)
            self.hyp._outside_seen = self.hyp.outside_usage  # statvfs again
            for vol in self.hyp.volumes.values():  # libvirt re-probes formats on refresh
                if vol.data[:4] == b"QFI\xfb":
                    vol.format = "qcow2"
        await self._call("storage_pool_refresh", (pool, flags), fn)

    async def storage_pool_list_all_volumes(self, pool: t.StoragePool, need_results: int = 1,
                                            flags: int = 0) -> t.StoragePoolListAllVolumesRet:
        def fn() -> t.StoragePoolListAllVolumesRet:
            self.hyp.check_pool(pool)
            vols = tuple(self.hyp.vol_handle(v) for v in self.hyp.volumes.values())
            return t.StoragePoolListAllVolumesRet(vols=vols, ret=len(vols))
        return await self._call("storage_pool_list_all_volumes", (pool, need_results, flags), fn)

    async def storage_vol_lookup_by_name(self, pool: t.StoragePool, name: str) -> t.StorageVol:
        def fn() -> t.StorageVol:
            self.hyp.check_pool(pool)
            return self.hyp.vol_handle(self.hyp.volume(t.StorageVol(pool=pool.name, name=name, key="")))
        return await self._call("storage_vol_lookup_by_name", (pool, name), fn)

    async def storage_vol_create_xml(self, pool: t.StoragePool, xml: str, flags: int = 0) -> t.StorageVol:
        def fn() -> t.StorageVol:
            self.hyp.check_pool(pool)
            root = etree.fromstring(xml.encode())
            name = root.findtext("name") or ""
            if name in self.hyp.volumes:
                raise lv_error(ErrorCode.STORAGE_VOL_EXIST, f"storage volume '{name}' exists already",
                               domain=ERROR_DOMAIN_STORAGE)
            cap = int(root.findtext("capacity") or 0)
            fmt_el = root.find("target/format")
            backing = root.find("backingStore")
            vol = FakeVolume(name=name, path=f"{self.hyp.pool_path}/{name}",
                             format=fmt_el.get("type", "raw") if fmt_el is not None else "raw", capacity=cap,
                             xml=xml)
            if backing is not None:
                vol.backing_path = backing.findtext("path")
                bf = backing.find("format")
                vol.backing_format = bf.get("type") if bf is not None else None
                if not any(v.path == vol.backing_path for v in self.hyp.volumes.values()):
                    raise lv_error(ErrorCode.NO_STORAGE_VOL, f"Storage volume not found: no storage vol with "
                                                             f"matching path '{vol.backing_path}'")
            if vol.allocation > self.hyp.pool_available():
                raise no_space(f"cannot create volume '{name}'")
            self.hyp.volumes[name] = vol
            return self.hyp.vol_handle(vol)
        return await self._call("storage_vol_create_xml", (pool, xml, flags), fn)

    async def storage_vol_delete(self, vol: t.StorageVol, flags: int = 0) -> None:
        def fn() -> None:
            v = self.hyp.volume(vol)
            del self.hyp.volumes[v.name]
        await self._call("storage_vol_delete", (vol, flags), fn)

    async def storage_vol_get_path(self, vol: t.StorageVol) -> str:
        return await self._call("storage_vol_get_path", (vol,), lambda: self.hyp.volume(vol).path)

    async def storage_vol_get_info(self, vol: t.StorageVol) -> t.StorageVolGetInfoRet:
        def fn() -> t.StorageVolGetInfoRet:
            v = self.hyp.volume(vol)
            return t.StorageVolGetInfoRet(type_=0, capacity=v.capacity, allocation=v.allocation)
        return await self._call("storage_vol_get_info", (vol,), fn)

    async def storage_vol_get_xml_desc(self, vol: t.StorageVol, flags: int = 0) -> str:
        return await self._call("storage_vol_get_xml_desc", (vol, flags), lambda: self.hyp.volume(vol).xml)

    async def storage_vol_upload(self, vol: t.StorageVol, offset: int, length: int, flags: int,
                                 data: bytes | bytearray | memoryview | AsyncIterable[bytes]) -> int:
        async def fn() -> int:
            v = self.hyp.volume(vol)
            buf = bytearray()
            if isinstance(data, bytes | bytearray | memoryview):
                pieces: list[bytes] = [bytes(data)]
                for p in pieces:
                    self._append(v, buf, p)
            else:
                self.hyp.upload_pieces[v.name] = 0
                async for piece in data:
                    self.hyp.upload_pieces[v.name] += 1
                    self._append(v, buf, piece)
            v.data[offset:offset + len(buf)] = buf
            if v.capacity < len(v.data):
                v.capacity = len(v.data)
            return len(buf)
        return await self._call("storage_vol_upload", (vol, offset, length, flags), fn)

    def _append(self, v: FakeVolume, buf: bytearray, piece: bytes) -> None:
        limit = self.hyp.upload_fail_after
        if self._session.lost is not None:
            raise ConnectionLost(f"connection to fake {self.hyp.name} lost: {self._session.lost}")
        if (limit is not None and len(buf) + len(piece) > limit) or \
                len(buf) + len(piece) - len(v.data) > self.hyp.pool_available():
            # Like libvirtd: the bytes written so far stay in the file, the stream ends with an error.
            v.data[:len(buf)] = buf
            raise no_space(f"unable to write to '{v.path}'")
        buf += piece

    def storage_vol_download(self, vol: t.StorageVol, offset: int, length: int, flags: int = 0) -> _Download:
        return _Download(self, vol, offset, length)


class FakeSession:
    """The Session the provider's Host expects: a fake libvirt client plus `ip` exec over "SSH"."""

    def __init__(self, hyp: FakeHypervisor, observer: Observer | None) -> None:
        self.hyp = hyp
        self.lost: str | None = None
        self.callbacks: list[Any] = []
        self.libvirt = FakeLibvirtClient(hyp, self, observer)

    def on_close(self, callback: Any) -> None:
        self.callbacks.append(callback)

    @property
    def closed_reason(self) -> str | None:
        return self.lost

    async def exec(self, argv: Sequence[str], *, time_limit: float) -> ExecResult:
        await asyncio.sleep(0)
        if self.lost is not None:
            raise ConnectionLost(f"connection to fake {self.hyp.name} lost: {self.lost}")
        if not self.hyp.exec_allowed:
            raise ExecNotAllowed("exec refused by the host: administratively prohibited")
        argv = list(argv)
        self.hyp.exec_log.append(argv)
        if argv[:4] == ["ip", "-j", "neigh", "show"] and len(argv) == 6 and argv[4] == "dev":
            if argv[5] not in self.hyp.bridges:
                return ExecResult(1, "", f'Cannot find device "{argv[5]}"\n')
            return ExecResult(0, json.dumps(self.hyp.neighbours.get(argv[5], [])), "")
        if argv == ["cat", "/proc/meminfo"]:
            free_kb = self.hyp.free_memory() // 1024
            avail_kb = (self.hyp.free_memory() + self.hyp.page_cache) // 1024
            return ExecResult(0, f"MemTotal: {self.hyp.memory // 1024} kB\nMemFree: {free_kb} kB\n"
                                 f"MemAvailable: {avail_kb} kB\n", "")
        if argv[:3] == ["ip", "link", "show"] and len(argv) == 4:
            if argv[3] not in self.hyp.bridges:
                return ExecResult(1, "", f'Device "{argv[3]}" does not exist.\n')
            return ExecResult(0, f"5: {argv[3]}: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 state UP\n", "")
        return ExecResult(127, "", f"sh: {argv[0]}: command not found\n")

    async def close(self) -> None:
        self.lost = self.lost or "closed"


class FakeHypervisors:
    """Several fake hosts by name, and the dialer the provider uses to reach them."""

    def __init__(self, names: Sequence[str], **host_kwargs: Any) -> None:
        self.hosts: dict[str, FakeHypervisor] = {n: FakeHypervisor(n, **host_kwargs) for n in names}
        self.dials: list[str] = []

    def __getitem__(self, name: str) -> FakeHypervisor:
        return self.hosts[name]

    async def dial(self, host: Any, options: DialOptions) -> FakeSession:
        await asyncio.sleep(0)
        self.dials.append(host.name)
        hyp = self.hosts[host.name]
        if not hyp.reachable:
            raise OSError(f"connect to {host.address}: {hyp.dial_error}")
        session = FakeSession(hyp, options.observer)
        hyp.sessions.append(session)
        return session

    def set_unreachable(self, name: str, unreachable: bool = True) -> None:
        """Make a host refuse new connections and drop the current ones (or bring it back)."""
        hyp = self.hosts[name]
        hyp.reachable = not unreachable
        if unreachable:
            hyp.drop_connections("host unreachable")
