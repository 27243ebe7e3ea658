"""The phase table for a Managed Proxy's instance, as one pure function.

`plan_instance` maps what was observed (the instance as the provider reports it, the probe verdict) to
the phase, the message and the one action to take. It does no I/O, so the table below is the whole
story and the tests can walk every row; the reconciler gathers the inputs and carries the plan out.

| observed instance                     | action            | phase                         |
|---------------------------------------|-------------------|-------------------------------|
| none, never had an IP                 | create            | Provisioning                  |
| none, but it had an IP (vanished)     | create (Warning)  | Provisioning                  |
| shut off / crashed / paused           | start (Warning)   | Running if IP known, else Provisioning |
| starting (no definite state)          | poll              | Provisioning                  |
| running, no IP yet                    | poll              | Provisioning                  |
| running, IP, probes not conclusive    | probe             | Running                       |
| running, IP, unhealthy                | probe             | Running                       |
| running, IP, healthy                  | probe; delete the replaced instance, if any | Ready |

Transition Events (`transition_events`) come from comparing the old and the new phase, so each is
recorded once per transition, not once per reconcile.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from egress_kvm.providers.base import Instance, PowerState

from .health import Health
from .status import FAILED, PENDING, PROVISIONING, READY, RUNNING, Ref

NORMAL = "Normal"
WARNING = "Warning"


class Action(enum.StrEnum):
    NONE = "none"
    CREATE = "create"
    START = "start"


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


NEEDS_START = (PowerState.STOPPED, PowerState.CRASHED, PowerState.PAUSED)


def plan_instance(*, target: Ref, instance: Instance | None, had_ip: bool, health: Health | None,
                  success_threshold: int, has_previous: bool) -> Plan:
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
    if not instance.ip:
        return Plan(PROVISIONING, f"waiting for the IP address of instance {name}", poll=True)

    if health is not None and health.healthy:
        return Plan(READY, f"healthy: {health.message}", ip=instance.ip, probe=True,
                    delete_previous=has_previous)
    if health is not None and health.healthy is False:
        return Plan(RUNNING, f"unhealthy: {health.message}", ip=instance.ip, probe=True)
    progress = ""
    if health is not None and health.last_probe is not None:
        progress = f" ({health.successes}/{success_threshold} successes; last: {health.message})"
    return Plan(RUNNING, f"waiting for health probes{progress}", ip=instance.ip, probe=True)


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
