"""`egress-kvm preflight` against the real lab host: passes there, and fails clearly on hosts set up wrong
on purpose (testbed/lab/faults.py): a wrong host key (and an unknown one on a non-22 port, with the exact
`ssh-keyscan -p` line), a missing or inactive pool, a pool too small for N VMs, a missing bridge, links that
are not bridges (lo, the host's uplink, a veth), an sshd without stream-local forwarding and a user
outside the `libvirt` group; each names what is wrong once, with the exit status saying so. (A silent
libvirtd, a full pool and exec refused are covered in tests/unit/provider/test_preflight_checks.py,
against an in-process sshd.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncssh
import pytest
import yaml

from egress_kvm.config import load_providers_file
from egress_kvm.preflight import CHECKS, CheckResult, run_preflight
from egress_kvm.preflight.verdicts import Status
from egress_kvm.providers.kvm import naming

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


async def results_for(path: Path, **kw: Any) -> dict[str, CheckResult]:
    config = load_providers_file(path)
    return {r.check: r for r in await run_preflight(config, **kw)}


def cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "egress_kvm.cli", "preflight", "--providers-config", str(path), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def failures(got: dict[str, CheckResult]) -> dict[str, str]:
    return {name: r.detail for name, r in got.items() if r.ok is False}


async def test_preflight_passes_on_the_lab(lab: Any, tmp_path: Path) -> None:
    """The lab with its image: every check passes; KVM warns when the lab emulates (domainType qemu)."""
    from testbed.lab.manifests import IMAGE_KEY

    path = config_with(lab, tmp_path)
    got = await results_for(path)
    image = f"image {IMAGE_KEY}"
    assert list(got) == [image, *CHECKS]
    assert failures(got) == {}
    assert got[image].status is Status.PASS and f"{lab.image.size / 1024**2:.1f} MiB" in got[image].detail
    assert "host key verified" in got["ssh"].detail
    assert got["libvirt"].detail.startswith("libvirt ")
    assert "'default' active" in got["pool"].detail and "room for base" in got["pool"].detail
    assert got["bridge"].detail.startswith("'br0' is a Linux bridge (state ")
    expected_kvm = Status.WARN if lab.hosts[0].domain_type == "qemu" else Status.PASS
    assert got["kvm"].status is expected_kvm
    proc = cli(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"all {len(CHECKS) + 1} checks passed on 1 host(s)" in proc.stdout


async def test_a_pool_without_room_for_n_vms_fails(lab_host: Any, tmp_path: Path) -> None:
    got = await results_for(config_with(lab_host, tmp_path), vms=100_000)
    assert list(failures(got)) == ["pool"]
    assert "100000 VM(s) at diskSizeGb 10" in got["pool"].detail and "free space, grow the pool" in \
        got["pool"].detail


@pytest.mark.parametrize("which", ["lo", "uplink"])
async def test_links_that_are_not_bridges_fail_and_say_what_to_set(lab_host: Any, tmp_path: Path,
                                                                   which: str) -> None:
    from testbed.lab import faults

    name = "lo" if which == "lo" else faults.uplink(lab_host, "host0")
    path = config_with(lab_host, tmp_path, bridge=name)
    got = await results_for(path)
    assert list(failures(got)) == ["bridge"]
    needle = "'lo' is the loopback device, not a bridge" if which == "lo" else \
        f"{name!r} exists but is a veth device, not a bridge"
    assert needle in got["bridge"].detail
    proc = cli(path)
    assert proc.returncode == 1 and proc.stdout.count(needle) == 1


async def test_an_sshd_without_stream_local_forwarding(lab_host: Any, tmp_path: Path) -> None:
    from testbed.lab import faults

    known_hosts = tmp_path / "kh"
    with faults.extra_sshd(lab_host, "host0", port=2201, stream_local=False) as sshd:
        known_hosts.write_text(sshd.known_hosts_line)
        got = await results_for(config_with(lab_host, tmp_path, address=sshd.address,
                                            knownHostsFile=str(known_hosts)))
    assert list(failures(got)) == ["forwarding"]
    # OpenSSH answers a refused forward with a bare "open failed", as for a socket it cannot open: the
    # socket's group and mode (read over exec) show virt may open it, so it is sshd's rule.
    assert got["forwarding"].detail.startswith(f"sshd refused to forward to {lab_host.hosts[0].socket}, "
                                               f"which virt may open")
    assert "AllowStreamLocalForwarding yes for user virt" in got["forwarding"].detail
    assert got["libvirt"].ok is None and got["pool"].ok is None
    assert got["commands"].ok and got["bridge"].ok  # what does not need the forward is still checked


async def test_a_session_path_without_ip_fails_commands_once(lab_host: Any, tmp_path: Path) -> None:
    from testbed.lab import faults

    known_hosts = tmp_path / "kh"
    with faults.extra_sshd(lab_host, "host0", port=2204, session_path="/nonexistent") as sshd:
        known_hosts.write_text(sshd.known_hosts_line)
        got = await results_for(config_with(lab_host, tmp_path, address=sshd.address,
                                            knownHostsFile=str(known_hosts)))
    assert list(failures(got)) == ["commands"]
    assert got["commands"].detail.startswith("`ip` is not on virt's PATH on the host")
    assert got["bridge"].ok is None and got["kvm"].ok and got["pool"].ok  # /dev/kvm needs no `ip`


async def test_a_user_outside_the_libvirt_group_is_told_which_group(lab_host: Any, tmp_path: Path) -> None:
    from testbed.lab import faults

    known_hosts = tmp_path / "kh"
    with faults.user_outside_libvirt_group(lab_host) as user, \
            faults.extra_sshd(lab_host, "host0", port=2202, user=user) as sshd:
        known_hosts.write_text(sshd.known_hosts_line)
        got = await results_for(config_with(lab_host, tmp_path, address=sshd.address, user=user,
                                            knownHostsFile=str(known_hosts)))
    assert list(failures(got)) == ["libvirt"], failures(got)
    assert got["forwarding"].status is Status.SKIP  # OpenSSH's answer cannot tell us until the group is right
    assert got["libvirt"].detail.startswith(f"{user} is not in group 'libvirt', which owns ")
    assert got["libvirt"].detail.endswith(f"sudo usermod -aG libvirt {user}")


async def test_an_unknown_host_on_another_port_gets_the_exact_keyscan_line(lab_host: Any,
                                                                          tmp_path: Path) -> None:
    from testbed.lab import faults

    other = tmp_path / "known_hosts"  # a known_hosts that knows some other host only
    other.write_text(f"192.0.2.1 {asyncssh.generate_private_key('ssh-ed25519').export_public_key().decode()}")
    with faults.extra_sshd(lab_host, "host0", port=2203) as sshd:
        path = config_with(lab_host, tmp_path, address=sshd.address, knownHostsFile=str(other))
        proc = cli(path)
    ip = sshd.address.split(":")[0]
    assert proc.returncode == 1
    assert f"ssh-keyscan -p 2203 {ip} >> {other}" in proc.stdout
    assert proc.stdout.count("not in") == 1 and "host key not accepted" not in proc.stdout


async def test_a_configmap_with_in_pod_paths_runs_with_local_keys_and_json(lab_host: Any,
                                                                          tmp_path: Path) -> None:
    doc = yaml.safe_load(config_with(lab_host, tmp_path).read_text())
    doc["providers"][0]["kvm"].update(sshKeyFile="/etc/proxy-operator/kvm/id_ed25519",
                                      knownHostsFile="/etc/proxy-operator/kvm/known_hosts")
    cm = tmp_path / "cm.yaml"
    cm.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "egress-kvm-providers-config"},
                                  "data": {"providers.yaml": yaml.safe_dump(doc)}}))
    assert cli(cm).returncode == 2
    proc = cli(cm, "--ssh-key", lab_host.ssh_key, "--known-hosts", lab_host.known_hosts, "-o", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert [r["check"] for r in out["results"] if r["host"] == "host0"] == list(CHECKS)
    assert out["summary"]["fail"] == 0 and out["summary"]["hosts"] == 1


async def test_preflight_fails_on_a_wrong_host_key(lab_host: Any, tmp_path: Path) -> None:
    wrong = tmp_path / "known_hosts"
    other = asyncssh.generate_private_key("ssh-ed25519")
    wrong.write_text(f"{lab_host.hosts[0].ip} {other.export_public_key().decode()}")
    path = config_with(lab_host, tmp_path, knownHostsFile=str(wrong))
    got = await results_for(path)
    assert got["ssh"].ok is False and "is not in " + str(wrong) in got["ssh"].detail
    assert all(got[c].ok is None for c in CHECKS[1:])
    proc = cli(path)
    assert proc.returncode == 1
    assert f"FAIL lab/host0 ssh: the host key of {lab_host.hosts[0].ip}:22" in proc.stdout


async def test_preflight_fails_on_a_missing_pool(lab_host: Any, tmp_path: Path) -> None:
    got = await results_for(config_with(lab_host, tmp_path, pool="nopool"))
    assert list(failures(got)) == ["pool"]
    assert "storage pool 'nopool' does not exist: virsh pool-define-as nopool" in got["pool"].detail


async def test_preflight_fails_on_a_missing_bridge(lab_host: Any, tmp_path: Path) -> None:
    path = config_with(lab_host, tmp_path, bridge="br9")
    got = await results_for(path)
    assert list(failures(got)) == ["bridge"] and "bridge 'br9' not found" in got["bridge"].detail
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


async def test_a_base_already_in_the_pool_takes_no_more_room(lab: Any, tmp_path: Path) -> None:
    from testbed.lab.manifests import IMAGE_KEY

    volumes = labmod_virsh(lab, "vol-list", "default").split()
    assert lab.image is not None
    base = naming.base_volume(key=IMAGE_KEY, url=lab.image.url, sha256=lab.image.sha256)
    made = base not in volumes
    if made:  # a stand-in volume under the provider's name for that base
        labmod_virsh(lab, "vol-create-as", "default", base, "1M", "--format", "raw")
    try:
        got = await results_for(config_with(lab, tmp_path))
    finally:
        if made:
            labmod_virsh(lab, "vol-delete", base, "--pool", "default")
    assert got["pool"].ok and f"room for base '{IMAGE_KEY}' (already in the pool) + 1 VM(s)" in \
        got["pool"].detail


def labmod_virsh(info: Any, *args: str) -> str:
    from testbed import lab as labmod

    return labmod.virsh(info, "host0", *args)
