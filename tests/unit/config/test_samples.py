"""The shipped providers files validate: the sample a user copies, and the ConfigMap's embedded file."""

from __future__ import annotations

from pathlib import Path

import yaml

from egress_kvm.config import parse_providers

ROOT = Path(__file__).resolve().parents[3]


def test_sample_providers_config_validates() -> None:
    cm = yaml.safe_load((ROOT / "deploy/examples/providers_config.yaml").read_text())
    config = parse_providers(yaml.safe_load(cm["data"]["providers.yaml"]))
    kvm = config.providers[0].kvm
    assert kvm is not None and [h.name for h in kvm.hosts] == ["nas1", "nas2"]


def test_manager_configmap_embeds_a_valid_providers_file() -> None:
    cm = yaml.safe_load((ROOT / "deploy/providers/providers_config.yaml").read_text())
    assert parse_providers(yaml.safe_load(cm["data"]["providers.yaml"])).providers == []
