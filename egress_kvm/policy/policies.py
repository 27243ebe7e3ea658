"""The providers file's `egress` section (and a kvm entry's `urlImages`) as one Policy per purpose."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from egress_kvm.config.models import EgressConfig

from .egress import DEFAULT_CLUSTER_CIDRS, Allowlist, Policy, Purpose


@dataclass(frozen=True)
class EgressPolicies:
    """Everything the operator needs to decide a tenant-aimed request; the default is the strict one."""

    external_probe: Policy
    external_auth: Policy
    configured_image: Policy
    vm_probe: Policy  # cluster ranges do not apply: VMs live on private LANs

    @classmethod
    def from_config(cls, egress: EgressConfig | None = None) -> EgressPolicies:
        egress = egress or EgressConfig.model_validate({})
        common = _common(egress)
        external = None if egress.external_endpoints is None else Allowlist.parse(egress.external_endpoints)
        return cls(
            external_probe=Policy(Purpose.EXTERNAL_PROBE, external, **common),
            external_auth=Policy(Purpose.EXTERNAL_AUTH, Allowlist.parse(egress.auth_endpoints), **common),
            configured_image=Policy(Purpose.CONFIGURED_IMAGE, None, **common),
            vm_probe=Policy(Purpose.VM_PROBE, None, cluster=(), exempt=common["exempt"]))


def _common(egress: EgressConfig | None) -> dict[str, Any]:
    egress = egress or EgressConfig.model_validate({})
    cidrs = DEFAULT_CLUSTER_CIDRS if egress.cluster_cidrs is None else egress.cluster_cidrs
    return {"cluster": tuple(ipaddress.ip_network(c, strict=False) for c in cidrs),
            "exempt": Allowlist.parse(egress.allowed_cidrs)}


def url_image_policy(egress: EgressConfig | None, entries: Sequence[str]) -> Policy:
    """placement.image as a URL: only what the kvm entry's urlImages lists (none: URL images are off)."""
    return Policy(Purpose.URL_IMAGE, Allowlist.parse(entries), **_common(egress))


def configured_image_policy(egress: EgressConfig | None) -> Policy:
    """The admin's own images[].url: no allowlist, but the denied ranges hold on it and every redirect."""
    return Policy(Purpose.CONFIGURED_IMAGE, None, **_common(egress))
