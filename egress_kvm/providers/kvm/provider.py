"""KvmProvider: the Provider interface over libvirt on the user's own hypervisors.

Create (for a name with no domain yet): image cache -> pool space -> free memory -> overlay -> seed ISO
-> define (with the metadata element) -> start. About a dozen RPCs with a cached base; see
docs/kvm-provider.md for the measured counts and the round trips. Get is four: lookup, then state,
metadata and agent addresses together (plus the neighbour-table exec, and libvirt's ARP source when that
is refused).

A paused domain is resumed by start (and by create's ensure-running path), except while an operation of
libvirt's own holds it paused (migration, save, dump, shutdown, snapshot, start-up). One paused on an I/O
error is resumed only once the pool has room again (see `_resume_room`); until then it is the QuotaError
naming the figures.

Every public method sorts failures into the base module's three kinds: PermanentError (placement names
something the config lacks, or a domain of that name belongs to someone else), QuotaError (capacity, see
capacity.py) and TransientError (host unreachable, link dropped, any other libvirt error).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import aiohttp

from egress_kvm.config.models import EgressConfig, KvmConfig, MachineType
from egress_kvm.log import Logger, get_logger
from egress_kvm.policy.connect import checked_session
from egress_kvm.policy.egress import Policy, Purpose
from egress_kvm.policy.policies import configured_image_policy, url_image_policy
from egress_kvm.providers.base import (
    CreateRequest,
    EventSink,
    Instance,
    InstanceVolume,
    NotOwned,
    PermanentError,
    Placement,
    PowerState,
    ProgressCallback,
    ProviderError,
    QuotaError,
    ResolvedPlacement,
    TransientError,
    VolumeListing,
)
from rpc.constants import (
    CONNECT_LIST_DOMAINS_PERSISTENT,
    DOMAIN_METADATA_ELEMENT,
    DOMAIN_PAUSED_IOERROR,
    DOMAIN_UNDEFINE_MANAGED_SAVE,
    DOMAIN_UNDEFINE_NVRAM,
    DOMAIN_XML_INACTIVE,
    DomainState,
    ErrorCode,
)
from rpc.errors import LibvirtError, NotFoundError
from rpc.types import Domain, DomainGetStateRet, StoragePool, StorageVol

from . import capacity, metadata, naming, placement, seed, static_ip
from .addresses import Sources, conclude, read_sources
from .calllog import current_instance, make_observer, make_tracer
from .domain_xml import DomainSpec, domain_xml, has_traffic_filter, volume_xml, without_uuid
from .eviction import collect_unused_bases
from .hosts import Host
from .images import BaseImage, ImageCache, ImportLimits, delete_volume, lookup_volume
from .imports import Importer
from .placement import ImageSource
from .session import Dialer, DialOptions, ssh_dial
from .together import Settled, settled, together
from .watch import HostWatcher, Watchers

GIB = 1024**3
MIB = 1024**2
Meta = metadata.InstanceMetadata

#: virDomainPausedReason names, for messages and log lines.
PAUSED_REASONS = {
    0: "unknown", 1: "user", 2: "migration", 3: "save", 4: "dump", 5: "I/O error", 6: "watchdog",
    7: "from snapshot", 8: "shutting down", 9: "snapshot", 10: "crashed", 11: "starting up",
    12: "post-copy migration", 13: "failed post-copy migration", 14: "API error",
}
#: Paused reasons that mean an operation of libvirt's own holds the domain paused and will unpause (or stop)
#: it when it ends: resuming it from outside would race that operation.
PAUSED_BY_JOB = {2: "a migration", 3: "a save", 4: "a core dump", 8: "its shutdown", 9: "a snapshot",
                 11: "its start-up", 12: "a post-copy migration"}
#: virDomainRunningReason UNPAUSED: what libvirt reports after a resume.
RUNNING_UNPAUSED = 5
#: Floor of the room a VM paused on an I/O error needs before it is resumed, even when its overlay is
#: fully allocated (qcow2 metadata and the guest's retried write still need some space).
RESUME_MIN_ROOM = 64 * MIB


def paused_reason(reason: int) -> str:
    return PAUSED_REASONS.get(reason, f"reason {reason}")

_POWER = {
    DomainState.RUNNING: PowerState.RUNNING,
    DomainState.BLOCKED: PowerState.RUNNING,
    DomainState.PAUSED: PowerState.PAUSED,
    DomainState.SHUTDOWN: PowerState.STOPPED,
    DomainState.SHUTOFF: PowerState.STOPPED,
    DomainState.CRASHED: PowerState.CRASHED,
}


def power_state(state: int) -> PowerState:
    try:
        return _POWER.get(DomainState(state), PowerState.PENDING)
    except ValueError:
        return PowerState.PENDING


class KvmProvider:
    """One `type: kvm` entry of the providers file: its hosts, image cache and HTTP client."""

    def __init__(self, *, name: str, config: KvmConfig, cluster_id: str, dial: Dialer = ssh_dial,
                 log: Logger | None = None, now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 http_timeout: aiohttp.ClientTimeout | None = None,
                 egress: EgressConfig | None = None) -> None:
        if not cluster_id:
            raise ValueError("cluster_id must not be empty: it keeps clusters sharing a host apart")
        self.name = name
        self.config = config
        self.cluster_id = cluster_id
        self._now = now
        self._log = (log or get_logger("kvm")).with_values(provider=name)
        known_hosts = None if config.insecure_ignore_host_key else config.known_hosts_file
        self._hosts: dict[str, Host] = {}
        for h in config.hosts:
            options = DialOptions(ssh_key_file=config.ssh_key_file, known_hosts_file=known_hosts,
                                  observer=make_observer(self._log, host=h.name),
                                  tracer=make_tracer(self._log, host=h.name))
            self._hosts[h.name] = Host(config=h, dial=dial, options=options, log=self._log)
        self._http: dict[Purpose, aiohttp.ClientSession] = {}
        self._image_policies = {Purpose.CONFIGURED_IMAGE: configured_image_policy(egress),
                                Purpose.URL_IMAGE: url_image_policy(egress, config.url_images)}
        self._http_timeout = http_timeout or aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
        imp = config.image_import
        self._images = ImageCache(http=self._http_session, limits=ImportLimits(
            timeout=imp.timeout_seconds, min_rate=imp.min_bytes_per_second, window=imp.rate_window_seconds,
            reserve=int(config.pool_reserve_gb * GIB)))
        self._importer = Importer(log=self._log)
        self._base_used: dict[str, dict[str, float]] = {}  # host -> base volume -> last use (monotonic)
        # host -> base volume without its marker -> (first seen at one allocation, that allocation)
        self._base_unfinished: dict[str, dict[str, tuple[float, int]]] = {}
        self._watchers: list[Watchers] = []  # lifecycle event watchers handed out (closed with the provider)
        self._addresses = {h.name: static_ip.shared_book(dial, h.address, h.socket)  # static_ip.py
                           for h in config.hosts}
        # host -> domain UUID -> its metadata element, as the last listing read it. The element is written
        # once, when the operator defines the domain (never rewritten), and a UUID is never reused (the
        # domain XML names none: libvirt draws a new one per define), so GC's listing reads the element
        # of new domains only: one call per host per pass instead of one per domain.
        self._listed_meta: dict[str, dict[bytes, Meta | None]] = {}
        # host -> its pool's handle (name and UUID) as last looked up. libvirt resolves a pool handle by
        # its UUID, which stays until the pool is undefined: a create sends its room reads with its
        # domain lookup on the kept handle, and forgets it when libvirt answers NO_STORAGE_POOL (create).
        self._pools: dict[str, StoragePool] = {}

    # -- Provider interface ---------------------------------------------------------------------

    def zones(self) -> list[str]:
        return list(self._hosts)

    def resolve(self, placement_: Placement) -> ResolvedPlacement:
        return placement.resolve(placement_, self.config, provider=self.name,
                                 url_policy=self._image_policies[Purpose.URL_IMAGE])

    def host(self, zone: str) -> Host:
        host = self._hosts.get(zone)
        if host is None:
            raise PermanentError(f"unknown zone {zone!r} for provider {self.name!r} "
                                 f"(known: {', '.join(self._hosts)})")
        return host

    def connected(self, zone: str) -> bool:
        host = self._hosts.get(zone)
        return host is not None and host.connected

    async def create(self, request: CreateRequest, *, progress: ProgressCallback | None = None) -> Instance:
        name = _checked_name(request.name)
        resolved = placement.checked(request.placement, self.config, provider=self.name,
                                     url_policy=self._image_policies[Purpose.URL_IMAGE])
        host = self.host(resolved.zone)
        # One create per name at a time on this host: a second would replace the first one's volumes.
        async with self._operation(host, name, "create"), host.exclusive(f"instance:{name}"):
            known = self._pools.get(host.name)
            pool: StoragePool | None
            if known is not None:
                # The pool's handle from an earlier call: a new VM's room reads (the base image, the
                # pool's space, the host's memory) go out with the domain lookup instead of after a pool
                # lookup, one round and one call fewer. They only read; the answers are used only if
                # there is no domain, and their failures surface where the sequential code raises them
                # (_create_new). A handle gone stale (the pool defined again: a new UUID) fails the
                # pool's info with NO_STORAGE_POOL: forgotten, and looked up afresh.
                mtype = placement.machine_type(self.config, resolved.machine_type)
                source = placement.image_source(self.config, resolved.image)
                # Marked used before it is read, as _base does: eviction's grace must cover the read.
                self._base_used.setdefault(host.name, {})[source.base_volume] = time.monotonic()
                # While its import runs, the importer answers InProgress without reading the cache: no
                # read on speculation either (the ramp's first creates on a host).
                importing = (host.name, known.name, source.base_volume) in self._importer.running_keys()
                dom, cached, available, memory = await together(
                    self._lookup_domain(host, name),
                    settled(self._images.cached(host, known, source) if not importing else _unread()),
                    settled(capacity.refreshed_available(host, known)),
                    settled(self._check_memory(host, memory_mib=mtype.memory_mib,
                                               machine_type=resolved.machine_type)))
                if dom is None and not isinstance(available.error, NotFoundError):
                    return await self._create_new(host, request, resolved, known, progress=progress,
                                                  early=_Early(None if importing else cached, available,
                                                               memory))
                pool = None
                if dom is None:
                    self._pools.pop(host.name, None)
                    pool = await self._find_pool(host)
            else:
                # Both lookups at once: a new VM (the usual case) needs the pool next.
                dom, pool = await together(self._lookup_domain(host, name), self._find_pool(host))
            if dom is not None:
                meta, st = await self._ours_running(host, dom, name, action="reuse",
                                                    owner_uid=request.owner_uid,
                                                    machine_type=resolved.machine_type)
                return replace(await self._instance(host, dom, name, meta, state=st), existed=True)
            if pool is None:
                raise TransientError(f"host {host.name!r} has no storage pool {host.config.pool!r}")
            return await self._create_new(host, request, resolved, pool, progress=progress)

    async def get(self, name: str, zone: str, *, owner_uid: str | None = None) -> Instance | None:
        host = self.host(zone)
        async with self._operation(host, name, "get"):
            dom = await self._lookup_domain(host, name)
            if dom is None:
                return None
            try:
                # One round after the lookup (together.py): the metadata, the state and, when the lookup
                # says the domain runs (an id; -1 is inactive), both address sources too. The sources
                # only read; if the state says it is not running after all (paused) or the metadata names
                # a static address, their answer is dropped. Not asked on a static-address host, whose
                # VMs need no discovery: a Get there makes no call it did not make before.
                sources = None
                if dom.id != -1 and host.config.static_addresses is None:
                    meta, st, sources = await together(
                        self._metadata(host, dom), self._state(host, dom),
                        read_sources(host, dom, mac=naming.mac_address(name), bridge=host.config.bridge,
                                     name=name))
                else:
                    meta, st = await together(self._metadata(host, dom), self._state(host, dom))
                # Checked before anything is acted on (the paused path's pool refresh included).
                if owner_uid is not None:
                    self._check_ours(host, name, meta, action="manage", owner_uid=owner_uid)
                return await self._instance(host, dom, name, meta, state=st, sources=sources)
            except NotFoundError:
                return None  # undefined between our calls: it is gone

    async def start(self, name: str, zone: str) -> None:
        host = self.host(zone)
        async with self._operation(host, name, "start"):
            dom = await self._lookup_domain(host, name)
            if dom is None:
                raise TransientError(f"VM {name!r} does not exist on host {zone!r}")
            await self._ours_running(host, dom, name, action="start")

    async def readdress(self, name: str, zone: str) -> None:
        """Undefine and destroy the VM, define it again from its own inactive XML without its UUID, start it.

        Why a new definition rather than a restart: libvirt's DHCP snooping keys a NIC's learned leases
        by domain UUID and MAC, pins the filter to the first lease it learned and keeps the old lease
        after the guest releases it (a DHCPRELEASE names the address in `ciaddr`, which libvirt does not
        read). A restart under the same UUID restores those leases; a new UUID starts with none, so the
        filter learns the lease the DHCP server gives at boot. Disks, metadata, MAC and settings are the
        domain's own; only the UUID is new (docs/kvm-provider.md, "When the VM's DHCP address changes")."""
        host = self.host(zone)
        async with self._operation(host, name, "readdress"), host.exclusive(f"instance:{name}"):
            log = host.log.with_values(name=name)
            dom = await self._lookup_domain(host, name)
            if dom is None:
                raise TransientError(f"VM {name!r} does not exist on host {zone!r}")
            meta = self._check_ours(host, name, await self._metadata(host, dom), action="readdress")
            xml = await host.call("domain_get_xml_desc",
                                  lambda lv: lv.domain_get_xml_desc(dom, DOMAIN_XML_INACTIVE))
            fresh = without_uuid(xml)
            # Undefined first: a running domain becomes transient, so a readdress interrupted from here on
            # leaves the VM running (transient: readdressed again at a later look) or gone (created
            # again, on a fresh overlay), never shut off under its old UUID, whose plain start restores
            # the stale leases that crashed libvirtd 9.0 on the lab.
            try:
                await host.call("domain_undefine_flags", lambda lv: lv.domain_undefine_flags(
                    dom, DOMAIN_UNDEFINE_NVRAM | DOMAIN_UNDEFINE_MANAGED_SAVE))
            except NotFoundError:
                pass
            except LibvirtError as exc:
                if exc.code != ErrorCode.OPERATION_INVALID or dom.id == -1:
                    raise  # 55 on a running domain: transient already (an interrupted readdress)
            if dom.id != -1:
                try:
                    await host.call("domain_destroy_flags", lambda lv: lv.domain_destroy_flags(dom, 0))
                except LibvirtError as exc:
                    if exc.code not in (ErrorCode.OPERATION_INVALID, ErrorCode.NO_DOMAIN):
                        raise
            # From here until the define, the host has the volumes but no domain: a crash in between
            # leaves what a vanished VM leaves, which the controller creates again (a fresh overlay).
            new = await host.call("domain_define_xml", lambda lv: lv.domain_define_xml(fresh))
            await self._ensure_running(host, new, name, machine_type=meta.machine_type)
            log.info("KVM instance defined afresh and started (readdress)")

    async def delete(self, name: str, zone: str, *, owner_uid: str | None = None) -> None:
        host = self.host(zone)
        self._importer.leave(name)  # an import only this instance waited on is cancelled
        async with self._operation(host, name, "delete"), host.exclusive(f"instance:{name}"):
            log = host.log.with_values(name=name)
            removed: list[str] = []
            dom, meta = await self._lookup_with_metadata(host, name)
            if dom is not None:
                self._check_ours(host, name, meta, action="delete", owner_uid=owner_uid)
                removed.append("domain")
                if dom.id != -1:  # running (the lookup's id is -1 for an inactive domain)
                    try:
                        await host.call("domain_destroy_flags", lambda lv: lv.domain_destroy_flags(dom, 0))
                        log.v(1).info("domain destroyed")
                    except LibvirtError as exc:
                        if exc.code not in (ErrorCode.OPERATION_INVALID, ErrorCode.NO_DOMAIN):
                            raise  # 55: it stopped meanwhile, which is what we want
                with contextlib.suppress(NotFoundError):
                    await host.call("domain_undefine_flags", lambda lv: lv.domain_undefine_flags(dom,
                                    DOMAIN_UNDEFINE_NVRAM | DOMAIN_UNDEFINE_MANAGED_SAVE))
                    log.v(1).info("domain undefined")
            pool = await self._find_pool(host)
            if pool is not None:
                for vol in await self._instance_volumes(host, pool, name):
                    await delete_volume(host, vol)
                    removed.append(vol.name)
                    log.v(1).info("volume deleted", pool=pool.name, volume=vol.name)
            self._addresses[host.name].release(name)
            if removed:
                log.info("KVM instance deleted", removed=removed)
            else:
                log.v(1).info("KVM instance already gone")

    async def list_managed(self, zone: str | None = None) -> list[Instance]:
        hosts = [self.host(zone)] if zone is not None else list(self._hosts.values())
        out: list[Instance] = []
        for host in hosts:
            async with self._operation(host, "", "list"):
                listing = await host.call("connect_list_all_domains",
                                          lambda lv: lv.connect_list_all_domains(
                                              1, CONNECT_LIST_DOMAINS_PERSISTENT))
                known = self._listed_meta.get(host.name, {})
                listed: dict[bytes, Meta | None] = {}
                for dom in listing.domains:
                    if dom.uuid in known:
                        meta = known[dom.uuid]
                    else:
                        try:
                            meta = await self._metadata(host, dom)
                        except NotFoundError:
                            continue  # undefined since the listing
                    listed[dom.uuid] = meta
                    if meta is None or not meta.managed or meta.cluster_id != self.cluster_id:
                        continue
                    out.append(Instance(
                        name=dom.name, zone=host.name,
                        power_state=PowerState.RUNNING if dom.id != -1 else PowerState.STOPPED,
                        ip=None, owner_uid=meta.owner_uid, created_at=meta.created_at,
                        owner_namespace=meta.owner_namespace, owner_name=meta.owner_name))
                self._listed_meta[host.name] = listed  # only what this listing holds: nothing piles up
        return out

    async def list_instance_volumes(self, zone: str) -> VolumeListing:
        """This cluster's overlays and seeds in the zone's pool (naming.py: the tag proves whose), and
        every domain's name there, for orphan-volume GC."""
        host = self.host(zone)
        async with self._operation(host, "", "list volumes"):
            pool = await self._find_pool(host)
            if pool is None:
                return VolumeListing(volumes=(), domains=frozenset())
            listing = await host.call("storage_pool_list_all_volumes",
                                      lambda lv: lv.storage_pool_list_all_volumes(pool, 1, 0))
            doms = await host.call("connect_list_all_domains", lambda lv: lv.connect_list_all_domains(1, 0))
        ours = []
        for vol in listing.vols:
            parsed = naming.parse_instance_volume(vol.name, cluster_id=self.cluster_id)
            if parsed is not None:
                ours.append(InstanceVolume(zone=host.name, name=vol.name, instance=parsed.instance,
                                           owner_namespace=parsed.namespace))
        return VolumeListing(volumes=tuple(ours), domains=frozenset(d.name for d in doms.domains))

    async def delete_orphan_volume(self, volume: InstanceVolume) -> bool:
        """Delete one of this cluster's instance volumes unless a domain of its instance exists now: under
        the instance's lock, so a create of that name in this process is never cut in two."""
        parsed = naming.parse_instance_volume(volume.name, cluster_id=self.cluster_id)
        if parsed is None or parsed.instance != volume.instance:
            raise PermanentError(f"volume {volume.name!r} is not an instance volume of this cluster")
        host = self.host(volume.zone)
        async with self._operation(host, volume.instance, "delete orphan volume"), \
                host.exclusive(f"instance:{volume.instance}"):
            if await self._lookup_domain(host, volume.instance) is not None:
                return False
            pool = await self._find_pool(host)
            vol = await lookup_volume(host, pool, volume.name) if pool is not None else None
            if vol is not None:
                await delete_volume(host, vol)
                host.log.with_values(name=volume.instance).info(
                    "orphan volume deleted", pool=host.config.pool, volume=volume.name)
            return True

    async def evict_unused_images(self, *, grace: float = 600.0) -> list[str]:
        """Delete the bases nothing backs onto (URL, superseded and legacy ones; eviction.py), on every
        reachable host; the GC pass calls this. Returns `host/volume` of each volume deleted; a host
        that fails is skipped."""
        current = {placement.image_source(self.config, k).base_volume for k in self.config.images}
        evicted: list[str] = []
        for host in self._hosts.values():
            try:
                async with self._operation(host, "", "evict unused images"):
                    pool = await self._find_pool(host)
                    if pool is None:
                        continue
                    running = {key[2] for key in self._importer.running_keys() if key[0] == host.name}
                    done = await collect_unused_bases(
                        host, pool, current=current, last_used=self._base_used.setdefault(host.name, {}),
                        busy=running.__contains__, now=time.monotonic(), grace=grace,
                        unfinished=self._base_unfinished.setdefault(host.name, {}))
            except ProviderError as exc:
                host.log.v(1).info("image eviction skipped", error=str(exc))
                continue
            evicted += [f"{host.name}/{v}" for v in done]
        return evicted

    def watch_instances(self, sink: EventSink) -> Watchers:
        """Follow every host's lifecycle events into `sink` (watch.py) until the handle or the provider is
        closed."""
        watchers = Watchers([HostWatcher(h, provider=self.name, sink=sink, log=self._log)
                             for h in self._hosts.values()])
        self._watchers.append(watchers)
        watchers.start()
        return watchers

    def on_host_back(self, listener: Callable[[str, str], None]) -> None:
        """`listener(provider name, zone)` when a host answers again after failed dials (hosts.py)."""
        for host in self._hosts.values():
            host.on_back(lambda zone: listener(self.name, zone))

    async def close(self) -> None:
        for watchers in self._watchers:
            await watchers.close()
        self._watchers.clear()
        await self._importer.close()
        for host in self._hosts.values():
            with contextlib.suppress(Exception):
                await host.close()
        for session in self._http.values():
            await session.close()
        self._http.clear()

    # -- create ----------------------------------------------------------------------------------

    async def _create_new(self, host: Host, request: CreateRequest, resolved: ResolvedPlacement,
                          pool: StoragePool, *, progress: ProgressCallback | None,
                          early: _Early | None = None) -> Instance:
        name = request.name
        mtype = placement.machine_type(self.config, resolved.machine_type)
        source = placement.image_source(self.config, resolved.image)
        # Three independent reads at once (together.py), or their answers read with the domain lookup
        # (`early`, see create); a failure is the one the sequential order would have raised first: the
        # image (InProgress while imported), then pool space, then memory. Both checks come before any
        # volume: a host short of room must not hold (or, on every retry, rewrite) this VM's overlay and
        # its user-data-bearing seed while the Proxy waits.
        if early is None:
            base, available, _ = await together(
                self._base(host, pool, source, request), capacity.refreshed_available(host, pool),
                self._check_memory(host, memory_mib=mtype.memory_mib, machine_type=resolved.machine_type))
        else:
            base, available, _ = await together(
                self._base(host, pool, source, request,
                           cached=early.cached.value if early.cached is not None else None),
                early.available.value(), early.memory.value())
        ip = await self._static_address(host, name)
        try:
            return await self._create_at(host, request, resolved, mtype=mtype, source=source, pool=pool,
                                         base=base, available=available, ip=ip)
        except BaseException:
            # Freed at once: not defined, nothing holds it; defined, the domain's metadata holds it.
            if ip is not None:
                self._addresses[host.name].release(name, ip)
            raise

    async def _create_at(self, host: Host, request: CreateRequest, resolved: ResolvedPlacement, *,
                         mtype: MachineType, source: ImageSource, pool: StoragePool, base: BaseImage,
                         available: int, ip: str | None) -> Instance:
        """The rest of a create, once the image is there, the room checked and the static address (if
        any) chosen."""
        name = request.name
        log = host.log.with_values(name=name)
        cfg = host.config
        iso = seed.build_seed_iso(name=name, user_data=request.user_data, vendor_data=self.config.vendor_data,
                                  network_config=self._network_config(host, name, ip))
        disk_bytes = self.config.disk_size_gb * GIB
        capacity.check_pool_space(host=host.name, pool=pool.name, available=available,
                                  needed=disk_bytes + len(iso), what=f"VM {name!r} (overlay + seed)",
                                  reserve=self._images.limits.reserve)

        owner = {"cluster_id": self.cluster_id, "namespace": request.owner_namespace}
        overlay_name, seed_name = naming.overlay_volume(name, **owner), naming.seed_volume(name, **owner)
        overlay_xml = volume_xml(name=overlay_name, capacity=disk_bytes, fmt="qcow2",
                                 backing_path=base.path, backing_format=base.format)
        # Every document is built before the first volume exists: a value lxml refuses must leave
        # nothing behind (and, being permanent, would otherwise leave it on every retry).
        meta = metadata.InstanceMetadata(
            cluster_id=self.cluster_id, owner_uid=request.owner_uid, created_at=self._now(),
            owner_namespace=request.owner_namespace, owner_name=request.owner_name, zone=resolved.zone,
            machine_type=resolved.machine_type, image=source.label,  # a URL without credentials
            address=ip or "")
        spec = DomainSpec(
            name=name, domain_type=cfg.domain_type, vcpus=mtype.vcpus, memory_mib=mtype.memory_mib,
            cpu=cfg.cpu_config, pool=pool.name, overlay_volume=overlay_name,
            seed_volume=seed_name, seed_bus=cfg.seed_bus, bridge=cfg.bridge,
            mac=naming.mac_address(name), meta=meta, traffic_filter=self.config.traffic_filter, ip=ip)
        try:
            xml = domain_xml(spec)
        except ValueError as exc:  # lxml: a control character in a value (the spec checks should stop it)
            raise PermanentError(f"instance {name!r}: a placement or owner value cannot be written to the "
                                 f"domain XML ({type(exc).__name__})") from None
        async def overlay() -> None:
            await self._create_volume(host, pool, overlay_xml, overlay_name,
                                      available=available)
            log.v(1).info("overlay created", pool=pool.name, volume=overlay_name,
                          backing=base.path, capacity=disk_bytes)

        async def seed_disk() -> None:
            seed_vol = await self._create_volume(
                host, pool, volume_xml(name=seed_name, capacity=len(iso), fmt="raw"),
                seed_name, available=available)
            try:
                await host.upload(seed_vol, iso, length=len(iso))
            except LibvirtError as exc:
                if capacity.is_no_space(exc):
                    raise capacity.no_space(exc, host=host.name, pool=pool.name, available=available,
                                            action="uploading the seed ISO") from None
                raise
            log.v(1).info("seed ISO uploaded", pool=pool.name, volume=seed_name,
                          length=len(iso))

        # The two volumes are independent: made at once. One left by a failure of the other is replaced
        # by the retry (_create_volume) or removed with the instance (delete goes by name).
        await together(overlay(), seed_disk())

        existed = False
        try:
            dom = await host.call("domain_define_xml", lambda lv: lv.domain_define_xml(xml))
        except LibvirtError as exc:
            if exc.code not in (ErrorCode.OPERATION_FAILED, ErrorCode.DOM_EXIST):
                raise
            # Defined by someone else between our lookup and now: only another operator can (our own
            # creates of a name are serialised), so it is used only if this cluster made it.
            dom = await host.call("domain_lookup_by_name", lambda lv: lv.domain_lookup_by_name(name))
            theirs = await self._metadata(host, dom)
            self._check_ours(host, name, theirs, action="reuse", owner_uid=request.owner_uid)
            existed = True
        log.v(1).info("domain defined", mac=spec.mac, memoryMiB=mtype.memory_mib, vcpus=mtype.vcpus)
        dom = await self._start(host, dom, name)
        return Instance(name=name, zone=host.name, power_state=PowerState.RUNNING, ip=ip,
                        owner_uid=meta.owner_uid, created_at=meta.created_at,
                        owner_namespace=meta.owner_namespace, owner_name=meta.owner_name, existed=existed)

    async def _static_address(self, host: Host, name: str) -> str | None:
        """The VM's address on a host with staticAddresses (static_ip.py), None on a DHCP bridge."""
        cfg = host.config.static_addresses
        return None if cfg is None else await self._addresses[host.name].allocate(host, name, cfg)

    def _network_config(self, host: Host, name: str, ip: str | None) -> bytes | None:
        cfg = host.config.static_addresses
        if ip is None or cfg is None:
            return None
        return static_ip.network_config(mac=naming.mac_address(name), address=ip, config=cfg)

    async def _base(self, host: Host, pool: StoragePool, source: placement.ImageSource,
                    request: CreateRequest, *,
                    cached: Callable[[], Awaitable[BaseImage | None]] | None = None) -> BaseImage:
        """The cached base image, or InProgress while a background import fetches it (imports.py), with
        this instance among the import's waiters. `cached`: the cache's answer, when read already."""
        started_by = current_instance.get()  # log lines name the instance whose create started it

        async def fetch(progress: ProgressCallback) -> BaseImage:
            async with self._operation(host, started_by, f"import image {source.label}"):
                return await self._images.ensure(host, pool, source, progress=progress)

        self._base_used.setdefault(host.name, {})[source.base_volume] = time.monotonic()
        return await self._importer.base((host.name, pool.name, source.base_volume),
                                         label=f"{source.label} on host {host.name}",
                                         instance=request.name, owner=request.owner_uid,
                                         cached=cached or (lambda: self._images.cached(host, pool, source)),
                                         fetch=fetch)

    async def _create_volume(self, host: Host, pool: StoragePool, xml: str, vol_name: str, *,
                             available: int) -> StorageVol:
        """Create a per-instance volume; one left by an interrupted earlier attempt is replaced."""
        for attempt in (1, 2):
            try:
                return await host.call("storage_vol_create_xml",
                                       lambda lv: lv.storage_vol_create_xml(pool, xml, 0))
            except LibvirtError as exc:
                if capacity.is_no_space(exc):
                    raise capacity.no_space(exc, host=host.name, pool=pool.name, available=available,
                                            action=f"creating {vol_name}") from None
                if exc.code != ErrorCode.STORAGE_VOL_EXIST or attempt == 2:
                    raise
                stale = await lookup_volume(host, pool, vol_name)
                if stale is not None:
                    await delete_volume(host, stale)
        raise AssertionError("unreachable")

    # -- shared steps ----------------------------------------------------------------------------

    async def _find_pool(self, host: Host) -> StoragePool | None:
        """The pool's handle, kept for the next create (`_pools`)."""
        try:
            pool = await host.call("storage_pool_lookup_by_name",
                                   lambda lv: lv.storage_pool_lookup_by_name(host.config.pool))
        except NotFoundError:
            self._pools.pop(host.name, None)
            return None
        self._pools[host.name] = pool
        return pool

    async def _instance_volumes(self, host: Host, pool: StoragePool, name: str) -> list[StorageVol]:
        """The volumes of instance `name` in the pool: this cluster's tagged ones (any namespace: delete
        is told only the name) and the legacy untagged names (naming.py)."""
        listing = await host.call("storage_pool_list_all_volumes",
                                  lambda lv: lv.storage_pool_list_all_volumes(pool, 1, 0))
        legacy = naming.legacy_volumes(name)
        found = []
        for vol in listing.vols:
            if not vol.name.startswith(name):  # every name of its volumes does: skip the HMAC for the rest
                continue
            parsed = naming.parse_instance_volume(vol.name, cluster_id=self.cluster_id)
            if (parsed is not None and parsed.instance == name) or vol.name in legacy:
                found.append(vol)
        return found

    async def _lookup_domain(self, host: Host, name: str) -> Domain | None:
        try:
            return await host.call("domain_lookup_by_name", lambda lv: lv.domain_lookup_by_name(name))
        except NotFoundError:
            return None

    async def _lookup_with_metadata(self, host: Host, name: str) -> tuple[Domain | None, Meta | None]:
        """The domain of that name and its metadata; (None, None) when there is none.

        A domain undefined between the lookup and the metadata read (NO_DOMAIN on the latter, which goes
        by UUID) is looked up once more: gone means gone, and a new one of the same name is judged on
        its own metadata.
        """
        for attempt in (1, 2):
            dom = await self._lookup_domain(host, name)
            if dom is None:
                return None, None
            try:
                return dom, await self._metadata(host, dom)
            except NotFoundError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _metadata(self, host: Host, dom: Domain) -> metadata.InstanceMetadata | None:
        try:
            xml = await host.call("domain_get_metadata",
                                  lambda lv: lv.domain_get_metadata(
                                      dom, DOMAIN_METADATA_ELEMENT, metadata.NAMESPACE, 0))
        except LibvirtError as exc:
            if exc.code == ErrorCode.NO_DOMAIN_METADATA:
                return None
            raise  # NotFoundError (NO_DOMAIN) included: "no element" and "no domain" differ
        try:
            return metadata.parse(xml)
        except metadata.MetadataError as exc:
            host.log.v(1).info("unreadable metadata element", name=dom.name, error=str(exc))
            return None

    def _check_ours(self, host: Host, name: str, meta: Meta | None, *, action: str,
                    owner_uid: str | None = None) -> Meta:
        """The domain's metadata names this cluster (and, given `owner_uid`, that Proxy) as its owner:
        returned, never None. A domain of no operator's is a PermanentError (it is in the way); one of
        another cluster or another Proxy is NotOwned (status pointing at it is wrong or forged: leave it
        alone)."""
        if meta is None or not meta.managed:
            raise PermanentError(f"a domain named {name!r} exists on host {host.name!r} but was not made by "
                                 f"this operator (no {metadata.NAMESPACE} metadata); refusing to {action} it")
        if meta.cluster_id != self.cluster_id:
            raise NotOwned(f"domain {name!r} on host {host.name!r} belongs to cluster "
                           f"{meta.cluster_id!r}, not {self.cluster_id!r}; refusing to {action} it")
        if owner_uid and meta.owner_uid and meta.owner_uid != owner_uid:
            raise NotOwned(f"domain {name!r} on host {host.name!r} belongs to another Proxy (owner uid "
                           f"{meta.owner_uid}, not {owner_uid}); refusing to {action} it")
        return meta

    async def _ours_running(self, host: Host, dom: Domain, name: str, *, action: str,
                            owner_uid: str | None = None, machine_type: str | None = None,
                            ) -> tuple[Meta, DomainGetStateRet]:
        """Check the looked-up domain is ours, then start or resume it unless it runs (start, and a create
        finding its domain there); its metadata and its state as it is now.

        One round after the lookup (together.py): the metadata, the state and, when the lookup says the
        domain is inactive (id -1: shut off or crashed, so it is to be started), the host's free memory.
        The state and the memory are read on speculation: their errors surface where the sequential code
        raised them (after the ownership check, the memory's after the state's). `machine_type`: the one
        whose memory is checked before a start (a create's request); None: the metadata's."""
        free: Settled[int] | None = None
        if dom.id == -1:
            meta, state, free = await together(self._metadata(host, dom), settled(self._state(host, dom)),
                                               settled(self._free_memory(host)))
        else:
            meta, state = await together(self._metadata(host, dom), settled(self._state(host, dom)))
        ours = self._check_ours(host, name, meta, action=action, owner_uid=owner_uid)
        if machine_type is None:
            machine_type = ours.machine_type
        st = await self._ensure_running(host, dom, name, machine_type=machine_type, state=state, free=free)
        return ours, st

    async def _ensure_running(self, host: Host, dom: Domain, name: str, *, machine_type: str,
                              state: Settled[DomainGetStateRet] | None = None,
                              free: Settled[int] | None = None) -> DomainGetStateRet:
        """Start the domain unless it runs, resume it if paused; returns its state as it is now.

        `state` and `free` (the host's free memory): read already, sent with other reads (_ours_running); an
        error of theirs is raised here, where reading them would have raised it."""
        st = await state.value() if state is not None else await self._state(host, dom)
        if st.state == DomainState.PAUSED:
            return await self._resume(host, dom, name, reason=st.reason)
        if power_state(st.state) == PowerState.RUNNING:
            return st
        mtype = self.config.machine_types.get(machine_type)
        if mtype is not None:
            await self._check_memory(host, memory_mib=mtype.memory_mib, machine_type=machine_type, free=free)
        await self._start(host, dom, name)
        return DomainGetStateRet(state=DomainState.RUNNING, reason=1)

    async def _check_memory(self, host: Host, *, memory_mib: int, machine_type: str,
                            free: Settled[int] | None = None) -> None:
        """QuotaError when the host cannot hold the VM's memory (`free`: libvirt's figure, read already).

        libvirt's free memory is the kernel's MemFree, which leaves out page cache the kernel would give
        back; on a file server it is often far below what is really available. So a shortfall is checked
        again against MemAvailable from /proc/meminfo (over SSH exec, when the host allows it).
        """
        free_bytes = await free.value() if free is not None else await self._free_memory(host)
        if free_bytes >= memory_mib * capacity.MIB:
            return
        available = await capacity.mem_available(host)
        capacity.check_free_memory(host=host.name, free_bytes=max(free_bytes, available or 0),
                                   memory_mib=memory_mib, machine_type=machine_type)

    async def _free_memory(self, host: Host) -> int:
        return await host.call("node_get_free_memory", lambda lv: lv.node_get_free_memory())

    async def _start(self, host: Host, dom: Domain, name: str) -> Domain:
        try:
            dom = await host.call("domain_create_with_flags", lambda lv: lv.domain_create_with_flags(dom, 0))
        except LibvirtError as exc:
            if exc.code != ErrorCode.OPERATION_INVALID:  # 55: already running
                raise
        host.log.with_values(name=name).v(1).info("KVM domain ensured running")
        return dom

    async def _resume(self, host: Host, dom: Domain, name: str, *, reason: int) -> DomainGetStateRet:
        """Resume a paused domain; returns the state it is in now.

        Raises TransientError while a libvirt job holds it paused, and QuotaError for an I/O-error pause
        while the pool still lacks room (resuming would only make the guest's write fail again).
        """
        log = host.log.with_values(name=name)
        why = paused_reason(reason)
        job = PAUSED_BY_JOB.get(reason)
        if job is not None:
            raise TransientError(f"VM {name!r} on host {host.name!r} is paused during {job} "
                                 "(libvirt's own operation); not resuming it meanwhile")
        room = None
        if reason == DOMAIN_PAUSED_IOERROR:
            room = await self._resume_room(host, name)
            if not room.enough:
                raise room.error()
        try:
            await host.call("domain_resume", lambda lv: lv.domain_resume(dom))
        except LibvirtError as exc:
            if exc.code != ErrorCode.OPERATION_INVALID:
                raise
            # 55: no longer paused (resumed or stopped meanwhile); only "running now" is what we wanted.
            st = await host.call("domain_get_state", lambda lv: lv.domain_get_state(dom, 0))
            if power_state(st.state) != PowerState.RUNNING:
                raise TransientError(f"VM {name!r} on host {host.name!r} could not be resumed: "
                                     f"{exc.message}") from None
            return st
        if room is not None:
            log.info("VM paused on an I/O error resumed: the pool has room again", pool=room.pool,
                     available=room.available, needed=room.needed)
        log.v(1).info("KVM domain resumed", pausedReason=why)
        return DomainGetStateRet(state=DomainState.RUNNING, reason=RUNNING_UNPAUSED)

    async def _resume_room(self, host: Host, name: str) -> _Room:
        """Whether the pool has room for a VM paused on an I/O error to run again.

        The VM needs what its thin overlay may still grow by (capacity minus allocation, at least
        RESUME_MIN_ROOM); without its overlay, the full diskSizeGb. The pool is refreshed first, because
        libvirt's pool figures change only on refresh and the space may have been freed outside libvirt.
        """
        room = _Room(host=host.name, pool=host.config.pool, name=name)
        with contextlib.suppress(LibvirtError):  # a figure it cannot read stays unknown: no resume
            pool = await self._find_pool(host)
            if pool is None:
                return room
            try:
                await host.call("storage_pool_refresh", lambda lv: lv.storage_pool_refresh(pool, 0))
            except LibvirtError as exc:  # e.g. an upload in progress: decide on libvirt's last figures
                host.log.with_values(name=name).v(1).info("pool refresh refused", pool=pool.name,
                                                          error=exc.message)
            room.available = (await host.call("storage_pool_get_info",
                                              lambda lv: lv.storage_pool_get_info(pool))).available
            overlay = next((v for v in await self._instance_volumes(host, pool, name)
                            if v.name.endswith(naming.VolumeKind.OVERLAY.value)), None)
            if overlay is None:
                room.needed = self.config.disk_size_gb * GIB
            else:
                info = await host.call("storage_vol_get_info", lambda lv: lv.storage_vol_get_info(overlay))
                room.needed = max(info.capacity - info.allocation, RESUME_MIN_ROOM)
        return room

    async def _state(self, host: Host, dom: Domain) -> DomainGetStateRet:
        return await host.call("domain_get_state", lambda lv: lv.domain_get_state(dom, 0))

    async def _instance(self, host: Host, dom: Domain, name: str, meta: Meta | None, *,
                        state: DomainGetStateRet | None = None, sources: Sources | None = None) -> Instance:
        """The Instance as the host shows it; `sources`: the address sources, when asked already."""
        st = state if state is not None else await self._state(host, dom)
        message = ""
        if st.state == DomainState.PAUSED and st.reason == DOMAIN_PAUSED_IOERROR:
            # Reported as Paused (so the controller calls start, which resumes it) only once there is
            # room again; until then the QuotaError with the figures is the answer.
            room = await self._resume_room(host, name)
            if not room.enough:
                raise room.error()
            message = (f"paused on an I/O error; pool {room.pool!r} has room again "
                       f"({capacity.fmt_bytes(room.available or 0)} available)")
        elif st.state == DomainState.PAUSED:
            message = f"paused ({paused_reason(st.reason)})"
        power = power_state(st.state)
        ip = None
        lost: tuple[str, ...] = ()
        silent = False
        if power == PowerState.RUNNING and meta is not None and meta.address:
            ip = meta.address  # static: the operator gave it, the nwfilter pins it; nothing to discover
        elif power == PowerState.RUNNING:
            mac = naming.mac_address(name)
            if sources is None:
                sources = await read_sources(host, dom, mac=mac, bridge=host.config.bridge, name=name)
            found = conclude(host, sources, mac=mac, bridge=host.config.bridge, name=name)
            ip, lost, silent = found.ip, found.stranded, found.unanswered
            if lost and not await self._filtered(host, dom):
                # No nwfilter pins the old address (trafficFilter: none when it was defined): the host
                # learns the new one from the guest's own traffic; a readdress would be a pointless reboot.
                lost, silent = (), False
        return Instance(
            name=name, zone=host.name, power_state=power, ip=ip, stranded=lost, unanswered=silent,
            owner_uid=meta.owner_uid if meta else "", created_at=meta.created_at if meta else None,
            owner_namespace=meta.owner_namespace if meta else "", owner_name=meta.owner_name if meta else "",
            message=message)

    async def _filtered(self, host: Host, dom: Domain) -> bool:
        """Whether the VM's NIC carries an nwfilter (its live XML; asked only for a stranded VM)."""
        xml = await host.call("domain_get_xml_desc", lambda lv: lv.domain_get_xml_desc(dom, 0))
        return has_traffic_filter(xml)

    @contextlib.asynccontextmanager
    async def _operation(self, host: Host, name: str, action: str) -> AsyncIterator[None]:
        """Label RPC log lines with the instance and sort every failure into the three error kinds."""
        token = current_instance.set(name)
        try:
            yield
        except ProviderError:
            raise
        except LibvirtError as exc:
            if capacity.is_no_space(exc):
                raise capacity.no_space(exc, host=host.name, pool=host.config.pool, available=None,
                                        action=f"{action} {name}") from None
            if "cannot allocate memory" in (exc.message or "").lower():
                raise QuotaError(
                    f"host {host.name!r} is out of memory: {action} {name!r}: {exc.message}") from None
            raise TransientError(f"host {host.name!r}: {action} {name!r} failed: {exc.message} "
                                 f"(libvirt {exc.code_name})") from None
        finally:
            current_instance.reset(token)

    async def _http_session(self, image: ImageSource) -> tuple[aiohttp.ClientSession, Policy]:
        """The session (one per purpose: its resolver enforces that purpose's policy) and the policy."""
        purpose = Purpose.URL_IMAGE if image.direct else Purpose.CONFIGURED_IMAGE
        policy = self._image_policies[purpose]
        session = self._http.get(purpose)
        if session is None or session.closed:
            session = self._http[purpose] = checked_session(policy, timeout=self._http_timeout)
        return session, policy


@dataclass(frozen=True)
class _Early:
    """A create's room reads, sent with its domain lookup (create): each an answer or the error it gave."""

    cached: Settled[BaseImage | None] | None  # None: not read (its import ran): _base reads it if need be
    available: Settled[int]
    memory: Settled[None]


@dataclass
class _Room:
    """The pool figures behind a resume decision for a VM paused on an I/O error (None: unknown)."""

    host: str
    pool: str
    name: str
    available: int | None = None
    needed: int | None = None

    @property
    def enough(self) -> bool:
        return self.available is not None and self.needed is not None and self.available >= self.needed

    def error(self) -> QuotaError:
        return capacity.paused_on_io_error(host=self.host, pool=self.pool, name=self.name,
                                           available=self.available, needed=self.needed)


async def _unread() -> BaseImage | None:
    """Stands for a cache read not made (create: its import runs); never used as an answer."""
    return None


def _checked_name(name: str) -> str:
    try:
        return naming.check_instance_name(name)
    except ValueError as exc:
        raise PermanentError(str(exc)) from None
