"""Reading the providers file: YAML -> ProvidersConfig, with a `providers:` document or a bare list."""

from __future__ import annotations

import os
from typing import Any

import yaml
from pydantic import ValidationError

from .errors import ConfigError, format_validation_error, yaml_error
from .models import ProvidersConfig


def parse_providers(document: Any, *, source: str = "providers config") -> ProvidersConfig:
    """Validate an already-parsed YAML document (a mapping with `providers:` or a bare list)."""
    if document is None:
        document = {"providers": []}
    elif isinstance(document, list):
        document = {"providers": document}
    elif not isinstance(document, dict):
        raise ConfigError(f"{source}: expected a mapping with 'providers:' or a list of providers, "
                          f"got {type(document).__name__}")
    try:
        return ProvidersConfig.model_validate(document)
    except ValidationError as exc:
        raise format_validation_error(exc, source=source) from None


def load_providers_file(path: str | os.PathLike[str]) -> ProvidersConfig:
    """Read and validate the providers file; ConfigError names the path, the field path and the value."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read providers config: {exc.strerror or exc}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {yaml_error(exc)}") from None
    return parse_providers(document, source=source)
