"""What a reconcile ends in when the provider or the spec said no: the error kinds as one table.

| error                              | deleting? | outcome                                      | retry     |
|------------------------------------|-----------|----------------------------------------------|-----------|
| SpecError / PermanentError         | no        | Failed (until the spec or providers change)  | none      |
|                                    |           | with a reason naming what cannot work        |           |
| NotOwned (a PermanentError)        | no        | Failed (NotOwner), with a Warning            | none      |
| SpecError / PermanentError         | yes       | DeleteBlocked Warning, phase kept            | quota     |
| QuotaError                         | either    | QuotaExceeded Warning, phase kept            | quota     |
| HostUnreachable (a TransientError) | either    | HostReachable=False, phase kept              | transient |
| other TransientError               | either    | "retrying", phase kept                       | transient |

InProgress (a background image import) is not an error and not in this table: the reconciler answers it
with Provisioning and the import's progress, and the key is re-queued when the import ends (`wake_on`).

A host that answered with an error is reachable: only HostUnreachable touches the HostReachable
condition, and nothing here ever recreates an instance.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from egress_kvm.kube.interfaces import FINALIZER
from egress_kvm.providers.base import HostUnreachable, NotOwned, PermanentError, QuotaError, TransientError

from .plan import WARNING, Event
from .proxyspec import SpecError


class Retry(enum.Enum):
    """Which per-key backoff the manager re-queues a key with."""

    TRANSIENT = "transient"  # the normal exponential one
    QUOTA = "quota"  # the slow one: capacity rarely frees up in seconds


@dataclass(frozen=True)
class Result:
    requeue_after: float | None = None
    retry: Retry | None = None
    wake_on: asyncio.Future[None] | None = None  # re-queue when this completes (a background import)


@dataclass(frozen=True)
class Fail:
    """The Proxy cannot work as written: phase Failed, not retried until its inputs change."""

    message: str
    reason: str  # the Ready condition's: what `kubectl get px` shows as REASON
    event: Event | None = None


# A Failed Proxy's Ready reason names what cannot work, so the REASON column of a plain `kubectl get px`
# says why (the message, in -o wide, says how). The first matching field prefix of the message wins.
FAILED_REASONS = (
    ("spec.provider", "UnknownProvider"),
    ("spec.placement", "InvalidPlacement"),
    ("spec.cloudInit", "InvalidCloudInit"),
    ("spec.external", "InvalidExternalAddress"),
    ("spec.healthCheck", "InvalidHealthCheck"),
    ("spec", "InvalidSpec"),
)


def failed_reason(message: str, *, spec_error: bool) -> str:
    """`InvalidPlacement`, `UnknownProvider`, ... for an error in the spec (its message starts with the
    field); `ProviderRejected` for a provider's permanent error about an acceptable spec."""
    if spec_error:
        for prefix, reason in FAILED_REASONS:
            if message == prefix or message.startswith((f"{prefix}:", f"{prefix}.")):
                return reason
        return "InvalidSpec"
    return "ProviderRejected"


@dataclass(frozen=True)
class Trouble:
    """A retryable error: the phase stays, status says what went wrong, the key backs off."""

    reason: str
    message: str
    retry: Retry
    event: Event | None = None
    unreachable: bool = False  # the host did not answer: HostReachable=False


def outcome_for(error: Exception, *, deleting: bool) -> Fail | Trouble | None:
    """The table above; None for an error that is not the provider's or the spec's (re-raised)."""
    if isinstance(error, SpecError | PermanentError):
        if not deleting:
            if isinstance(error, NotOwned):
                return Fail(str(error), "NotOwner", Event(WARNING, "NotOwner", str(error)))
            return Fail(str(error), failed_reason(str(error), spec_error=isinstance(error, SpecError)))
        # Removing the finalizer would leak the VM, so keep trying, slowly, and say so where
        # `kubectl describe` shows it: only a person can clear this (see the message).
        message = (f"deletion blocked: {error}; retrying. If the instance was cleaned up by hand, "
                   f"remove the finalizer {FINALIZER} to let the Proxy go")
        return Trouble("DeleteBlocked", message, Retry.QUOTA, Event(WARNING, "DeleteBlocked", message))
    if isinstance(error, QuotaError):
        return Trouble("QuotaExceeded", f"out of capacity: {error}", Retry.QUOTA,
                       Event(WARNING, "QuotaExceeded", str(error)))
    if isinstance(error, HostUnreachable):
        return Trouble("HostUnreachable", f"retrying: {error}", Retry.TRANSIENT, unreachable=True)
    if isinstance(error, TransientError):
        return Trouble("TransientError", f"retrying: {error}", Retry.TRANSIENT)
    return None
