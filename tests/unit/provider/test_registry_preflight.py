"""build_providers' start-up checks and the preflight command's handling of bad input (no hosts needed)."""

from __future__ import annotations

from pathlib import Path

import asyncssh
import pytest
import yaml

from egress_kvm.cli import main as cli_main
from egress_kvm.config import ConfigError, parse_providers
from egress_kvm.providers.base import Provider
from egress_kvm.providers.kvm import KvmProvider
from egress_kvm.providers.registry import build_providers


def write_files(tmp_path: Path) -> tuple[Path, Path]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = tmp_path / "id"
    key_path.write_bytes(key.export_private_key())
    kh = tmp_path / "known_hosts"
    kh.write_text("127.0.0.1 " + key.export_public_key().decode())
    return key_path, kh


def entry(key: Path | str, kh: Path | str, name: str = "kvm-a", port: int = 1) -> dict:  # type: ignore[type-arg]
    return {"name": name, "type": "kvm", "kvm": {
        "sshKeyFile": str(key), "knownHostsFile": str(kh),
        "images": {"d": {"url": "http://127.0.0.1:1/d.qcow2"}},
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 512}},
        "hosts": [{"name": "h0", "address": f"127.0.0.1:{port}", "user": "virt", "bridge": "br0"}]}}


async def test_build_providers_checks_files_and_builds_kvm_providers(tmp_path: Path) -> None:
    key, kh = write_files(tmp_path)
    config = parse_providers([entry(key, kh), entry(key, kh, name="kvm-b")])
    providers = build_providers(config, cluster_id="c1")
    assert set(providers) == {"kvm-a", "kvm-b"}
    for p in providers.values():
        assert isinstance(p, KvmProvider) and isinstance(p, Provider)
        assert p.cluster_id == "c1" and p.zones() == ["h0"]
        await p.close()
    bad = parse_providers([entry(key, kh), entry(tmp_path / "missing-key", kh, name="kvm-b")])
    with pytest.raises(ConfigError, match=r"providers\[1\]\.kvm\.sshKeyFile: '.*missing-key' does not exist"):
        build_providers(bad, cluster_id="c1")
    with pytest.raises(ConfigError, match="cluster id"):
        build_providers(config, cluster_id="")


def run_cli(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        cli_main(argv)
    return int(info.value.code or 0)


def test_preflight_exit_codes_for_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key, kh = write_files(tmp_path)
    missing = tmp_path / "nope.yaml"
    assert run_cli(["preflight", "--providers-config", str(missing)]) == 2
    assert "nope.yaml: cannot read" in capsys.readouterr().err
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"providers": [entry(key, kh)]}))
    assert run_cli(["preflight", "--providers-config", str(f), "--provider", "other"]) == 2
    assert "--provider 'other' is not in the providers config (known: kvm-a)" in capsys.readouterr().err
    f.write_text(yaml.safe_dump({"providers": [entry(key, tmp_path / "no-known-hosts")]}))
    assert run_cli(["preflight", "--providers-config", str(f)]) == 2
    assert "knownHostsFile" in capsys.readouterr().err


def test_preflight_reports_an_unreachable_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Port 1 on loopback refuses: ssh fails with a reason, the later checks are skipped, exit 1."""
    key, kh = write_files(tmp_path)
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump([entry(key, kh)]))
    assert run_cli(["preflight", "--providers-config", str(f)]) == 1
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0] == "FAIL kvm-a image d: image 'd': nothing listens at http://127.0.0.1:1/d.qcow2 " \
                       "(connection refused)"
    assert lines[1] == "FAIL kvm-a/h0 ssh: nothing listens on 127.0.0.1:1: is sshd running, and on port 1?"
    assert [ln.split()[0] for ln in lines[2:]] == ["SKIP"] * 6
    assert "2 check(s) failed" in out.err
