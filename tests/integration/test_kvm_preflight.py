"""`egress-kvm preflight` against the real lab host: passes there, and fails clearly on a wrong host key,
a missing pool, an inactive pool, a missing bridge and an interface that is not a bridge (a veth) (each naming
what is wrong), with the exit status saying so. (Forwarding refused, a silent libvirtd, a full pool and
exec refused are covered in tests/unit/provider/test_preflight_checks.py, against an in-process sshd.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncssh
import pytest
import yaml

from egress_kvm.config import load_providers_file
from egress_kvm.preflight import CheckResult, run_preflight

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def config_with(info: Any, tmp_path: Path, **host_overrides: Any) -> Path:
    doc = yaml.safe_load(Path(info.providers_file).read_text())
    kvm = doc["providers"][0]["kvm"]
    if "knownHostsFile" in host_overrides:
        kvm["knownHostsFile"] = host_overrides.pop("knownHostsFile")
    kvm["hosts"] = kvm["hosts"][:1]
    kvm["hosts"][0].update(host_overrides)
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


async def results_for(path: Path) -> dict[str, CheckResult]:
    config = load_providers_file(path)
    return {r.check: r for r in await run_preflight(config)}


def cli(path: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "egress_kvm.cli", "preflight", "--providers-config", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


async def test_preflight_passes_on_the_lab(lab_host: Any, tmp_path: Path) -> None:
    path = config_with(lab_host, tmp_path)
    got = await results_for(path)
    assert list(got) == ["ssh", "forwarding", "libvirt", "pool", "bridge"]
    assert all(r.ok for r in got.values()), [r.line() for r in got.values()]
    assert "host key verified" in got["ssh"].detail
    assert got["libvirt"].detail.startswith("libvirt ")
    assert "'default' active" in got["pool"].detail
    proc = cli(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS ") == 5 and "all 5 checks passed" in proc.stdout


async def test_preflight_fails_on_a_wrong_host_key(lab_host: Any, tmp_path: Path) -> None:
    wrong = tmp_path / "known_hosts"
    other = asyncssh.generate_private_key("ssh-ed25519")
    wrong.write_text(f"{lab_host.hosts[0].ip} {other.export_public_key().decode()}")
    path = config_with(lab_host, tmp_path, knownHostsFile=str(wrong))
    got = await results_for(path)
    assert got["ssh"].ok is False and "host key not accepted" in got["ssh"].detail
    assert all(got[c].ok is None for c in ("forwarding", "libvirt", "pool", "bridge"))
    proc = cli(path)
    assert proc.returncode == 1 and "FAIL lab/host0 ssh: host key not accepted" in proc.stdout


async def test_preflight_fails_on_a_missing_pool(lab_host: Any, tmp_path: Path) -> None:
    got = await results_for(config_with(lab_host, tmp_path, pool="nopool"))
    assert got["pool"].ok is False and "storage pool 'nopool' does not exist" in got["pool"].detail
    assert got["libvirt"].ok and got["bridge"].ok


async def test_preflight_fails_on_a_missing_bridge(lab_host: Any, tmp_path: Path) -> None:
    path = config_with(lab_host, tmp_path, bridge="br9")
    got = await results_for(path)
    assert got["bridge"].ok is False and "bridge 'br9' not found" in got["bridge"].detail
    assert got["pool"].ok
    proc = cli(path)
    assert proc.returncode == 1 and "FAIL lab/host0 bridge" in proc.stdout


async def test_preflight_fails_on_an_inactive_pool(lab_host: Any, tmp_path: Path) -> None:
    """A pool of its own (defined, never started), so the lab's `default` pool is left alone."""
    from testbed import lab as labmod

    virsh = ["virsh", "-q", "-c", "qemu:///system"]
    labmod.host_run(lab_host, "host0", [*virsh, "pool-undefine", "itpool"], check=False)  # an earlier run's
    labmod.host_run(lab_host, "host0", [*virsh, "pool-define-as", "itpool", "dir", "--target", "/tmp/itpool"])
    try:
        got = await results_for(config_with(lab_host, tmp_path, pool="itpool"))
        assert got["pool"].ok is False
        assert "storage pool 'itpool' is inactive, not active (virsh pool-start itpool)" in got["pool"].detail
        assert got["libvirt"].ok and got["bridge"].ok
    finally:
        labmod.host_run(lab_host, "host0", [*virsh, "pool-undefine", "itpool"], check=False)


async def test_preflight_fails_on_an_interface_that_is_not_a_bridge(lab_host: Any, tmp_path: Path) -> None:
    from testbed import lab as labmod

    # A veth pair (this kernel has no dummy module); deleting one end removes both.
    labmod.host_run(lab_host, "host0", ["ip", "link", "del", "itveth0"], check=False)  # an earlier run's
    labmod.host_run(lab_host, "host0",
                    ["ip", "link", "add", "itveth0", "type", "veth", "peer", "name", "itveth1"])
    try:
        path = config_with(lab_host, tmp_path, bridge="itveth0")
        got = await results_for(path)
        assert got["bridge"].ok is False
        assert "'itveth0' exists but is a veth device, not a bridge" in got["bridge"].detail
        proc = cli(path)
        assert proc.returncode == 1 and "FAIL lab/host0 bridge" in proc.stdout
    finally:
        labmod.host_run(lab_host, "host0", ["ip", "link", "del", "itveth0"], check=False)
