"""The providers file as the process sees it: read, validated, checked, hashed, built into providers.

The hash is of the exact bytes parsed, so "the file changed" (poller) and "the config the providers
were built from" (the controller's providers_hash, which un-sticks Failed Proxies) always agree. A
ConfigMap update swaps a symlink atomically, so reading the bytes once is enough to see either the old
or the new file, never half of each.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from ..config import ConfigError, ProvidersConfig, check_kvm_files, parse_providers
from ..config.errors import yaml_error
from ..providers.base import Provider


@dataclass(frozen=True)
class LoadedProviders:
    config: ProvidersConfig
    digest: str  # sha256 of the file's bytes
    path: str


def file_digest(path: str) -> str:
    """sha256 of the file's bytes; ConfigError naming the path if it cannot be read."""
    return hashlib.sha256(_read(path)).hexdigest()


def read_providers(path: str) -> LoadedProviders:
    """Parse and validate the file and check the key/known_hosts files every kvm entry names.

    Raises ConfigError whose message starts with the path and names the field, so a bad file stops
    the process at start-up with a message a user can act on."""
    data = _read(path)
    try:
        document = yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {yaml_error(exc)}") from None
    config = parse_providers(document, source=path)
    for i, entry in enumerate(config.providers):
        if entry.kvm is not None:
            check_kvm_files(entry.kvm, prefix=f"{path}: providers[{i}].kvm")
    return LoadedProviders(config=config, digest=hashlib.sha256(data).hexdigest(), path=path)


async def build(loaded: LoadedProviders, *, cluster_id: str) -> Mapping[str, Provider]:
    """Providers by name, through the provider registry (imported here: it pulls in the rpc stack)."""
    from ..providers.registry import build_providers

    result = build_providers(loaded.config, cluster_id=cluster_id)
    if inspect.isawaitable(result):
        result = await result
    return dict(result)


async def close_all(providers: Mapping[str, Provider]) -> None:
    for provider in providers.values():
        # Best effort: the process is leaving or the entry was replaced; one failure must not stop the rest.
        with contextlib.suppress(Exception):
            await provider.close()


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read providers config: {exc.strerror or exc}") from None
