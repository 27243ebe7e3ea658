"""One simulated libvirt host's state and semantics: the procedures the kvm provider uses, as plain methods.

`Hypervisor` holds one host (domains, one storage pool of volumes, free memory, guest addresses) and
answers each REMOTE procedure through a method named like the rpc client's (`domain_lookup_by_name`,
`storage_vol_create_xml`, ...), taking the decoded arguments and returning rpc.types values, or raising
rpc.errors.LibvirtError with the codes a real libvirtd uses. Two front ends share it, so the semantics
live here once: the in-memory fake client of the unit tests (tests/fakes/libvirt.py) and the wire
server of the simulated lab host (testbed/sim/server.py). Where a code or message was checked against
real libvirtd, tests/integration/test_sim_fidelity.py replays the same calls to both (error domains
too: libvirt 9.0 reports "domain is not running" from VIR_FROM_DOMAIN (20) in its generic checks and
from VIR_FROM_QEMU (10) in the QEMU driver's).

Volume bytes live in a `VolumeData`: memory for the fake, a file in the pool directory for the
simulator (a test image is hundreds of MiB). Lifecycle transitions go to `listeners` (the simulator
turns them into events and boots its guests from them); the guest agent's channel opening and closing
goes to `agent_listeners`, as libvirt's qemu driver reports it (VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE):
DISCONNECTED (reason DOMAIN_STARTED) at a start of a domain with an agent channel, whose guest has not
opened it yet (qemuProcessRefreshChannelVirtioState); CONNECTED (CHANNEL) when the guest's agent opens it
(`set_vm_ip` with the agent); DISCONNECTED (CHANNEL) when the guest closes it: its agent stopped
(`agent_stopped`) or the guest shut down (`shut_off` with SHUTDOWN). A destroy or a QEMU crash sends no
agent event: the guest closes nothing, and libvirt's qemuProcessStop emits none.
"""

from __future__ import annotations

import enum
import os
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lxml import etree

from rpc import types as t
from rpc.constants import (
    DOMAIN_PAUSED_IOERROR,
    AgentLifecycleReason,
    AgentLifecycleState,
    DomainState,
    ErrorCode,
    InterfaceAddressesSource,
    IPAddrType,
    StoragePoolState,
    error_code_name,
)
from rpc.errors import LibvirtError, NotFoundError

GIB = 1024**3
ERROR_DOMAIN_QEMU = 10
ERROR_DOMAIN_STORAGE = 18
ERROR_DOMAIN_DOMAIN = 20  # VIR_FROM_DOMAIN: libvirtd's "domain is not running" checks
DOMAIN_PAUSED_USER = 1  # virDomainPausedReason
DOMAIN_RUNNING_UNPAUSED = 5  # virDomainRunningReason
DOMAIN_RUNNING_BOOTED = 1
DOMAIN_SHUTOFF_SHUTDOWN = 1
DOMAIN_SHUTOFF_DESTROYED = 2
DOMAIN_SHUTOFF_CRASHED = 3
METADATA_ELEMENT = 2  # VIR_DOMAIN_METADATA_ELEMENT



STOCK_NWFILTERS = (
    "allow-arp", "allow-dhcp", "allow-dhcp-server", "allow-dhcpv6", "allow-dhcpv6-server",
    "allow-incoming-ipv4", "allow-incoming-ipv6", "allow-ipv4", "allow-ipv6", "clean-traffic",
    "clean-traffic-gateway", "no-arp-ip-spoofing", "no-arp-mac-spoofing", "no-arp-spoofing",
    "no-ip-multicast", "no-ip-spoofing", "no-ipv6-multicast", "no-ipv6-spoofing", "no-mac-broadcast",
    "no-mac-spoofing", "no-other-l2-traffic", "no-other-rarp-traffic", "qemu-announce-self",
    "qemu-announce-self-rarp",
)

