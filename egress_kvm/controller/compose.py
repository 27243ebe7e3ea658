"""A Proxy's status composed from a plan's verdict, as pure functions of what the reconcile observed.

A status is always written whole; only the conditions carry over from the old one (for their transition
times). While a replaced instance still serves, `Serving` says so, and a phase about the instance in
progress describes the replacement only in `message`: ip, endpoint, probe verdict and phase are the
serving one's, so a Ready Proxy stays Ready while it is replaced.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

from egress_kvm.kube.interfaces import Obj

from .status import (
    COND_HEALTHY,
    COND_HOST,
    COND_READY,
    DELETING,
    FAILED,
    PENDING,
    PROVISIONING,
    READY,
    RUNNING,
    Ref,
    remove_condition,
    rfc3339,
    set_condition,
)
from .verdict import Health, ProbeTarget

MAX_MESSAGE = 1024


@dataclass(frozen=True)
class Serving:
    """The replaced instance while it still runs with an IP: status shows it, not its replacement."""

    target: ProbeTarget
    health: Health | None


@dataclass(frozen=True)
class Verdict:
    """What one reconcile concluded, before it becomes a status."""

    phase: str
    message: str
    reason: str
    ip: str | None = None
    endpoint: str | None = None
    instance: Ref | None = None
    previous: Ref | None = None
    health: Health | None = None
    probing: bool = False  # the endpoint is being probed: status carries the verdict
    host_ok: tuple[bool, str] | None = None  # HostReachable: (answered?, message); None leaves it


def compose(old: Obj, v: Verdict, *, generation: int, serving: Serving | None = None) -> Obj:
    if serving is not None and v.previous is not None and v.phase in (PROVISIONING, RUNNING, READY):
        v = _serving_verdict(v, serving)
    status: Obj = {"phase": v.phase, "message": v.message, "observedGeneration": generation}
    if old.get("conditions"):
        status["conditions"] = [dict(c) for c in old["conditions"]]
    if v.ip:
        status["ip"] = v.ip
    if v.endpoint:
        status["endpoint"] = v.endpoint
    if v.instance is not None:
        status["instance"] = v.instance.to_dict()
    if v.previous is not None:
        status["previousInstance"] = v.previous.to_dict()
    status = probe_fields(status, v.health, probing=v.probing)
    if v.host_ok is not None:
        ok, message = v.host_ok
        set_condition(status, type_=COND_HOST, value="True" if ok else "False",
                      reason="Reachable" if ok else "Unreachable", message=message, generation=generation)
    elif v.phase in (FAILED, PENDING):
        remove_condition(status, COND_HOST)  # says nothing about a host we are not talking to
    ready_condition(status, phase=v.phase, reason=v.reason, message=v.message, generation=generation)
    return status


def _serving_verdict(v: Verdict, serving: Serving) -> Verdict:
    health = serving.health
    phase = READY if health is not None and health.healthy else RUNNING
    verdict = "healthy" if phase == READY else (
        f"unhealthy: {health.message}" if health is not None and health.healthy is False
        else "waiting for health probes")
    assert v.previous is not None
    message = (f"serving from {v.previous.name} ({verdict}) while replacing it with "
               f"{v.instance.name if v.instance else '?'}: {v.message}")
    return Verdict(phase=phase, message=message, reason=reason_for(phase, health), ip=serving.target.host,
                   endpoint=serving.target.endpoint, instance=v.instance, previous=v.previous,
                   health=health, probing=True, host_ok=v.host_ok)


def held(old: Obj, *, message: str, reason: str, generation: int, health: Health | None,
         unreachable: str | None = None) -> Obj:
    """The current status with a new message: nothing was observed, so the phase stays, except that
    Running/Ready still follow the probes (which reach the VM directly), so Ready stays == Healthy.
    `unreachable`: the host did not answer, with this condition message."""
    status = dict(old)
    phase = status.get("phase") or PROVISIONING
    if phase in (RUNNING, READY) and health is not None:
        phase = READY if health.healthy else RUNNING
        status = probe_fields(status, health, probing=True)
    status["phase"] = phase
    status["message"] = message
    status["observedGeneration"] = generation
    ready_condition(status, phase=phase, reason=reason, message=message, generation=generation)
    if unreachable is not None:
        set_condition(status, type_=COND_HOST, value="False", reason="Unreachable", message=unreachable,
                      generation=generation)
    return status


def worth_writing(old: Obj, new: Obj, *, now: datetime, refresh: float) -> bool:
    """Whether `new` is worth a status write over `old`. A change of anything but `lastProbeTime` is; a
    newer `lastProbeTime` alone only once the stored one is `refresh` seconds old (the resync period): a
    settled Proxy's routine passes (a resync, a probe refresh) would otherwise each write the time of
    the latest probe, two writes per Proxy per period that tell nobody anything new. `refresh`
    math.inf: a newer `lastProbeTime` alone is never written."""
    if new == old:
        return False
    if {k: v for k, v in new.items() if k != "lastProbeTime"} != \
            {k: v for k, v in old.items() if k != "lastProbeTime"}:
        return True
    stored, fresh = old.get("lastProbeTime"), new.get("lastProbeTime")
    if not isinstance(stored, str) or not isinstance(fresh, str):
        return True  # probing started or stopped
    try:
        at = datetime.strptime(stored, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return True
    return (now - at).total_seconds() >= refresh


def probe_fields(status: Obj, health: Health | None, *, probing: bool) -> Obj:
    status = dict(status)
    generation = status.get("observedGeneration")
    status["healthy"] = bool(probing and health is not None and health.healthy)
    if probing and health is not None and health.last_probe is not None:
        status["lastProbeTime"] = rfc3339(health.last_probe)
    else:
        status.pop("lastProbeTime", None)
    if not probing or health is None or health.healthy is None:
        # No verdict, no condition: the HEALTHY column (this condition's status) stays blank until
        # the probes have one, as `kubectl get px -w` in the spec shows. Progress is in `message`.
        remove_condition(status, COND_HEALTHY)
    elif health.healthy:
        set_condition(status, type_=COND_HEALTHY, value="True", reason="ProbeSucceeded",
                      message=health.message, generation=generation)
    else:
        set_condition(status, type_=COND_HEALTHY, value="False", reason="ProbeFailed",
                      message=health.message, generation=generation)
    return status


def ready_condition(status: Obj, *, phase: str, reason: str, message: str, generation: int) -> None:
    if phase == READY:
        set_condition(status, type_=COND_READY, value="True", reason="Ready",
                      message=f"proxy is healthy at {status.get('endpoint')}", generation=generation)
    else:
        set_condition(status, type_=COND_READY, value="False", reason=reason, message=message,
                      generation=generation)


def external_verdict(health: Health | None, *, host: str, target: ProbeTarget) -> Verdict:
    """An External Proxy: only the probes decide (Ready when healthy, else Running)."""
    if health is not None and health.healthy:
        phase, message = READY, f"healthy: {health.message}"
    elif health is not None and health.healthy is False:
        phase, message = RUNNING, f"unhealthy: {health.message}"
    else:
        phase, message = RUNNING, "waiting for health probes"
    return Verdict(phase=phase, message=message, reason=reason_for(phase, health), ip=host,
                   endpoint=target.endpoint, health=health, probing=True)


def cap_messages(status: Obj) -> None:
    """Provider errors can be long (a libvirt XML error, a stack of causes): keep status readable."""
    def cap(text: str) -> str:
        return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."

    if isinstance(status.get("message"), str):
        status["message"] = cap(status["message"])
    for c in status.get("conditions") or []:
        if isinstance(c.get("message"), str):
            c["message"] = cap(c["message"])


def providers_tag(providers_hash: str) -> str:
    """A short tag of the providers file for status: enough to tell files apart, and not the file's own
    digest (status is readable by every Proxy user; the file is the operator's)."""
    return hashlib.sha256(f"egress-kvm providers {providers_hash}".encode()).hexdigest()[:16]


def reason_for(phase: str, health: Health | None) -> str:
    if phase == RUNNING:
        if health is not None and health.healthy is False:
            return "Unhealthy"
        return "WaitingForProbes"
    return {PROVISIONING: "Provisioning", READY: "Ready", PENDING: "Waiting", FAILED: "Failed",
            DELETING: "Deleting"}.get(phase, phase)
