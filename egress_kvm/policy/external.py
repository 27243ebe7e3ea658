"""External mode under the egress policy: what can be refused from the spec alone, before any probe.

A literal address in a denied range, or credentials aimed at an endpoint no allowlist entry can match,
never works whatever DNS says, so it is a verdict on the spec (phase Failed, the field named). A host
name is decided again on every probe, on the address the probe then connects to (health.py).
"""

from __future__ import annotations

from .egress import explain, precheck
from .policies import EgressPolicies


def external_refusal(policies: EgressPolicies, *, host: str, port: int, auth: bool) -> str | None:
    """The status message refusing spec.external.address (or spec.auth.secretRef for it), or None."""
    shown = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    verdict = precheck(policies.external_probe, host=host, port=port)
    if not verdict.allowed:
        return (f"spec.external.address: "
                f"{explain(verdict, purpose=policies.external_probe.purpose, shown=repr(shown))}")
    if auth:
        verdict = precheck(policies.external_auth, host=host, port=port)
        if not verdict.allowed:
            return (f"spec.auth.secretRef: credentials are sent only to endpoints the admin allows "
                    f"(egress.authEndpoints in the providers file): "
                    f"{explain(verdict, purpose=policies.external_auth.purpose, shown=repr(shown))}")
    return None