class Lifecycle(enum.IntEnum):
    """virDomainEventType: what a lifecycle event says happened."""

    DEFINED = 0
    UNDEFINED = 1
    STARTED = 2
    SUSPENDED = 3
    RESUMED = 4
    STOPPED = 5


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


class VolumeData(Protocol):
    """A volume's bytes: the slice operations the model uses, over memory or a file."""

    def __len__(self) -> int: ...

    def __getitem__(self, s: slice, /) -> bytes | bytearray: ...

    def __setitem__(self, s: slice, value: bytes | bytearray, /) -> None: ...


class FileData:
    """A volume's bytes in a file of the pool directory (as libvirt's dir pool keeps them)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch(mode=0o600, exist_ok=True)
        self._size = path.stat().st_size  # the simulator is the file's only writer: no stat per question

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, s: slice) -> bytes:
        start, stop, _ = s.indices(len(self))
        with self.path.open("rb") as f:
            f.seek(start)
            return f.read(max(0, stop - start))

    def __setitem__(self, s: slice, value: bytes | bytearray) -> None:
        start = s.start or 0
        with self.path.open("r+b") as f:
            f.seek(start)
            f.write(value)
        self._size = max(self._size, start + len(value))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass
class Volume:
    name: str
    path: str
    format: str
    capacity: int
    data: Any = field(default_factory=bytearray)  # a VolumeData
    backing_path: str | None = None
    backing_format: str | None = None
    xml: str = ""

    @property
    def allocation(self) -> int:
        return len(self.data) if self.backing_path is None else 196_608 + len(self.data)


@dataclass
class Domain:
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
    agent_channel: bool = False  # has the guest agent's virtio channel: libvirt reports its state
    agent_open: bool = False  # the guest's agent has that channel open (closed again by each start)

    def handle(self) -> t.Domain:
        return t.Domain(name=self.name, uuid=self.uuid, id=self.id)


Listener = Callable[[Domain, Lifecycle, int], None]
AgentListener = Callable[[Domain, AgentLifecycleState, AgentLifecycleReason], None]
AGENT_CHANNEL = "org.qemu.guest_agent.0"


def strip_namespaces(xml: str) -> str:
    """What libvirt's GET_METADATA returns: the element with its namespace removed."""
    root = etree.fromstring(xml.encode())
    for el in root.iter():
        el.tag = etree.QName(el).localname
    etree.cleanup_namespaces(root)
    return str(etree.tostring(root, encoding="unicode"))


