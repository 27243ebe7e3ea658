"""The lab's own proof for its hosts: real netns, sshd, libvirtd, dnsmasq; reachable over real SSH with
the host key checked; idempotent `up`; a crashed lab cleaned and rebuilt; `down` leaves nothing behind.

Uses its own lab index, and only that one, with its own state dirs, apart from the shared session lab
that other tests use: EGRESS_LAB_SELFTEST_INDEX, by default the session lab's index + 4 (mod 8: 0->4,
3->7, 5->1), so two sessions with main labs 0-3 never remove each other's self-test lab; collecting this
module fails, naming both variables, when it would be the session's own lab (tests/envknobs.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from testbed import lab
from testbed.lab import procs
from testbed.lab.host import authorized_keys_path
from testbed.lab.layout import LabLayout
from tests.envknobs import selftest_lab_index

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

INDEX = selftest_lab_index()


def live_lab_of_index(index: int) -> list[str]:
    """The hosts of a running lab of `index` (a netns of the index with processes in it), each with one
    of its command lines: `lab.up` removes every lab of its index wherever its state dir is, so this
    module must not start while another session (or the demo) runs one at its index."""
    found = []
    for h in LabLayout.make(index=index, hosts=1).every_possible_host:
        pids = procs.pids_in_netns(h.netns)
        if pids:
            cmdline = "?"
            with contextlib.suppress(OSError):  # gone meanwhile
                cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace").strip()[:160]
            found.append(f"{h.netns}: {len(pids)} processes, e.g. {cmdline}")
    return found


@pytest.fixture(scope="module")
def own_lab(tmp_path_factory):
    reason = lab.unavailable_reason()
    if reason:
        pytest.skip(reason)
    running = live_lab_of_index(INDEX)
    if running:
        pytest.fail(f"lab index {INDEX} (EGRESS_LAB_SELFTEST_INDEX, or EGRESS_LAB_INDEX + 4) is in use by a "
                    f"running lab, which this module would remove: {'; '.join(running)}. Set "
                    f"EGRESS_LAB_SELFTEST_INDEX to a free index, or, if that lab is a leftover of yours, "
                    f"remove it with `egress-kvm lab down --index {INDEX}`", pytrace=False)
    state = tmp_path_factory.mktemp("lab-selftest")
    info = lab.up(state_dir=state, index=INDEX, hosts=2, image=False)
    yield info
    lab.down(state)


def ssh(info: lab.LabInfo, host: lab.HostInfo, command: str, *, known_hosts: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", info.ssh_key, "-o", f"UserKnownHostsFile={known_hosts or info.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
         "-p", str(host.port), f"{host.user}@{host.ip}", command],
        capture_output=True, text=True, timeout=60)


def test_lab_json_describes_the_hosts(own_lab):
    info = lab.LabInfo.load(own_lab.state_dir)
    assert info == own_lab
    assert info.index == INDEX and info.image is None
    assert [h.name for h in info.hosts] == ["host0", "host1"]
    h0 = info.hosts[0]
    assert h0.address == f"{h0.ip}:22"
    assert h0.ip == f"10.231.{INDEX * 16}.2"
    assert h0.gateway == f"10.231.{INDEX * 16 + 1}.1"
    assert procs.alive(h0.libvirtd_pid) and procs.alive(h0.sshd_pid)
    files = (info.ssh_key, info.known_hosts, info.providers_file, info.user_data_file, *info.proxy_manifests)
    for path in files:
        assert Path(path).is_file(), path
    assert lab.problems(info.state_dir) == []


@pytest.mark.parametrize("host_index", [0, 1])
def test_virt_user_drives_libvirt_over_ssh_with_the_host_key_checked(own_lab, host_index):
    host = own_lab.hosts[host_index]
    out = ssh(own_lab, host, "virsh -c qemu:///system list --all && virsh -c qemu:///system pool-info default"
                             " && ip -br link show br0 && id -nG")
    assert out.returncode == 0, out.stderr
    assert "State:          running" in out.stdout
    assert out.stdout.splitlines()[-2].startswith("br0")  # `ip` is on the session PATH
    assert "libvirt" in out.stdout.splitlines()[-1].split()


def test_a_wrong_host_key_is_refused(own_lab, tmp_path):
    # host1's key presented as host0's: OpenSSH must refuse, so the lab's known_hosts really is checked
    lines = Path(own_lab.known_hosts).read_text().splitlines()
    forged = tmp_path / "known_hosts"
    forged.write_text(f"{own_lab.hosts[0].ip} {lines[1].split(' ', 1)[1]}\n")
    out = ssh(own_lab, own_lab.hosts[0], "true", known_hosts=str(forged))
    assert out.returncode != 0
    assert "Host key verification failed" in out.stderr or "HOST IDENTIFICATION HAS CHANGED" in out.stderr


def test_virsh_and_host_run_act_on_the_host(own_lab):
    addr = lab.host_run(own_lab, "host0", ["ip", "-br", "addr", "show", "br0"]).stdout
    assert own_lab.hosts[0].gateway in addr
    assert "default" in lab.virsh(own_lab, "host1", "pool-list", "--name")
    # each host has its own libvirtd: a volume made on host0 is not on host1
    lab.virsh(own_lab, "host0", "vol-create-as", "default", "only-on-host0.qcow2", "1M", "--format", "qcow2")
    assert "only-on-host0.qcow2" in lab.virsh(own_lab, "host0", "vol-list", "default")
    assert "only-on-host0.qcow2" not in lab.virsh(own_lab, "host1", "vol-list", "default")
    assert (Path(own_lab.hosts[0].pool_dir) / "only-on-host0.qcow2").is_file()
    with pytest.raises(lab.LabError, match="no host 'host9'"):
        lab.virsh(own_lab, "host9", "list")


def test_http_target_reachable_from_the_root_namespace(own_lab):
    for host in own_lab.hosts:
        with urllib.request.urlopen(host.http_target, timeout=10) as resp:
            assert resp.read().decode() == f"hello-through-proxy from egress-kvm lab{INDEX} {host.name}\n"
    assert own_lab.http_target == own_lab.hosts[0].http_target


def test_up_again_reuses_a_healthy_lab(own_lab):
    again = lab.up(state_dir=own_lab.state_dir, index=INDEX, hosts=2, image=False)
    assert [h.libvirtd_pid for h in again.hosts] == [h.libvirtd_pid for h in own_lab.hosts]


def test_up_after_a_crash_cleans_and_rebuilds(own_lab):
    """A lab whose daemons died (SIGKILL, as in a crash) is detected, cleaned and brought up fresh."""
    old = own_lab.hosts[0]
    os.kill(old.libvirtd_pid, signal.SIGKILL)
    os.kill(old.sshd_pid, signal.SIGKILL)
    procs.wait_gone([old.libvirtd_pid, old.sshd_pid], timeout=10)
    assert any("libvirtd not running" in p for p in lab.problems(own_lab.state_dir))
    second = lab.up(state_dir=own_lab.state_dir, index=INDEX, hosts=2, image=False)
    assert second.hosts[0].libvirtd_pid != old.libvirtd_pid
    assert lab.problems(own_lab.state_dir) == []
    out = ssh(second, second.hosts[0], "virsh -c qemu:///system pool-list --name")
    assert out.returncode == 0 and "default" in out.stdout, out.stderr
    assert not any(procs.alive(h.libvirtd_pid) for h in own_lab.hosts)  # the crashed lab's rest is gone too


# The tests below replace the module's lab (same index: this module only ever uses INDEX, so it never
# touches another developer's lab); keep them last.

def test_up_clears_leftovers_of_the_same_index_from_elsewhere(own_lab, tmp_path):
    """A crash can leave a netns and veth with no state dir at all (or a lab at another state dir):
    the index names them, so `up` removes them before building."""
    stray = LabLayout.make(index=INDEX, hosts=4, state_dir=tmp_path / "gone").host(3)
    subprocess.run(["ip", "netns", "add", stray.netns], check=True)
    subprocess.run(["ip", "link", "add", stray.veth_root, "type", "veth", "peer", "name", stray.veth_host,
                    "netns", stray.netns], check=True)
    try:
        info = lab.up(state_dir=tmp_path / "state", index=INDEX, hosts=1, image=False)
        assert lab.problems(info.state_dir) == []
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert stray.netns not in netns
        assert not Path(f"/sys/class/net/{stray.veth_root}").exists()
        assert lab.problems(own_lab.state_dir)  # the other state dir's lab of this index was removed
    finally:
        lab.down(tmp_path / "state")
        subprocess.run(["ip", "netns", "del", stray.netns], capture_output=True)


def test_down_leaves_nothing(own_lab, tmp_path):
    info = lab.up(state_dir=tmp_path / "state", index=INDEX, hosts=2, image=False)
    pids = [p for h in info.hosts for p in (h.libvirtd_pid, h.sshd_pid)]
    lab.down(tmp_path / "state")
    assert_nothing_left(LabLayout.make(index=INDEX, hosts=2, state_dir=tmp_path / "state"), info.hosts, pids)
    lab.down(tmp_path / "state")  # safe to run twice


def assert_nothing_left(layout: LabLayout, hosts, pids=()) -> None:  # type: ignore[no-untyped-def]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    for h in layout.all_hosts:
        assert h.netns not in netns
        assert h.veth_root not in links
        assert h.lan_cidr not in routes
    for h in hosts:
        assert h.ip not in routes
    assert not [p for p in pids if procs.alive(p)]
    assert not layout.state_dir.exists()
    assert not authorized_keys_path(layout).exists()


def test_small_pool_fills_grows_outside_libvirt_and_goes_with_the_lab(own_lab, tmp_path):
    """`up(small_pool_mib=)`: the pool is a tmpfs of that size (a volume too big fails with ENOSPC);
    growing it is a remount that libvirt sees only after a refresh; `up` reuses the lab only with the pool
    size it asks for; `down` leaves nothing."""
    from testbed.lab.pool import set_pool_size

    state = tmp_path / "state"
    info = lab.up(state_dir=state, index=INDEX, hosts=1, image=False, small_pool_mib=64)
    try:
        assert info.hosts[0].pool_mib == 64 and lab.LabInfo.load(state).hosts[0].pool_mib == 64

        def capacity() -> str:
            out = lab.virsh(info, "host0", "pool-info", "default", "--bytes")
            return out.split("Capacity:")[1].split()[0]
        assert capacity() == str(64 * 2**20)
        full = lab.host_run(info, "host0", ["virsh", "-c", "qemu:///system", "vol-create-as", "default",
                                            "big.raw", "100M"], check=False)
        assert full.returncode != 0 and "No space left on device" in full.stderr, full.stderr
        set_pool_size(info, "host0", 256)
        assert capacity() == str(64 * 2**20)  # libvirt has not looked again: space freed outside it
        lab.virsh(info, "host0", "pool-refresh", "default")
        assert capacity() == str(256 * 2**20)
        lab.virsh(info, "host0", "vol-create-as", "default", "big.raw", "100M")
        assert lab.LabInfo.load(state).hosts[0].pool_mib == 256
        pid = info.hosts[0].libvirtd_pid
        assert lab.up(state_dir=state, index=INDEX, hosts=1, image=False,
                      small_pool_mib=256).hosts[0].libvirtd_pid == pid  # reused: the size it asked for
        plain = lab.up(state_dir=state, index=INDEX, hosts=1, image=False)  # another pool: rebuilt
        assert plain.hosts[0].libvirtd_pid != pid and plain.hosts[0].pool_mib == 0
        assert "pool_mib" not in (state / "lab.json").read_text()
        assert int(capacity()) > 256 * 2**20
        small = lab.up(state_dir=state, index=INDEX, hosts=1, image=False, small_pool_mib=64)  # rebuilt
        lab.virsh(small, "host0", "vol-create-as", "default", "kept.raw", "8M")  # down must not need it gone
        # a process holding a pool file open, as a QEMU does its disk: it would keep the tmpfs alive
        lab.host_run(small, "host0", ["sh", "-c", "(exec 3</var/lib/libvirt/images/kept.raw; sleep 600) "
                                      "</dev/null >/dev/null 2>&1 &"])
        mnt_ns = os.stat(f"/proc/{small.hosts[0].libvirtd_pid}/ns/mnt").st_ino  # where the tmpfs lives
        inside = in_mount_namespace(mnt_ns)
        assert len(inside) >= 3, inside  # libvirtd, sshd, the holder (at least)
    finally:
        lab.down(state)
    assert_nothing_left(LabLayout.make(index=INDEX, hosts=1, state_dir=state), small.hosts,
                        [small.hosts[0].libvirtd_pid, small.hosts[0].sshd_pid])
    # the tmpfs goes with its mount namespace, and nothing that was in it is left
    assert not set(inside) & set(in_mount_namespace(mnt_ns)), inside
    assert not [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if str(state) in m]


def in_mount_namespace(inode: int) -> list[int]:
    """The pids whose mount namespace is `inode`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile
                if os.stat(proc / "ns" / "mnt").st_ino == inode:
                    found.append(int(proc.name))
    return found
