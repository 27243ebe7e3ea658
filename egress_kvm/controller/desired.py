"""What instance a Managed Proxy should have right now (provider, resolved placement, user-data, name),
and which provider an instance status names belongs to.

Shared by the reconciler (which creates it) and orphan GC (which must spare it even before the status
names it), so both always agree on the name. Sorting failures here fixes the phase they lead to:
`SpecError` -> Failed (never works as written), `Waiting` -> Pending (something outside is missing and
may appear, e.g. the cloud-init Secret), anything raised by the Kubernetes client -> retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from egress_kvm.kube.interfaces import KubeApi, Obj
from egress_kvm.policy.secrets import SecretNotUsable, read_usable_secret
from egress_kvm.providers.base import PermanentError, Provider, ResolvedPlacement

from .naming import instance_name, legacy_user_data_digest, user_data_digest
from .proxyspec import ProxySpec, SpecError
from .status import Ref


class Waiting(Exception):
    """Waiting on something outside the Proxy (phase Pending); the message says what."""


@dataclass(frozen=True)
class Desired:
    provider: Provider
    resolved: ResolvedPlacement
    name: str
    # None: not loaded. A routine pass from the informer's cache (no inline user-data there, kube/trim.py)
    # reuses the name a fresh pass computed (`DesiredKey`); it never creates, so it never needs them.
    user_data: bytes | None = field(repr=False)

    def without_user_data(self) -> Desired:
        return Desired(provider=self.provider, resolved=self.resolved, name=self.name, user_data=None)


@dataclass(frozen=True)
class DesiredKey:
    """Everything a Proxy with inline user-data (or none) has its desired instance computed from: the
    object (uid), its spec (generation: any spec edit bumps it), the providers file, and the instance
    status names (a legacy name is kept, see desired_instance). Equal keys, equal Desired."""

    uid: str
    generation: int
    providers_hash: str
    instance: str | None


def provider_for(spec: ProxySpec, providers: Mapping[str, Provider]) -> Provider:
    provider = providers.get(spec.provider)
    if provider is None:
        known = ", ".join(sorted(providers)) or "none"
        raise SpecError(f"spec.provider: {spec.provider!r} is not in the providers file "
                        f"(configured: {known})")
    return provider


def provider_for_ref(providers: Mapping[str, Provider], provider_name: str, ref: Ref) -> Provider | None:
    """The provider that made `ref`, as status records it (None if that entry is gone: never another
    provider's same-named host). Status from before it was recorded has name and zone only: the spec's
    provider if it serves the zone, else the one provider that does (the spec's provider may have
    changed since the instance was made)."""
    if ref.provider:
        return providers.get(ref.provider)
    named = providers.get(provider_name)
    if named is not None and ref.zone in named.zones():
        return named
    serving = [p for p in providers.values() if ref.zone in p.zones()]
    return serving[0] if len(serving) == 1 else None


def unserved(providers: Mapping[str, Provider], provider_name: str, status: Obj) -> frozenset[Ref]:
    """The instances status names whose providers-file entry is gone (`provider_for_ref` is None): nothing
    can delete them, so a replacement or a switch to External keeps them in status rather than leaking
    their VMs (planner.py); deletion blocks on them (deletion.py)."""
    refs = (Ref.from_status(status.get(f)) for f in ("instance", "previousInstance"))
    return frozenset(r for r in refs
                     if r is not None and provider_for_ref(providers, provider_name, r) is None)


async def load_user_data(*, kube: KubeApi, namespace: str, spec: ProxySpec) -> bytes:
    if spec.user_data_ref is None:
        return (spec.user_data or "").encode()
    ref = spec.user_data_ref
    try:
        data = await read_usable_secret(kube, namespace=namespace, name=ref.name,
                                        field="spec.cloudInit.secretRef")
    except SecretNotUsable as e:
        raise Waiting(str(e)) from None
    if data is None:
        raise Waiting(f"waiting for Secret {namespace}/{ref.name} (spec.cloudInit.secretRef)")
    if ref.key not in data:
        raise Waiting(f"waiting for key {ref.key!r} in Secret {namespace}/{ref.name} "
                      "(spec.cloudInit.secretRef.key)")
    return data[ref.key]


async def desired_instance(*, proxy: Obj, spec: ProxySpec, providers: Mapping[str, Provider],
                           kube: KubeApi) -> Desired:
    provider = provider_for(spec, providers)
    try:
        resolved = provider.resolve(spec.placement)
    except PermanentError as e:
        raise SpecError(f"spec.placement: {e}") from None
    meta = proxy["metadata"]
    user_data = await load_user_data(kube=kube, namespace=meta.get("namespace", ""), spec=spec)
    name = instance_name(uid=meta.get("uid", ""), provider=spec.provider, placement=resolved,
                         user_data_sha256=user_data_digest(user_data))
    legacy = instance_name(uid=meta.get("uid", ""), provider=spec.provider, placement=resolved,
                           user_data_sha256=legacy_user_data_digest(user_data))
    if ((proxy.get("status") or {}).get("instance") or {}).get("name") == legacy:
        name = legacy  # made before names were keyed: same inputs, so no replacement (naming.py)
    return Desired(provider=provider, resolved=resolved, name=name,
                   user_data=user_data)
