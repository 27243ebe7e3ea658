"""Which libvirt lifecycle events call for a reconcile: a pure table over (event, detail).

An event is only a hint that wakes the Proxy's reconcile early; the reconcile reads the domain fresh.
So the table keeps what is drift (a domain stopped, paused, crashed or undefined by someone or something
else) and drops what follows the operator's own creates and starts (DEFINED, STARTED, RESUMED), a
guest's shutdown in progress (its STOPPED follows) and pauses that belong to a libvirt job which ends by
itself (migration, restore, snapshot, post-copy): reconciling on those would cost a Get per create and
race libvirt's own operation. An event kind libvirt adds later is kept (OTHER): a spare reconcile is
cheap, a missed repair is not.

Values are virDomainEventType and its per-type detail enums (libvirt's include/libvirt/libvirt-domain.h).
"""

from __future__ import annotations

from egress_kvm.providers.base import InstanceChange
from rpc.constants import DomainEventType

#: virDomainEventSuspendedDetailType values that a libvirt job of its own holds and ends by itself.
SUSPENDED_BY_JOB = frozenset({1, 4, 5, 7})  # MIGRATED, RESTORED, FROM_SNAPSHOT, POSTCOPY

#: (event) -> the detail names, for log lines and the metric's `event` label.
DETAILS: dict[DomainEventType, tuple[str, ...]] = {
    DomainEventType.DEFINED: ("added", "updated", "renamed", "from snapshot"),
    DomainEventType.UNDEFINED: ("removed", "renamed"),
    DomainEventType.STARTED: ("booted", "migrated", "restored", "from snapshot", "wakeup"),
    DomainEventType.SUSPENDED: ("paused", "migrated", "I/O error", "watchdog", "restored", "from snapshot",
                                "API error", "post-copy", "post-copy failed"),
    DomainEventType.RESUMED: ("unpaused", "migrated", "from snapshot", "post-copy", "post-copy failed"),
    DomainEventType.STOPPED: ("shutdown", "destroyed", "crashed", "migrated", "saved", "failed",
                              "from snapshot"),
    DomainEventType.SHUTDOWN: ("finished", "guest", "host"),
    DomainEventType.PMSUSPENDED: ("memory", "disk"),
    DomainEventType.CRASHED: ("panicked", "crashloaded"),
}


def event_name(event: int) -> str:
    """`stopped`, `suspended`, ...; `event-N` for a kind this code does not know (bounded: libvirt's)."""
    try:
        return DomainEventType(event).name.lower()
    except ValueError:
        return f"event-{event}"


def detail_name(event: int, detail: int) -> str:
    try:
        names = DETAILS[DomainEventType(event)]
    except (ValueError, KeyError):
        return f"detail {detail}"
    return names[detail] if 0 <= detail < len(names) else f"detail {detail}"


def classify(event: int, detail: int) -> InstanceChange | None:
    """The change a lifecycle event reports, or None when it calls for no reconcile."""
    try:
        kind = DomainEventType(event)
    except ValueError:
        return InstanceChange.OTHER
    if kind is DomainEventType.STOPPED:
        return InstanceChange.STOPPED
    if kind is DomainEventType.SUSPENDED:
        return None if detail in SUSPENDED_BY_JOB else InstanceChange.PAUSED
    if kind is DomainEventType.UNDEFINED:
        # RENAMED (1) is the old name of a rename: gone under that name, as far as we are concerned.
        return InstanceChange.UNDEFINED
    if kind is DomainEventType.CRASHED:
        return InstanceChange.CRASHED
    if kind is DomainEventType.PMSUSPENDED:
        return InstanceChange.PM_SUSPENDED
    # DEFINED, STARTED, RESUMED: what our own create/start/resume cause; SHUTDOWN: a STOPPED follows.
    return None
