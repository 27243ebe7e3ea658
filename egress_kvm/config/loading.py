"""Reading the providers file: YAML -> ProvidersConfig, with a `providers:` document or a bare list."""

from __future__ import annotations

import os
from typing import Any

import yaml
from pydantic import ValidationError

from .errors import ConfigError, format_validation_error
from .models import ProvidersConfig


def yaml_error(exc: yaml.YAMLError, *, source: str) -> str:
    """A YAML error as `FILE: not valid YAML at line L, column C: problem` (PyYAML's own text names the
    stream "<unicode string>" when it parsed a str, never the file)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    said = f"{problem} ({context})" if context else problem
    return f"{source}: not valid YAML{where}: {said}"


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
        raise ConfigError(yaml_error(exc, source=source)) from None
    return parse_providers(document, source=source)
