"""Probe verdicts as values: what is probed (`ProbeTarget`), under which key (`ProbeKey`), and the verdict
so far (`Health`, folded by `next_health`). Pure: the planner and status composition read these without
importing the prober's HTTP client.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from egress_kvm.kube.interfaces import Key, Obj

from .proxyspec import HealthCheck
from .status import COND_HEALTHY, READY, get_condition


@dataclass(frozen=True)
class ProbeKey:
    """Whose probes: a Proxy's serving endpoint, or the instance being provisioned to replace it (probed
    under its own key while the replaced one still serves, until it is Ready and takes over)."""

    proxy: Key
    replacement: bool = False

    def __str__(self) -> str:
        name = f"{self.proxy[0]}/{self.proxy[1]}"
        return f"{name} (replacement)" if self.replacement else name


@dataclass(frozen=True)
class ProbeTarget:
    host: str
    port: int
    check: HealthCheck
    namespace: str = ""
    auth_secret: str | None = None
    external: bool = False  # a tenant-named endpoint: connected to only under the egress policy

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class Health:
    healthy: bool | None = None  # None until a threshold has been reached
    message: str = "not probed yet"
    last_probe: datetime | None = None
    successes: int = 0  # consecutive
    failures: int = 0  # consecutive


def next_health(h: Health, *, ok: bool, message: str, at: datetime, check: HealthCheck) -> Health:
    """Fold one probe result into the verdict (pure, so the thresholds are testable alone)."""
    if ok:
        successes, failures = h.successes + 1, 0
        healthy = True if successes >= check.success_threshold else h.healthy
    else:
        successes, failures = 0, h.failures + 1
        healthy = False if failures >= check.failure_threshold else h.healthy
    return Health(healthy=healthy, message=message, last_probe=at, successes=successes, failures=failures)


def start_seed(status: Obj, target: ProbeTarget, *, own: bool, probed: bool) -> Health | None:
    """The verdict a new probe of `target` starts from: a probe that starts afresh for the Proxy's own key
    (this process has not been probing it: a restart, a new leader) takes the one status recorded for
    the same endpoint; any other starts unknown."""
    return stored_verdict(status, target) if own and not probed else None


def stored_verdict(status: Obj, target: ProbeTarget) -> Health | None:
    """The healthy verdict status records for `target`'s endpoint, as probe state (None if there is none:
    not Ready, another endpoint). The message and probe time are the recorded ones, so seeding alone
    changes nothing in status."""
    if status.get("phase") != READY or status.get("healthy") is not True:
        return None
    if status.get("endpoint") != target.endpoint:
        return None
    cond = get_condition(status, COND_HEALTHY) or {}
    last = None
    if isinstance(status.get("lastProbeTime"), str):
        try:
            last = datetime.strptime(status["lastProbeTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            last = None
    return Health(healthy=True, message=str(cond.get("message") or "healthy"), last_probe=last,
                  successes=target.check.success_threshold)
