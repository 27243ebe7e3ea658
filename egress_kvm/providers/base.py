"""The provider interface the operator drives, and the typed errors it reacts to.

The controller knows nothing of libvirt: it asks a provider to create, get, delete and list VMs by a
deterministic name, and sorts failures into three kinds, because each calls for a different reaction:
PermanentError stops retrying (phase Failed, the message names the offending value), QuotaError retries
on a slow backoff, TransientError on the normal per-key exponential backoff.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable


class ProviderError(Exception):
    """Base of every error a provider raises on purpose."""


class PermanentError(ProviderError):
    """The request can never succeed as written (unknown zone, machineType or image, ...)."""


class NotOwned(PermanentError):
    """The instance at that name belongs to another Proxy (its metadata's owner uid) or another cluster:
    the caller must not act on it. Status can be wrong or forged; the host's metadata is the authority."""


class QuotaError(ProviderError):
    """Out of capacity: pool space, host memory, a VM paused on an I/O error. Retried slowly."""


class TransientError(ProviderError):
    """Anything that may work on retry: host unreachable, connection dropped, libvirt busy."""


class InProgress(ProviderError):
    """Not an error: the provider is preparing something in the background (an image import) and the
    request is answered once that is done. The reconcile says so in status (phase Provisioning, the
    message shows progress) and returns at once; `wake` completes when the work ends, and the controller
    enqueues the Proxy then, with no backoff counted."""

    def __init__(self, message: str, *, wake: asyncio.Future[None] | None = None) -> None:
        super().__init__(message)
        self.wake = wake


class HostUnreachable(TransientError):
    """The host did not answer at all (dial failed, link lost or timed out), as opposed to a host that
    answered with an error: only this one is reported as the HostReachable condition."""


@dataclass(frozen=True)
class Placement:
    zone: str | None = None
    machine_type: str | None = None
    image: str | None = None
    region: str | None = None  # ignored by kvm


@dataclass(frozen=True)
class ResolvedPlacement:
    """Placement after defaults and validation: what the instance name hashes."""

    zone: str
    machine_type: str
    image: str


@dataclass(frozen=True)
class CreateRequest:
    name: str  # deterministic instance name, `proxy-<hash>`
    owner_uid: str
    # Resolved once, by the caller (the controller, through `Provider.resolve`), and carried resolved: the
    # instance name is computed from it, so the create must use exactly it.
    placement: ResolvedPlacement
    user_data: bytes = field(repr=False)  # secret: never logged or shown
    owner_namespace: str = ""
    owner_name: str = ""


class PowerState(enum.StrEnum):
    RUNNING = "Running"
    STOPPED = "Stopped"  # shut off / shut down: needs a start
    PAUSED = "Paused"
    CRASHED = "Crashed"
    PENDING = "Pending"  # anything else (no state, blocked, pmsuspended)


@dataclass(frozen=True)
class Instance:
    name: str
    zone: str
    power_state: PowerState
    ip: str | None
    owner_uid: str
    created_at: datetime | None
    owner_namespace: str = ""
    owner_name: str = ""
    message: str = ""  # e.g. why it is paused
    # The guest reports these addresses and the host maps none of them to the VM (`ip` is then the host's
    # own, or None): after an address change under a host filter that still pins the old address, or a
    # first boot not yet seen by the host (the KVM provider's `addresses.stranded`; plan.py tells them
    # apart). `unanswered`: the host tried every one of them and got no answer. The controller asks a
    # provider that `Readdresses` to repair a stranded instance without an `ip`.
    stranded: tuple[str, ...] = ()
    unanswered: bool = False
    # Set by `create` only: the instance was there already (a create of this name whose status write was
    # lost, or a concurrent one) and was kept, not made: its Event must not say "created".
    existed: bool = False


ProgressCallback = Callable[[str], Awaitable[None]]


@runtime_checkable
class Provider(Protocol):
    name: str

    def zones(self) -> list[str]:
        """Every zone (host) this provider manages."""
        ...

    def resolve(self, placement: Placement) -> ResolvedPlacement:
        """Defaults and validation only, no I/O. Raises PermanentError naming the bad value."""
        ...

    async def create(self, request: CreateRequest, *, progress: ProgressCallback | None = None) -> Instance:
        """Idempotent: returns the existing instance if it is there (`existed` set; one recorded as another
        Proxy's raises NotOwned, as `get` with `owner_uid` does), starting it if it is not running."""
        ...

    def connected(self, zone: str) -> bool:
        """Whether a live session to `zone` is held now, known without I/O (False when unsure: none yet,
        one dropped, an unknown zone). The planner skips the look before a first create only then
        (planner.look_first): a look at a host that does not answer records nothing in status, so a
        Proxy made while its host is down is deleted at once, not after the host answers again."""
        ...

    async def get(self, name: str, zone: str, *, owner_uid: str | None = None) -> Instance | None:
        """None only when the host answered that there is no such VM; unreachable -> TransientError.
        With `owner_uid`, an instance recorded as someone else's raises NotOwned."""
        ...

    async def start(self, name: str, zone: str) -> None:
        """Start (or resume) an instance that exists but is not running."""
        ...

    async def delete(self, name: str, zone: str, *, owner_uid: str | None = None) -> None:
        """Remove the VM and its per-instance volumes; already gone is success. With `owner_uid`, an
        instance recorded as someone else's is left alone: NotOwned."""
        ...

    async def list_managed(self, zone: str | None = None) -> list[Instance]:
        """This cluster's managed instances on one zone, or on all (TransientError if any host fails)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class EvictsImages(Protocol):
    """A provider that caches base images: orphan GC asks it to drop the ones no instance has used for
    `grace` seconds; returns the volumes it removed."""

    async def evict_unused_images(self, *, grace: float) -> list[str]: ...


class InstanceChange(enum.StrEnum):
    """What a host said happened to an instance behind the controller's back (a lifecycle event,
    reduced to what calls for a reconcile: providers/kvm/events.py holds the table)."""

    STOPPED = "Stopped"  # shut off: destroyed, shut down, QEMU died, saved, migrated away
    PAUSED = "Paused"  # suspended by someone, on an I/O error, by a watchdog
    CRASHED = "Crashed"  # the guest panicked
    UNDEFINED = "Undefined"  # its definition is gone
    PM_SUSPENDED = "PMSuspended"  # the guest suspended itself (to RAM or disk)
    OTHER = "Other"  # an event kind this operator does not know: reconcile, to be safe


@dataclass(frozen=True)
class InstanceEvent:
    """A host reports a change to instance `name` on `zone`. Only a hint: the reconcile it triggers reads
    the instance fresh (level-triggered), so a lost or duplicated event costs latency, never correctness."""

    provider: str
    zone: str
    name: str
    change: InstanceChange
    detail: str = ""  # the host's own word for why (e.g. "destroyed"), for logs


@dataclass(frozen=True)
class EventsResumed:
    """Events of `zone` flow again after a gap (a re-dial, a consumer that fell behind): whatever happened
    meanwhile was not reported, so every Proxy on that zone is worth a reconcile."""

    provider: str
    zone: str


class AgentState(enum.StrEnum):
    """The guest agent's channel, as the host reports it."""

    CONNECTED = "Connected"  # the guest's agent is up: the guest booted far enough to report addresses
    DISCONNECTED = "Disconnected"  # it closed its channel (agent stopped, guest shutting down)


