"""Which Secrets a Proxy may use: only those an admin (or the Secret's owner) opted in with a label.

The operator can read every Secret in the namespaces it watches (Secret names are the Proxy author's
choice, and RBAC cannot grant `get` by label), so without a gate anyone allowed to create a Proxy could
have any Secret of the namespace placed on a VM seed (`cloudInit.secretRef`) or sent as credentials
(`auth.secretRef`). The label is that gate: a Secret without it is treated as if it were not there for
Proxies, with a status that says which label is missing. See docs/security.md.
"""

from __future__ import annotations

from egress_kvm.kube.interfaces import KubeApi

USABLE_LABEL = "egressproxies.io/usable-by-proxies"
USABLE_VALUE = "true"
USABLE = {USABLE_LABEL: USABLE_VALUE}  # for manifests and tests


class SecretNotUsable(Exception):
    """The Secret has not opted in; the message names the Secret, the label and the field."""


async def read_usable_secret(kube: KubeApi, *, namespace: str, name: str, field: str
                             ) -> dict[str, bytes] | None:
    """The Secret's data if it carries the opt-in label; None if it does not exist; SecretNotUsable if it
    exists without the label (its data is dropped unread by anything else)."""
    found = await kube.read_secret_labels(namespace, name)
    if found is None:
        return None
    labels, data = found
    if labels.get(USABLE_LABEL) != USABLE_VALUE:
        raise SecretNotUsable(f"Secret {namespace}/{name} is not usable by Proxies: it lacks the label "
                              f"{USABLE_LABEL}={USABLE_VALUE!r} ({field}; see docs/security.md)")
    return data