class Hypervisor:
    """One host. Tests and the simulator's knobs mutate its attributes to stage situations."""

    def __init__(self, name: str, *, pool: str = "default", pool_path: str = "/var/lib/libvirt/images",
                 pool_capacity: int = 100 * GIB, memory: int = 16 * GIB, bridges: Sequence[str] = ("br0",),
                 lib_version: int = 9_000_000, volume_files: bool = False) -> None:
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
        self.volume_files = volume_files  # volumes as files under pool_path (the simulator) or in memory
        self.domains: dict[str, Domain] = {}
        self.volumes: dict[str, Volume] = {}
        self.arp_broken = False  # libvirt's ARP source errors like docs/lab.md quirk 2
        self.agent_ips: dict[str, str] = {}  # domain name -> IP the guest agent reports
        self.neighbours: dict[str, list[dict[str, Any]]] = {}  # bridge -> `ip -j neigh` entries
        self.upload_fail_after: int | None = None  # bytes accepted before "No space left on device"
        self.upload_pieces: dict[str, int] = {}  # volume -> pieces of its last streamed upload
        self.listeners: list[Listener] = []
        self.agent_listeners: list[AgentListener] = []
        self._next_id = 1

    # -- staging helpers -----------------------------------------------------------------------

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
            connects, dom.agent_open = not dom.agent_open, True
            self.agent_ips[name] = ip
            if connects:
                self._emit_agent(dom, AgentLifecycleState.CONNECTED, AgentLifecycleReason.CHANNEL)
        entries = self.neighbours.setdefault(bridge or self.bridges[0], [])
        entries[:] = [e for e in entries if e.get("lladdr") != dom.mac]
        entries.append({"dst": ip, "dev": bridge or self.bridges[0], "lladdr": dom.mac,
                        "state": ["REACHABLE"]})

    def agent_stopped(self, name: str) -> None:
        """The guest's agent stopped (it closed its channel): no more address reports from it."""
        dom = self.domains[name]
        self.agent_ips.pop(name, None)
        if dom.agent_open:
            dom.agent_open = False
            self._emit_agent(dom, AgentLifecycleState.DISCONNECTED, AgentLifecycleReason.CHANNEL)

    def forget_vm_ip(self, name: str) -> None:
        dom = self.domains.get(name)
        self.agent_ips.pop(name, None)
        if dom is not None:
            for entries in self.neighbours.values():
                entries[:] = [e for e in entries if e.get("lladdr") != dom.mac]

    def shut_off(self, name: str, reason: int = DOMAIN_SHUTOFF_SHUTDOWN) -> None:
        """The guest powered off (SHUTDOWN: its agent closed its channel first) or QEMU died (CRASHED)."""
        dom = self.domains[name]
        if reason == DOMAIN_SHUTOFF_SHUTDOWN:
            self.agent_stopped(name)
        dom.state, dom.reason, dom.id = DomainState.SHUTOFF, reason, -1
        self._emit(dom, Lifecycle.STOPPED, 0 if reason == DOMAIN_SHUTOFF_SHUTDOWN else 2)
        if not dom.persistent:
            del self.domains[name]

    def pause_on_io_error(self, name: str, *, fill_pool: bool = True) -> None:
        """The VM's disk write failed and QEMU paused it; by default because the pool filled up (something
        outside libvirt took the rest, which libvirt's pool info shows only after a refresh)."""
        dom = self.domains[name]
        dom.state, dom.reason = DomainState.PAUSED, DOMAIN_PAUSED_IOERROR
        if fill_pool:
            self.outside_usage += self.pool_available()
        self._emit(dom, Lifecycle.SUSPENDED, 2)

    def free_pool_space(self, nbytes: int | None = None) -> None:
        """Free `nbytes` (default: all) of what took the pool's space outside libvirt."""
        self.outside_usage = 0 if nbytes is None else max(0, self.outside_usage - nbytes)

    def pause(self, name: str, reason: int = DOMAIN_PAUSED_USER) -> None:
        """Pause a running VM with a virDomainPausedReason (USER: `virsh suspend`)."""
        dom = self.domains[name]
        dom.state, dom.reason = DomainState.PAUSED, reason
        self._emit(dom, Lifecycle.SUSPENDED, 0)

    def volume_names(self) -> set[str]:
        return set(self.volumes)

    def put_volume(self, name: str, data: bytes, *, fmt: str = "raw") -> Volume:
        vol = self._new_volume(name=name, fmt=fmt, capacity=len(data))
        vol.data[0:len(data)] = data
        self.volumes[name] = vol
        return vol

    def _new_volume(self, *, name: str, fmt: str, capacity: int, xml: str = "") -> Volume:
        path = f"{self.pool_path}/{name}"
        data: Any = FileData(Path(path)) if self.volume_files else bytearray()
        return Volume(name=name, path=path, format=fmt, capacity=capacity, data=data, xml=xml)

    def _emit(self, dom: Domain, event: Lifecycle, detail: int) -> None:
        for listener in list(self.listeners):
            listener(dom, event, detail)

    def _emit_agent(self, dom: Domain, state: AgentLifecycleState, reason: AgentLifecycleReason) -> None:
        if not dom.agent_channel:
            return  # no channel, nothing for libvirt to report (the simulator still answers its agent)
        for listener in list(self.agent_listeners):
            listener(dom, state, reason)

    # -- lookups -------------------------------------------------------------------------------

    def redefine_pool(self) -> None:
        """The pool undefined and defined again (same name and path, volumes kept): libvirt draws a new
        UUID, so a handle looked up before is stale (NO_STORAGE_POOL)."""
        self.pool_uuid = uuidlib.uuid4().bytes

    def pool_handle(self) -> t.StoragePool:
        return t.StoragePool(name=self.pool_name, uuid=self.pool_uuid)

    def vol_handle(self, vol: Volume) -> t.StorageVol:
        return t.StorageVol(pool=self.pool_name, name=vol.name, key=vol.path)

    def domain(self, handle: t.Domain) -> Domain:
        dom = self.domains.get(handle.name)
        if dom is None or dom.uuid != handle.uuid:
            raise lv_error(ErrorCode.NO_DOMAIN, f"Domain not found: no domain with matching uuid "
                                                f"'{uuidlib.UUID(bytes=handle.uuid)}' ({handle.name})")
        return dom

    def check_pool(self, handle: t.StoragePool | str) -> None:
        """A pool handle is resolved by its UUID, as libvirt's storage driver does
        (virStoragePoolObjFromStoragePool): one kept from before the pool was defined again is stale. A
        volume handle names its pool by name (a `str` here)."""
        name = handle if isinstance(handle, str) else handle.name
        if name != self.pool_name:
            raise no_pool(name)
        if not isinstance(handle, str) and handle.uuid != self.pool_uuid:
            uuid = uuidlib.UUID(bytes=handle.uuid)
            raise lv_error(ErrorCode.NO_STORAGE_POOL, f"Storage pool not found: no storage pool with "
                           f"matching uuid '{uuid}' ({name})", domain=ERROR_DOMAIN_STORAGE)
        if not self.pool_active:
            raise lv_error(ErrorCode.OPERATION_INVALID, f"storage pool '{name}' is not active",
                           domain=ERROR_DOMAIN_STORAGE)

    def volume(self, handle: t.StorageVol) -> Volume:
        self.check_pool(handle.pool)
        vol = self.volumes.get(handle.name)
        if vol is None:
            raise no_vol(handle.name)
        return vol

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- procedures: connection and node -------------------------------------------------------

    def connect_get_lib_version(self) -> int:
        return self.lib_version

    def connect_get_version(self) -> int:
        return 7_002_000

    def connect_get_hostname(self) -> str:
        return self.name

    def node_get_free_memory(self) -> int:
        return self.free_memory()

    def node_get_info(self) -> t.NodeGetInfoRet:
        return t.NodeGetInfoRet(model="x86_64", memory=self.memory // 1024, cpus=2, mhz=2000, nodes=1,
                                sockets=1, cores=2, threads=1)

    # -- procedures: domains -------------------------------------------------------------------

    def domain_lookup_by_name(self, name: str) -> t.Domain:
        dom = self.domains.get(name)
        if dom is None:
            raise lv_error(ErrorCode.NO_DOMAIN, f"Domain not found: no domain with matching name '{name}'")
        return dom.handle()

    def domain_define_xml(self, xml: str) -> t.Domain:
        try:
            root = etree.fromstring(xml.encode())
        except etree.XMLSyntaxError as exc:
            raise lv_error(ErrorCode.XML_ERROR, f"XML error: {exc}") from None
        name = root.findtext("name")
        if not name:
            raise lv_error(ErrorCode.XML_ERROR, "XML error: missing domain name")
        if root.get("type") not in ("kvm", "qemu"):
            raise lv_error(ErrorCode.CONFIG_UNSUPPORTED, f"unsupported domain type {root.get('type')!r}")
        if name in self.domains:
            existing = self.domains[name]
            raise lv_error(ErrorCode.OPERATION_FAILED, f"domain '{name}' already exists with uuid "
                                                       f"{uuidlib.UUID(bytes=existing.uuid)}",
                           domain=ERROR_DOMAIN_DOMAIN)
        meta: dict[str, str] = {}
        md = root.find("metadata")
        if md is not None:
            for child in md:
                ns = etree.QName(child).namespace or ""
                meta[ns] = etree.tostring(child, encoding="unicode")
        mac_el = root.find("devices/interface/mac")
        uuid_text = root.findtext("uuid")
        dom = Domain(name=name, uuid=uuidlib.UUID(uuid_text).bytes if uuid_text else uuidlib.uuid4().bytes,
                     xml=xml, memory_mib=int(root.findtext("memory") or 0),
                     mac=mac_el.get("address", "") if mac_el is not None else "", metadata=meta,
                     agent_channel=root.find(f"devices/channel/target[@name='{AGENT_CHANNEL}']") is not None)
        self.domains[name] = dom  # disks are checked at start, not define, as libvirt does
        self._emit(dom, Lifecycle.DEFINED, 0)
        return dom.handle()

    def domain_create_with_flags(self, handle: t.Domain, flags: int = 0) -> t.Domain:
        dom = self.domain(handle)
        if dom.id != -1:
            raise invalid("domain is already running")
        root = etree.fromstring(dom.xml.encode())
        for disk in root.iterfind("devices/disk"):
            src = disk.find("source")
            vol = src.get("volume") if src is not None else None
            if vol and vol not in self.volumes:
                raise no_vol(vol)
        if dom.memory_mib * 1024 * 1024 > self.free_memory() + self.page_cache:
            raise lv_error(ErrorCode.INTERNAL_ERROR, "process exited while connecting to monitor: "
                                                     "cannot allocate memory")
        dom.state, dom.reason, dom.id = DomainState.RUNNING, DOMAIN_RUNNING_BOOTED, self.next_id()
        # A new QEMU: the last run's agent (a destroy or crash closes no channel) is not this guest's, which
        # connects when it opens the channel again.
        dom.agent_open = False
        if dom.agent_channel:
            # libvirt reads the channel's state as it starts the domain: closed, the guest has not booted.
            self._emit_agent(dom, AgentLifecycleState.DISCONNECTED, AgentLifecycleReason.DOMAIN_STARTED)
        self._emit(dom, Lifecycle.STARTED, 0)
        return dom.handle()

    def domain_create(self, handle: t.Domain) -> None:
        self.domain_create_with_flags(handle, 0)

    def domain_destroy_flags(self, handle: t.Domain, flags: int = 0) -> None:
        dom = self.domain(handle)
        if dom.id == -1:
            raise invalid("domain is not running", domain=ERROR_DOMAIN_DOMAIN)
        dom.state, dom.reason, dom.id = DomainState.SHUTOFF, DOMAIN_SHUTOFF_DESTROYED, -1
        self._emit(dom, Lifecycle.STOPPED, 1)
        if not dom.persistent:
            del self.domains[dom.name]

    def domain_destroy(self, handle: t.Domain) -> None:
        self.domain_destroy_flags(handle, 0)

    def domain_suspend(self, handle: t.Domain) -> None:
        d = self.domain(handle)
        if d.id == -1:
            raise invalid("domain is not running", domain=ERROR_DOMAIN_DOMAIN)
        if d.state == DomainState.PMSUSPENDED:
            raise invalid("domain is pmsuspended")
        if d.state != DomainState.PAUSED:  # suspending a paused domain is a no-op, as in libvirt
            d.state, d.reason = DomainState.PAUSED, DOMAIN_PAUSED_USER
            self._emit(d, Lifecycle.SUSPENDED, 0)

    def domain_resume(self, handle: t.Domain) -> None:
        d = self.domain(handle)
        if d.id == -1:
            raise invalid("domain is not running", domain=ERROR_DOMAIN_DOMAIN)
        if d.state == DomainState.PMSUSPENDED:
            raise invalid("domain is pmsuspended")
        if d.state != DomainState.PAUSED:
            raise invalid("domain is already running")
        if d.reason == DOMAIN_PAUSED_IOERROR and self.pool_available() == 0:
            return  # QEMU retries the failed write, which fails again: paused on I/O error at once
        d.state, d.reason = DomainState.RUNNING, DOMAIN_RUNNING_UNPAUSED
        self._emit(d, Lifecycle.RESUMED, 0)

    def domain_undefine_flags(self, handle: t.Domain, flags: int = 0) -> None:
        d = self.domain(handle)
        if not d.persistent:
            raise invalid("cannot undefine transient domain")
        if d.id != -1:
            d.persistent = False  # a running domain becomes transient, like libvirt
        else:
            del self.domains[d.name]
        self._emit(d, Lifecycle.UNDEFINED, 0)

    def domain_undefine(self, handle: t.Domain) -> None:
        self.domain_undefine_flags(handle, 0)

    def domain_get_state(self, handle: t.Domain, flags: int = 0) -> t.DomainGetStateRet:
        d = self.domain(handle)
        return t.DomainGetStateRet(state=int(d.state), reason=d.reason)

    def domain_is_active(self, handle: t.Domain) -> int:
        return int(self.domain(handle).id != -1)

    def domain_get_xml_desc(self, handle: t.Domain, flags: int = 0) -> str:
        """The defined XML with its `<uuid>` (libvirt fills one in at define when the XML has none)."""
        d = self.domain(handle)
        root = etree.fromstring(d.xml.encode())
        if root.find("uuid") is None:
            el = etree.Element("uuid")
            el.text = str(uuidlib.UUID(bytes=d.uuid))
            name = root.find("name")
            root.insert(list(root).index(name) + 1 if name is not None else 0, el)
        return str(etree.tostring(root, encoding="unicode"))

    def domain_get_metadata(self, handle: t.Domain, type_: int, uri: str | None, flags: int = 0) -> str:
        d = self.domain(handle)
        if type_ != METADATA_ELEMENT or uri not in d.metadata:
            raise lv_error(ErrorCode.NO_DOMAIN_METADATA, "metadata not found: Requested metadata element "
                                                         "is not present", domain=ERROR_DOMAIN_DOMAIN)
        return strip_namespaces(d.metadata[uri])

    def domain_interface_addresses(self, handle: t.Domain, source: int, flags: int = 0
                                   ) -> tuple[t.DomainInterface, ...]:
        d = self.domain(handle)
        if d.id == -1:
            raise invalid("domain is not running", domain=ERROR_DOMAIN_DOMAIN)
        if source == InterfaceAddressesSource.AGENT:
            ip = self.agent_ips.get(d.name)
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
            if self.arp_broken:
                raise lv_error(ErrorCode.INTERNAL_ERROR, "internal error: wrong nlmsg len")
            out = []
            for entries in self.neighbours.values():
                for e in entries:
                    if e.get("lladdr") == d.mac:
                        out.append(t.DomainInterface(name="vnet0", hwaddr=d.mac, addrs=(
                            t.DomainIPAddr(type_=IPAddrType.IPV4, addr=e["dst"], prefix=0),)))
            return tuple(out)
        raise lv_error(ErrorCode.ARGUMENT_UNSUPPORTED, f"unsupported address source {source}")

    def connect_list_nwfilters(self, maxnames: int) -> tuple[str, ...]:
        """The stock filters libvirt 9.0's nwfilter driver defines (what preflight looks for); the
        simulator lists them but applies none: its guests are processes, not NICs on a bridge."""
        return STOCK_NWFILTERS[:maxnames]

    def connect_list_all_domains(self, need_results: int = 1, flags: int = 0) -> t.ConnectListAllDomainsRet:
        doms = tuple(d.handle() for d in self.domains.values())
        return t.ConnectListAllDomainsRet(domains=doms if need_results else (), ret=len(doms))

    # -- procedures: storage -------------------------------------------------------------------

    def storage_pool_lookup_by_name(self, name: str) -> t.StoragePool:
        if name != self.pool_name:
            raise no_pool(name)
        return self.pool_handle()

    def storage_pool_get_info(self, pool: t.StoragePool) -> t.StoragePoolGetInfoRet:
        if pool.name != self.pool_name or pool.uuid != self.pool_uuid:
            self.check_pool(pool)  # the error libvirt gives (an inactive pool still answers get_info)
        avail = self.pool_available(as_libvirt_sees=True)
        state = StoragePoolState.RUNNING if self.pool_active else StoragePoolState.INACTIVE
        return t.StoragePoolGetInfoRet(state=int(state), capacity=self.pool_capacity,
                                       allocation=self.pool_capacity - avail, available=avail)

    def storage_pool_refresh(self, pool: t.StoragePool, flags: int = 0) -> None:
        self.check_pool(pool)
        self._outside_seen = self.outside_usage  # statvfs again
        for vol in self.volumes.values():  # libvirt re-probes formats on refresh
            if vol.data[:4] == b"QFI\xfb":
                vol.format = "qcow2"

    def storage_vol_lookup_by_name(self, pool: t.StoragePool, name: str) -> t.StorageVol:
        self.check_pool(pool)
        return self.vol_handle(self.volume(t.StorageVol(pool=pool.name, name=name, key="")))

    def storage_vol_create_xml(self, pool: t.StoragePool, xml: str, flags: int = 0) -> t.StorageVol:
        self.check_pool(pool)
        root = etree.fromstring(xml.encode())
        name = root.findtext("name") or ""
        if name in self.volumes:
            raise lv_error(ErrorCode.STORAGE_VOL_EXIST, f"storage volume '{name}' exists already",
                           domain=ERROR_DOMAIN_STORAGE)
        fmt_el = root.find("target/format")
        backing = root.find("backingStore")
        backing_path = backing.findtext("path") if backing is not None else None
        backing_format = None
        if backing is not None:
            bf = backing.find("format")
            backing_format = bf.get("type") if bf is not None else None
            if not any(v.path == backing_path for v in self.volumes.values()):
                raise lv_error(ErrorCode.NO_STORAGE_VOL, f"Storage volume not found: no storage vol with "
                                                         f"matching path '{backing_path}'")
        allocation = 0 if backing is None else 196_608
        if allocation > self.pool_available():
            raise no_space(f"cannot create volume '{name}'")
        vol = self._new_volume(name=name, fmt=fmt_el.get("type", "raw") if fmt_el is not None else "raw",
                               capacity=int(root.findtext("capacity") or 0), xml=xml)
        vol.backing_path, vol.backing_format = backing_path, backing_format
        self.volumes[name] = vol
        return self.vol_handle(vol)

    def storage_vol_delete(self, vol: t.StorageVol, flags: int = 0) -> None:
        v = self.volume(vol)
        del self.volumes[v.name]
        if isinstance(v.data, FileData):
            v.data.remove()

    def storage_vol_get_path(self, vol: t.StorageVol) -> str:
        return self.volume(vol).path

    def storage_vol_get_info(self, vol: t.StorageVol) -> t.StorageVolGetInfoRet:
        v = self.volume(vol)
        return t.StorageVolGetInfoRet(type_=0, capacity=v.capacity, allocation=v.allocation)

    def storage_vol_get_xml_desc(self, vol: t.StorageVol, flags: int = 0) -> str:
        """The description libvirt's dir pool generates (not the XML the volume was created from)."""
        v = self.volume(vol)
        backing = ""
        if v.backing_path is not None:
            fmt = f"<format type='{v.backing_format}'/>" if v.backing_format else ""
            backing = f"<backingStore><path>{v.backing_path}</path>{fmt}</backingStore>"
        return (f"<volume type='file'><name>{v.name}</name><key>{v.path}</key>"
                f"<capacity unit='bytes'>{v.capacity}</capacity>"
                f"<allocation unit='bytes'>{v.allocation}</allocation>"
                f"<physical unit='bytes'>{len(v.data)}</physical>"
                f"<target><path>{v.path}</path><format type='{v.format}'/></target>{backing}</volume>\n")

    def storage_pool_is_active(self, pool: t.StoragePool) -> int:
        self.storage_pool_lookup_by_name(pool.name)
        return int(self.pool_active)

    def storage_pool_is_persistent(self, pool: t.StoragePool) -> int:
        self.storage_pool_lookup_by_name(pool.name)
        return 1

    def storage_pool_get_autostart(self, pool: t.StoragePool) -> int:
        self.storage_pool_lookup_by_name(pool.name)
        return 1

    def storage_vol_get_info_flags(self, vol: t.StorageVol, flags: int = 0) -> t.StorageVolGetInfoRet:
        return self.storage_vol_get_info(vol)

    def domain_is_persistent(self, handle: t.Domain) -> int:
        return int(self.domain(handle).persistent)

    def domain_has_managed_save_image(self, handle: t.Domain, flags: int = 0) -> int:
        self.domain(handle)
        return 0

    def storage_pool_list_all_volumes(self, pool: t.StoragePool, need_results: int, flags: int = 0
                                      ) -> t.StoragePoolListAllVolumesRet:
        self.check_pool(pool)
        vols = tuple(self.vol_handle(v) for v in self.volumes.values())
        return t.StoragePoolListAllVolumesRet(vols=vols if need_results else (), ret=len(vols))

    # -- streams: an upload is begun, fed piece by piece, and ended; a download reads a range ---------

    def upload_begin(self, vol: t.StorageVol, offset: int, length: int, flags: int) -> Upload:
        return Upload(self, self.volume(vol), offset)

    def download_range(self, vol: t.StorageVol, offset: int, length: int, flags: int = 0) -> bytes:
        v = self.volume(vol)
        end = len(v.data) if length == 0 else offset + length
        return bytes(v.data[offset:end])


