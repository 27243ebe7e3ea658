"""Building a Proxy's status: instance references, conditions with stable transition times.

Kept apart from the reconciler so its decisions read as phases and reasons, not dict surgery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from egress_kvm.kube.interfaces import Obj

PENDING = "Pending"
PROVISIONING = "Provisioning"
RUNNING = "Running"
READY = "Ready"
FAILED = "Failed"
DELETING = "Deleting"

COND_READY = "Ready"
COND_HEALTHY = "Healthy"
COND_HOST = "HostReachable"


@dataclass(frozen=True)
class Ref:
    """An instance as status records it (`status.instance`, `status.previousInstance`).

    `provider` names the providers-file entry that made it, so a delete goes to that entry and not to
    another provider that happens to have a host of the same name. Status written before it existed
    has none (""); it is not part of equality, so such status is not taken for a different instance."""

    name: str
    zone: str
    provider: str = field(default="", compare=False)

    @classmethod
    def from_status(cls, value: Any) -> Ref | None:
        if isinstance(value, dict) and value.get("name"):
            return cls(name=str(value["name"]), zone=str(value.get("zone") or ""),
                       provider=str(value.get("provider") or ""))
        return None

    def to_dict(self) -> dict[str, str]:
        d = {"name": self.name, "zone": self.zone}
        if self.provider:
            d["provider"] = self.provider
        return d


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def get_condition(status: Obj, type_: str) -> Obj | None:
    for c in status.get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == type_:
            return c
    return None


def set_condition(status: Obj, *, type_: str, value: str, reason: str, message: str,
                  generation: int | None) -> None:
    """Set one condition in `status` (in place); lastTransitionTime moves only when the value flips."""
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == value else None
    new: Obj = {"type": type_, "status": value, "reason": reason, "message": message,
                "lastTransitionTime": since or now_rfc3339()}
    if generation is not None:
        new["observedGeneration"] = generation
    status["conditions"] = [new if c is old else c for c in conditions] if old else [*conditions, new]


def remove_condition(status: Obj, type_: str) -> None:
    if status.get("conditions"):
        status["conditions"] = [c for c in status["conditions"] if c.get("type") != type_]

