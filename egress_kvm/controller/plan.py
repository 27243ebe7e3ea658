"""A Managed Proxy's decisions as pure functions: the instance's phase table, the replacement rules and
the retry schedules of guests that never settle. planner.py strings them into a pass's actions.

## The instance

`plan_instance` maps what was observed (the instance as the provider reports it, the probe verdict) to
the phase, the message and the one action to take. It does no I/O, so the table below is the whole
story and the tests can walk every row; planner.py turns the plan into actions.

| observed instance                     | action            | phase                         |
|---------------------------------------|-------------------|-------------------------------|
| none, never had an IP                 | create            | Provisioning                  |
| none, but it had an IP (vanished)     | create (Warning)  | Provisioning                  |
| shut off / crashed / paused           | start (Warning)   | Running if IP known, else Provisioning |
| starting (no definite state)          | poll              | Provisioning                  |
| running, no IP yet                    | poll              | Provisioning                  |
| running, no IP, stranded (1), `STRANDED_LOOKS` looks in a row | readdress (Warning) | Provisioning |
| running, IP, probes not conclusive    | probe             | Running                       |
| running, IP, unhealthy                | probe (poll (2))  | Running                       |
| running, IP, healthy                  | probe; delete the replaced instance, if any | Ready |

(1) `Instance.stranded`: the guest reports addresses and the host maps none (nor any other) to the VM,
and this is not a first boot the host has not seen yet: the instance had an address (status.ip) and the
guest no longer claims it, or the host tried every reported address without an answer
(`Instance.unanswered`), or the previous look was stranded already. That is a DHCP address change under a
host filter that still allows only the old address. A few looks in a row (not one: a guest just resumed
from a pause answers its host again within a second) before the provider defines it afresh (the KVM
provider's `readdress`), which restarts it.

(2) Polled (every 5 s) when not healthy while the guest reports other addresses than the one the host
maps (`Instance.stranded` beside an `ip`): the old address of a guest that moved answers no probe, and
only a look tells when the host gives up on it too (no verdict change, no event says so).

## Replacement (create-before-delete)

A change of the resolved provisioning inputs changes the instance name (naming.py), and the new name is
a replacement of the instance status names (`status.instance`). `plan_retire` decides what happens to
the instances it leaves behind, `quota_fallback` what happens when the new one does not fit:

| previousInstance | the current instance             | delete now | new previousInstance          |
|------------------|----------------------------------|------------|-------------------------------|
| none             | runs with an IP (or cannot tell) | nothing    | current (it serves)           |
| none             | does not serve                   | current    | none                          |
| set (1)          | (not looked at)                  | current    | previous; none if it is the target |

(1) A replacement was under way and the current instance never became Ready (it would have retired
the previous one): it goes, the one that served stays.

| no capacity for the replacement (QuotaError)  | what happens                                       |
|-----------------------------------------------|----------------------------------------------------|
| previous on the target's host                 | delete previous first, then create (no overlap)    |
| previous on another host, or none             | keep it serving; retry on the quota backoff        |

While the previous instance serves, the replacement is probed under its own `ProbeKey`; once it is Ready
the previous one is deleted and the replacement's probes, verdict and all, take over the Proxy's key.

## Events

Transition Events (`transition_events`) come from comparing the old and the new phase, so each is
recorded once per transition, not once per reconcile.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from egress_kvm.backoff import Backoff
from egress_kvm.providers.base import Instance, PowerState

from .status import FAILED, PENDING, PROVISIONING, READY, RUNNING, Ref
from .verdict import Health

NORMAL = "Normal"
WARNING = "Warning"


class Action(enum.StrEnum):
    NONE = "none"
    CREATE = "create"
    START = "start"
    READDRESS = "readdress"


#: Looks in a row at a stranded instance before it is readdressed: with the poll's 5 s, about 10 s of the
#: host getting no answer from any address the guest reports.
STRANDED_LOOKS = 3
SHOWN_CLAIMS = 3  # a stranded guest's addresses named in its message and Event


@dataclass(frozen=True)
class Event:
    type_: str
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    phase: str
    message: str
    action: Action = Action.NONE
    ip: str | None = None
    probe: bool = False  # keep probing the endpoint
    delete_previous: bool = False  # the replacement is Ready: the instance it replaced can go
    poll: bool = False  # look again soon: something is in progress that nothing will tell us about
    events: tuple[Event, ...] = ()  # recorded once the action succeeded
    stranded: bool = False  # this look counts toward STRANDED_LOOKS


NEEDS_START = (PowerState.STOPPED, PowerState.CRASHED, PowerState.PAUSED)


def create_events(events: tuple[Event, ...], *, target: Ref, existed: bool) -> tuple[Event, ...]:
    """The Events a create that succeeded records: the plan's ("Created", "Recreated"), unless the provider
    found the instance there already and kept it (Instance.existed: a create planned without a look,
    planner.look_first, after a status write naming it was lost), which it did not create."""
    if not existed:
        return events
    return (Event(NORMAL, "Found", f"instance {target.name} already existed on {target.zone} for this "
                                   "Proxy; kept it"),)


def plan_instance(*, target: Ref, instance: Instance | None, had_ip: bool, health: Health | None,
                  success_threshold: int, has_previous: bool, stranded_looks: int = 0,
                  last_ip: str = "") -> Plan:
    """`stranded_looks`: the looks in a row before this one that found the instance stranded; `last_ip`:
    status.ip (when `had_ip`)."""
    name = target.name
    if instance is None:
        if had_ip:
            return Plan(PROVISIONING, f"instance {name} vanished from {target.zone}; recreating it",
                        Action.CREATE,
                        events=(Event(WARNING, "Recreated", f"instance {name} vanished from {target.zone}; "
                                                            "recreated it"),))
        return Plan(PROVISIONING, f"creating instance {name} on {target.zone}", Action.CREATE,
                    events=(Event(NORMAL, "Created", f"created instance {name} on {target.zone}"),))

    state = instance.power_state
    if state in NEEDS_START:
        why = f"instance {name} was {state.value}" + (f" ({instance.message})" if instance.message else "")
        return Plan(RUNNING if instance.ip else PROVISIONING, f"{why}; starting it", Action.START,
                    ip=instance.ip, poll=True, events=(Event(WARNING, "Restarted", f"{why}; started it"),))
    if state is not PowerState.RUNNING:
        return Plan(PROVISIONING, f"instance {name} is starting (state {state.value})", ip=instance.ip,
                    poll=True)
    # Had an address and the guest now claims others: it moved. A guest still claiming status.ip that the
    # host merely maps no more (its entry aged out of a busy table) did not: waiting, not a restart.
    moved = had_ip and last_ip not in instance.stranded
    if not instance.ip and instance.stranded and (moved or instance.unanswered or stranded_looks > 0):
        # The guest's word in status and an Event: named, but a few only (a guest may claim hundreds).
        shown = instance.stranded[:SHOWN_CLAIMS]
        more = len(instance.stranded) - len(shown)
        claims = ", ".join(shown) + (f" and {more} more" if more else "")
        why = (f"instance {name} reports address {claims}, which its host cannot reach (the host's "
               "filter still allows only its earlier address)")
        if stranded_looks + 1 >= STRANDED_LOOKS:
            return Plan(PROVISIONING, f"{why}; defining it afresh so the filter learns its DHCP lease",
                        Action.READDRESS, poll=True, stranded=True,
                        events=(Event(WARNING, "Readdressed", f"{why}; defined it afresh and started it"),))
        return Plan(PROVISIONING, f"{why}; readdressing it if that lasts", poll=True, stranded=True)
    if not instance.ip:
        return Plan(PROVISIONING, f"waiting for the IP address of instance {name}", poll=True)

    if health is not None and health.healthy:
        return Plan(READY, f"healthy: {health.message}", ip=instance.ip, probe=True,
                    delete_previous=has_previous)
    # The guest reports other addresses than the host's: poll, since the host's next failed attempt at
    # this one (no verdict change, no event) is what makes the instance stranded.
    disputed = bool(instance.stranded)
    if health is not None and health.healthy is False:
        return Plan(RUNNING, f"unhealthy: {health.message}", ip=instance.ip, probe=True, poll=disputed)
    progress = ""
    if health is not None and health.last_probe is not None:
        progress = f" ({health.successes}/{success_threshold} successes; last: {health.message})"
    return Plan(RUNNING, f"waiting for health probes{progress}", ip=instance.ip, probe=True, poll=disputed)


def transition_events(*, old_phase: str | None, new_phase: str, message: str, endpoint: str | None,
                      ip: str | None) -> list[Event]:
    if old_phase == new_phase:
        return []
    if new_phase == READY:
        return [Event(NORMAL, "Ready", f"proxy is Ready at {endpoint}")]
    if new_phase == RUNNING and old_phase == READY:
        return [Event(WARNING, "Unhealthy", message)]
    if new_phase == RUNNING and ip:
        return [Event(NORMAL, "Running", f"instance has IP {ip}; probing {endpoint}")]
    if new_phase == FAILED:
        return [Event(WARNING, "Failed", message)]
    if new_phase == PENDING:
        return [Event(WARNING, "Pending", message)]
    return []


@dataclass(frozen=True)
class Retire:
    """What a replacement does with the instances it leaves behind (the table above)."""

    delete: tuple[Ref, ...]
    previous: Ref | None  # the new status.previousInstance: the one that keeps serving


def plan_retire(*, current: Ref, previous: Ref | None, target: Ref, current_serves: bool) -> Retire:
    """`current_serves`: it runs with an IP, or the provider could not tell (kept, so it is deleted once
    the replacement is Ready rather than leaked). Only consulted when there is no previous instance."""
    if previous is not None:
        # A replacement is already under way and `current` never became Ready (it would have retired
        # `previous`): drop it, keep the one that served. Back to `previous` itself: nothing to keep.
        return Retire(delete=(current,), previous=None if previous == target else previous)
    if current_serves:
        return Retire(delete=(), previous=current)
    return Retire(delete=(current,), previous=None)  # it never worked: nothing to keep


def quota_fallback(*, previous: Ref | None, target: Ref) -> bool:
    """No capacity for `target`: delete `previous` first? Only on the same host: deleting a VM on another
    host frees nothing here, so there it keeps serving and the create is retried on the quota backoff."""
    return previous is not None and previous.zone == target.zone


def restart_announced(starts: int) -> bool:
    """Record the Restarted Event on the 1st, 2nd, 4th, 8th... start in a row: a crash loop is told,
    not spammed."""
    return starts > 0 and starts & (starts - 1) == 0


def restart_delay(starts: int, *, poll: float, cap: float) -> float:
    """When to look again after the n-th start in a row: a guest that keeps stopping costs less and less."""
    return min(cap, Backoff(poll, max(cap, poll)).delay(starts))


def ip_wait_delay(looks: int, *, poll: float, polls: int, cap: float) -> float:
    """When to look again at a guest running without an IP for the n-th time in a row: every `poll` for
    `polls` looks, then on a doubling delay up to `cap` (a network that never comes up must not cost a
    provider call every poll)."""
    extra = looks - polls
    if extra <= 0:
        return poll
    return min(cap, Backoff(2 * poll, max(cap, 2 * poll)).delay(min(extra, 20)))