class Upload:
    """One upload stream into a volume: each piece lands at once (what was written stays on failure)."""

    def __init__(self, hyp: Hypervisor, vol: Volume, offset: int) -> None:
        self.hyp = hyp
        self.vol = vol
        self.offset = offset
        self.written = 0
        self.pieces = 0
        hyp.upload_pieces[vol.name] = 0

    def write(self, piece: bytes) -> None:
        limit = self.hyp.upload_fail_after
        at = self.offset + self.written
        growth = max(0, at + len(piece) - len(self.vol.data))
        if (limit is not None and self.written + len(piece) > limit) or growth > self.hyp.pool_available():
            # Like libvirtd: the bytes written so far stay in the file, the stream ends with an error.
            raise no_space(f"unable to write to '{self.vol.path}'")
        self.vol.data[at:at + len(piece)] = piece
        self.written += len(piece)
        self.pieces += 1
        self.hyp.upload_pieces[self.vol.name] = self.pieces

    def end(self) -> int:
        if self.vol.capacity < len(self.vol.data):
            self.vol.capacity = len(self.vol.data)
        return self.written


def load_pool_dir(hyp: Hypervisor) -> None:
    """Volumes already in the pool directory (a simulator that restarts finds its files, as libvirt does)."""
    for entry in sorted(os.scandir(hyp.pool_path), key=lambda e: e.name):
        if entry.is_file() and entry.name not in hyp.volumes:
            vol = hyp._new_volume(name=entry.name, fmt="raw", capacity=entry.stat().st_size)
            if vol.data[:4] == b"QFI\xfb":
                vol.format = "qcow2"
            hyp.volumes[entry.name] = vol
