"""Where preflight's providers config comes from: the providers file itself, a ConfigMap manifest that
holds one (deploy/providers/providers_config.yaml), or `kubectl get cm -o yaml` output (one ConfigMap or
a List), read from a path or from stdin (`-`). The operator's own loader reads only the first kind.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from egress_kvm.config import ConfigError, ProvidersConfig, parse_providers
from egress_kvm.config.errors import yaml_error

CONFIGMAP_KEY = "providers.yaml"  # the key deploy/ mounts as /etc/proxy-operator/providers.yaml


def read_text(path: str) -> tuple[str, str]:
    """(text, source name) of `path`, or of stdin for `-`."""
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(), path
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read providers config: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc.reason}") from None


def _configmaps(documents: list[Any]) -> list[dict[str, Any]]:
    found = []
    for doc in documents:
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            found += _configmaps(doc["items"])
        elif doc.get("kind") == "ConfigMap":
            found.append(doc)
    return found


def _is_manifest(doc: Any) -> bool:
    return isinstance(doc, dict) and "kind" in doc and "apiVersion" in doc


def providers_from_text(text: str, *, source: str) -> ProvidersConfig:
    """Validate a providers file, or the providers file inside the one ConfigMap that holds one."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {yaml_error(exc)}") from None
    if not any(_is_manifest(d) for d in documents):
        if len(documents) > 1:
            raise ConfigError(f"{source}: {len(documents)} YAML documents; a providers file is one")
        return parse_providers(documents[0] if documents else None, source=source)
    holders = [cm for cm in _configmaps(documents) if CONFIGMAP_KEY in (cm.get("data") or {})]
    if len(holders) != 1:
        names = ", ".join(str((cm.get("metadata") or {}).get("name")) for cm in holders)
        raise ConfigError(f"{source}: expected one ConfigMap with data.{CONFIGMAP_KEY}, found "
                          f"{len(holders)}{': ' + names if names else ''}")
    name = (holders[0].get("metadata") or {}).get("name", "?")
    inner = f"{source} (ConfigMap {name} data.{CONFIGMAP_KEY})"
    embedded = holders[0]["data"][CONFIGMAP_KEY]
    if not isinstance(embedded, str):
        raise ConfigError(f"{inner}: expected a string, got {type(embedded).__name__}")
    try:
        document = yaml.safe_load(embedded)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{inner}: {yaml_error(exc)}") from None
    return parse_providers(document, source=inner)


def load(path: str) -> ProvidersConfig:
    text, source = read_text(path)
    return providers_from_text(text, source=source)