@dataclass(frozen=True)
class AgentEvent:
    """The guest agent of instance `name` on `zone` connected or disconnected. Only a hint, like
    InstanceEvent: the controller may look for the instance's address at once instead of on its timer,
    and a guest without an agent, or an event lost, costs only that timer's latency."""

    provider: str
    zone: str
    name: str
    state: AgentState


HostEvent = InstanceEvent | EventsResumed | AgentEvent
EventSink = Callable[[HostEvent], None]


class Closable(Protocol):
    async def close(self) -> None: ...


@runtime_checkable
class WatchesInstances(Protocol):
    """A provider that can push instance changes as they happen (libvirt lifecycle events), so drift is
    repaired at once instead of at the next probe failure or resync. Polling stays the fallback: a
    provider that cannot deliver events for a zone just sends none. The returned handle stops watching;
    the provider's own `close` stops it too."""

    def watch_instances(self, sink: EventSink) -> Closable: ...


@dataclass(frozen=True)
class InstanceVolume:
    """A per-instance volume (overlay, seed) this cluster made, as a pool listing shows it."""

    zone: str
    name: str  # the volume's name in the pool
    instance: str  # the instance it was made for
    owner_namespace: str


@dataclass(frozen=True)
class VolumeListing:
    """One zone's instance volumes of this cluster, and the names of every domain there (anyone's)."""

    volumes: tuple[InstanceVolume, ...]
    domains: frozenset[str]


@runtime_checkable
class Readdresses(Protocol):
    """A provider that can put a stranded instance (`Instance.stranded`) back on the network: the KVM
    provider defines the VM afresh, so the host's nwfilter learns the address DHCP gives it at boot."""

    async def readdress(self, name: str, zone: str) -> None:
        """Restart the instance under a fresh definition (same name, disks and settings). TransientError
        if it is gone or the host fails."""
        ...


@runtime_checkable
class CollectsVolumes(Protocol):
    """A provider whose instances leave volumes a domain listing cannot see (a crash between creating
    them and defining the domain): orphan GC lists them and deletes the ones nothing claims."""

    async def list_instance_volumes(self, zone: str) -> VolumeListing:
        """Only volumes this cluster provably made (another cluster's never appear)."""
        ...

    async def delete_orphan_volume(self, volume: InstanceVolume) -> bool:
        """Delete it unless a domain of its instance exists now (False: spared); gone already is True."""
        ...


@runtime_checkable
class ReportsHostBack(Protocol):
    """A provider that tells when a host answers again after failed dials: `listener(provider, zone)`."""

    def on_host_back(self, listener: Callable[[str, str], None]) -> None: ...

