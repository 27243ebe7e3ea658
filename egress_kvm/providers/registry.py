"""Build the configured providers, after the start-up checks the spec asks for.

The operator calls `build_providers(load_providers_file(path), cluster_id=...)` once at start-up: a
missing or unparsable SSH key or known_hosts raises ConfigError naming the field and path, so the
process refuses to start instead of failing on the first Proxy.
"""

from __future__ import annotations

from egress_kvm.config import ConfigError, ProvidersConfig, check_kvm_files
from egress_kvm.providers.base import Provider
from egress_kvm.providers.kvm import KvmProvider
from egress_kvm.providers.kvm.session import Dialer, ssh_dial


def build_providers(config: ProvidersConfig, *, cluster_id: str,
                    dial: Dialer = ssh_dial) -> dict[str, Provider]:
    if not cluster_id:
        raise ConfigError("cluster id must not be empty (it keeps clusters sharing a hypervisor apart)")
    providers: dict[str, Provider] = {}
    for index, entry in enumerate(config.providers):
        if entry.type == "kvm" and entry.kvm is not None:
            check_kvm_files(entry.kvm, prefix=f"providers[{index}].kvm")
            providers[entry.name] = KvmProvider(name=entry.name, config=entry.kvm, cluster_id=cluster_id,
                                                dial=dial, egress=config.egress)
        else:  # pragma: no cover - the model admits only kvm today
            raise ConfigError(f"providers[{index}].type: {entry.type!r} has no implementation")
    return providers
