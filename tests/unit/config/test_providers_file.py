"""The providers file: defaults, and every rejection names the field path and the value."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from egress_kvm.config import (
    DEFAULT_VENDOR_DATA,
    ConfigError,
    check_kvm_files,
    load_providers_file,
    parse_providers,
)
from egress_kvm.operator.providers_file import read_providers

SHA = "ab" * 32
H0 = "providers[0].kvm.hosts[0]"


def entry(**kvm_over: Any) -> dict[str, Any]:
    kvm: dict[str, Any] = {
        "sshKeyFile": "/keys/id",
        "knownHostsFile": "/keys/known_hosts",
        "images": {"debian-13": {"url": "https://example.test/d.qcow2", "sha256": SHA}},
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 1024}},
        "hosts": [{"name": "nas1", "address": "nas1.home.lan:22", "user": "virt", "bridge": "br0"}],
    }
    kvm.update(kvm_over)
    return {"name": "kvm-home", "type": "kvm", "kvm": kvm}


def error_of(doc: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_providers(doc, source="f.yaml")
    return str(info.value)


def test_defaults_follow_the_config_reference() -> None:
    cfg = parse_providers({"providers": [entry()]})
    kvm = cfg.providers[0].kvm
    assert kvm is not None
    assert kvm.disk_size_gb == 10
    assert kvm.insecure_ignore_host_key is False
    assert kvm.vendor_data == DEFAULT_VENDOR_DATA
    assert "qemu-guest-agent" in kvm.vendor_data
    assert kvm.images["debian-13"].format == "qcow2"
    host = kvm.hosts[0]
    assert host.socket == "/var/run/libvirt/libvirt-sock"
    assert host.pool == "default"
    assert host.domain_type == "kvm"
    assert host.cpu_config.mode == "host-passthrough"
    assert host.cpu_config.disabled_features == []
    assert host.seed_bus == "sata"
    assert host.host_port == ("nas1.home.lan", 22)


def test_bare_list_is_accepted() -> None:
    assert parse_providers([entry()]).providers[0].name == "kvm-home"


def test_qemu_domain_type_defaults_cpu_to_maximum_and_refuses_passthrough() -> None:
    host = {"name": "h", "address": "10.0.0.1:2222", "user": "virt", "bridge": "br0", "domainType": "qemu"}
    cfg = parse_providers([entry(hosts=[host])])
    assert cfg.providers[0].kvm.hosts[0].cpu_config.mode == "maximum"  # type: ignore[union-attr]
    bad = dict(host, cpu={"mode": "host-passthrough"})
    msg = error_of([entry(hosts=[bad])])
    assert "providers[0].kvm.hosts[0]" in msg and "host-passthrough" in msg


def test_cpu_override_with_disabled_features() -> None:
    host = {"name": "h", "address": "h:22", "user": "virt", "bridge": "br0",
            "cpu": {"mode": "host-passthrough", "disabledFeatures": ["arch-capabilities"]}, "seedBus": "scsi"}
    h = parse_providers([entry(hosts=[host])]).providers[0].kvm.hosts[0]  # type: ignore[union-attr]
    assert h.cpu_config.disabled_features == ["arch-capabilities"]
    assert h.seed_bus == "scsi"


def test_empty_vendor_data_is_kept_empty() -> None:
    assert parse_providers([entry(vendorData="")]).providers[0].kvm.vendor_data == ""  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mutate", "path", "value"),
    [
        (lambda d: d["kvm"].update(diskSizeGB=20), "providers[0].kvm.diskSizeGB", "20"),
        (lambda d: d["kvm"]["hosts"][0].update(adress="x"), "providers[0].kvm.hosts[0].adress", "'x'"),
        (lambda d: d["kvm"].update(machineTypes={}), "providers[0].kvm.machineTypes", "{}"),
        (lambda d: d["kvm"]["images"]["debian-13"].update(url="ftp://x/y"),
         "providers[0].kvm.images.debian-13.url", "'ftp://x/y'"),
        (lambda d: d["kvm"]["images"]["debian-13"].update(url="not a url"),
         "providers[0].kvm.images.debian-13.url", "'not a url'"),
        (lambda d: d["kvm"]["images"]["debian-13"].update(sha256="abc123"),
         "providers[0].kvm.images.debian-13.sha256", "'abc123'"),
        (lambda d: d["kvm"]["images"]["debian-13"].update(sha256="g" * 64),
         "providers[0].kvm.images.debian-13.sha256", "'ggg"),
        (lambda d: d["kvm"]["images"]["debian-13"].update(format="vmdk"),
         "providers[0].kvm.images.debian-13.format", "'vmdk'"),
        (lambda d: d["kvm"]["hosts"][0].update(address="nas1"), f"{H0}.address", "'nas1'"),
        (lambda d: d["kvm"]["hosts"][0].update(address="nas1:99999"),
         f"{H0}.address", "'nas1:99999'"),
        (lambda d: d["kvm"]["hosts"][0].update(address="::1:22"), f"{H0}.address", "'::1:22'"),
        (lambda d: d["kvm"]["hosts"][0].update(bridge="br0; rm -rf /"),
         "providers[0].kvm.hosts[0].bridge", "'br0; rm -rf /'"),
        (lambda d: d["kvm"]["hosts"][0].update(domainType="xen"), f"{H0}.domainType", "'xen'"),
        (lambda d: d["kvm"]["hosts"][0].update(seedBus="ide"), f"{H0}.seedBus", "'ide'"),
        (lambda d: d["kvm"]["machineTypes"]["small"].update(vcpus=0),
         "providers[0].kvm.machineTypes.small.vcpus", "0"),
        (lambda d: d["kvm"].update(images={"../etc": {"url": "http://x/y"}}), "providers[0].kvm.images",
         "../etc"),
        (lambda d: d.update(type="gcp"), "providers[0].type", "'gcp'"),
    ],
)
def test_rejections_name_field_path_and_value(mutate: Any, path: str, value: str) -> None:
    doc = copy.deepcopy(entry())
    mutate(doc)
    msg = error_of([doc])
    assert msg.startswith("f.yaml:")
    assert f"{path}:" in msg
    assert value in msg


def test_missing_required_fields_are_named() -> None:
    doc = entry()
    del doc["kvm"]["hosts"][0]["bridge"]
    del doc["kvm"]["sshKeyFile"]
    msg = error_of([doc])
    assert "providers[0].kvm.hosts[0].bridge: is required" in msg
    assert "providers[0].kvm.sshKeyFile: is required" in msg


def test_known_hosts_required_unless_insecure() -> None:
    doc = entry()
    del doc["kvm"]["knownHostsFile"]
    assert "knownHostsFile is required unless insecureIgnoreHostKey" in error_of([doc])
    doc["kvm"]["insecureIgnoreHostKey"] = True
    assert parse_providers([doc]).providers[0].kvm.known_hosts_file is None  # type: ignore[union-attr]


def test_duplicate_provider_and_host_names() -> None:
    msg = error_of([entry(), entry()])
    assert "providers[1].name 'kvm-home' duplicates providers[0].name" in msg
    host = {"name": "nas1", "address": "a:22", "user": "virt", "bridge": "br0"}
    msg = error_of([entry(hosts=[host, dict(host, address="b:22")])])
    assert "providers[0].kvm.hosts:" in msg and "hosts[1].name 'nas1' duplicates hosts[0].name" in msg


def test_kvm_type_needs_its_block() -> None:
    assert "type 'kvm' needs a 'kvm' block" in error_of([{"name": "x", "type": "kvm"}])


def test_load_file_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read"):
        load_providers_file(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("providers: [\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_providers_file(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_providers_file(scalar)


def test_load_file_round_trip(tmp_path: Path) -> None:
    import yaml

    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"providers": [entry()]}))
    assert load_providers_file(f).providers[0].kvm.hosts[0].name == "nas1"  # type: ignore[union-attr]


def test_start_up_file_checks(tmp_path: Path) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = tmp_path / "id"
    key_path.write_bytes(key.export_private_key())
    kh = tmp_path / "known_hosts"
    kh.write_text("nas1 " + key.export_public_key().decode())
    good = parse_providers([entry(sshKeyFile=str(key_path), knownHostsFile=str(kh))]).providers[0].kvm
    assert good is not None
    check_kvm_files(good, prefix="providers[0].kvm")

    for over, field, needle in [
        ({"sshKeyFile": str(tmp_path / "gone")}, "sshKeyFile", "does not exist"),
        ({"knownHostsFile": str(tmp_path / "gone")}, "knownHostsFile", "does not exist"),
        ({"sshKeyFile": str(kh)}, "sshKeyFile", "not a usable"),
    ]:
        cfg = parse_providers([entry(**{"sshKeyFile": str(key_path), "knownHostsFile": str(kh), **over})])
        with pytest.raises(ConfigError) as info:
            check_kvm_files(cfg.providers[0].kvm, prefix="providers[0].kvm")  # type: ignore[arg-type]
        assert f"providers[0].kvm.{field}" in str(info.value)
        assert needle in str(info.value)
        assert str(tmp_path) in str(info.value)

    garbage = tmp_path / "garbage"
    garbage.write_text("this is not a known hosts line at all\n")
    cfg = parse_providers([entry(sshKeyFile=str(key_path), knownHostsFile=str(garbage))])
    with pytest.raises(ConfigError, match=r"knownHostsFile.*does not parse"):
        check_kvm_files(cfg.providers[0].kvm, prefix="providers[0].kvm")  # type: ignore[arg-type]

    insecure = parse_providers([entry(sshKeyFile=str(key_path), knownHostsFile=str(tmp_path / "gone"),
                                      insecureIgnoreHostKey=True)]).providers[0].kvm
    check_kvm_files(insecure, prefix="p")  # type: ignore[arg-type]


@pytest.mark.parametrize("mutate", [
    lambda d: d["kvm"].pop("knownHostsFile"),  # a model-level error: its input is the whole kvm mapping
    lambda d: d["kvm"].update(vendorData=["#cloud-config", "password: hunter2"]),  # wrong type
    lambda d: d["kvm"].update(diskSizeGb=0),
    lambda d: d["kvm"]["images"]["debian-13"].update(url="gopher://u:hunter2@x/y?sig=hunter2"),
])
def test_errors_never_echo_vendor_data_sections_or_url_credentials(mutate: Any) -> None:
    doc = entry(vendorData="#cloud-config\npassword: hunter2\n")
    mutate(doc)
    msg = error_of([doc])
    assert "providers[0].kvm" in msg
    assert "hunter2" not in msg


@pytest.mark.parametrize("text", [
    "providers:\n- name: a\n  kvm:\n    vendorData: \"VD-SECRET-1f2e\n  x: [\n",
    "providers:\n  - kvm: {vendorData: VD-SECRET-1f2e}\n   bad indent: VD-SECRET-1f2e\n",
    "egress:\n  allowedCIDRs: [VD-SECRET-1f2e\n",
])
def test_a_yaml_error_names_the_place_and_quotes_nothing(tmp_path: Path, text: str) -> None:
    """PyYAML's message quotes the lines around the error: vendorData and paths must stay out of logs."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    for load in (load_providers_file, read_providers):
        with pytest.raises(ConfigError) as info:
            load(bad)  # type: ignore[operator]
        message = str(info.value)
        assert re.fullmatch(r".*bad\.yaml: not valid YAML \(line \d+, column \d+\)", message), message
        assert "SECRET" not in str(info.value)


@pytest.mark.parametrize(("egress", "fragment"), [
    ({"allowedCIDRs": ["images.example"]}, "egress.allowedCIDRs: entry [0] is not a CIDR"),
    ({"clusterCIDRs": ["10.0.0.0/33"]}, "egress.clusterCIDRs: entry [0] is not a CIDR"),
    ({"authEndpoints": ["proxy.example:99999"]}, "egress.authEndpoints: entry [0] port '99999'"),
    ({"externalEndpoints": ["bad host"]}, "egress.externalEndpoints: entry [0] must be a host name"),
    ({"nope": []}, "egress.nope: unknown key"),
])
def test_egress_section_errors_name_the_entry(egress: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_providers({"egress": egress, "providers": []})
    assert fragment in str(info.value)
