"""`lab up`, `lab down`, `lab status`: the whole lab's life, and commands run on its hosts.

`up` is idempotent: a healthy lab at the state dir is reused (and given the image if it lacked one);
anything else with the same index (a crashed lab, a lab at another state dir) is cleaned away first,
because the index alone names the machine-global pieces (netns, veth, subnets). `down` works from
layout.json, written before anything is created, so it can clean up after a crash at any point.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from egress_kvm.log import get_logger
from testbed.lab import host as host_mod
from testbed.lab import keys, manifests, web
from testbed.lab import pool as pool_mod
from testbed.lab.info import HostInfo, ImageInfo, LabInfo
from testbed.lab.layout import (
    BRIDGE,
    POOL,
    POOL_PATH,
    SOCKET,
    SSH_PORT,
    SSH_USER,
    STATE_ROOT,
    LabLayout,
    check_index,
    default_state_dir,
)
from testbed.lab.procs import LabError, alive, in_netns, netns_inode, read_pid, run
from testbed.lab.procs import state as process_state

log = get_logger("lab")

# what `down` deletes from a state dir: only what `up` creates, never a user's other files
_STATE_FILES = ("lab.json", "lab.tmp", "layout.json", "id_ed25519", "id_ed25519.pub", "known_hosts",
                "providers.yaml", "user-data.yaml")
_STATE_DIRS = ("manifests", "image")


def unavailable_reason() -> str | None:
    """Why no lab can run on this machine (None when one can): tests skip with this reason."""
    if os.geteuid() != 0:
        return "the hypervisor lab needs root (network namespaces, sshd, libvirtd)"
    if shutil.which("ip") is None or run(["ip", "netns", "list"], check=False).returncode != 0:
        return "the hypervisor lab needs `ip netns` (iproute2)"
    for tool in ("libvirtd", "virtlogd", "virsh", "sshd", "dnsmasq", "nsenter", "unshare", "ssh-keygen"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"the hypervisor lab needs {tool} (run scripts/setup)"
    return None


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, sshd, libvirtd)")
    if shutil.which("ip") is None:
        raise LabError("`ip` (iproute2) is not installed (run scripts/setup)")


_held: dict[str, int] = {}  # index -> nesting depth in this process (up() calls down())


@contextlib.contextmanager
def _index_lock(index: int, *, simulated: bool = False) -> Iterator[None]:
    """One `up`/`down` per lab index at a time on this machine: two sessions racing on the same index
    would otherwise interleave creating and deleting the same namespaces. A simulated lab's names differ
    from the real one's, so it has its own lock."""
    key = f"{index}{'-sim' if simulated else ''}"
    if _held.get(key):
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    with (STATE_ROOT / f".lab{key}.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _held[key] = 1
        try:
            yield
        finally:
            _held[key] = 0


def _layout_from_state(state_dir: Path) -> LabLayout | None:
    for name in ("layout.json", "lab.json"):
        try:
            data = json.loads((state_dir / name).read_text())
        except (OSError, ValueError):
            continue
        hosts = data.get("hosts", 1)
        return LabLayout.make(index=data["index"], hosts=len(hosts) if isinstance(hosts, list) else hosts,
                              state_dir=state_dir, simulated=bool(data.get("simulated", False)),
                              dhcp=bool(data.get("dhcp", True)))
    return None


def problems(state_dir: Path | str) -> list[str]:
    """Why the lab at state_dir is not up and healthy; empty when it is."""
    state = Path(state_dir)
    try:
        info = LabInfo.load(state)
    except (OSError, ValueError, KeyError, TypeError):
        return [f"no lab at {state} (no readable lab.json)"]
    lab = LabLayout.make(index=info.index, hosts=len(info.hosts), state_dir=state, simulated=info.simulated,
                         dhcp=info.dhcp)
    found = []
    for h in lab.all_hosts:
        found += host_mod.host_problems(h)
    if info.image is not None:
        host0 = lab.host(0)
        if not _alive_in(host0, web.IMAGE_SERVER):
            found.append("host0: image server not running")
        elif process_state(read_pid(host0.pidfile(web.IMAGE_SERVER)) or 0) == "T":
            # a test that slowed it (faults.image_server_slowed) died before running it again: every
            # import would hang on it
            found.append("host0: image server stopped (SIGSTOP)")
    return found


def _alive_in(host: host_mod.HostLayout, name: str) -> bool:
    inode = netns_inode(host.netns)
    pid = read_pid(host.pidfile(name))
    return inode is not None and pid is not None and alive(pid) and in_netns(pid, inode)


def _clean_index(lab: LabLayout) -> None:
    """Leftovers of any lab with this index, wherever its state dir was (names derive from the index)."""
    for h in lab.every_possible_host:
        veth = Path(f"/sys/class/net/{h.veth_root}").exists()
        if netns_inode(h.netns) is not None or veth:
            log.info("cleaning leftovers", host=h.name, netns=h.netns)
            host_mod.host_down(h)


def down(state_dir: Path | str | None = None, *, index: int | None = None, simulated: bool = False) -> None:
    """Remove everything the lab at state_dir made: VMs, volumes, processes (by PID), veths, netns, files."""
    _require_root()
    state = Path(state_dir) if state_dir is not None else default_state_dir(index or 0, simulated=simulated)
    state = state.absolute()
    lab = _layout_from_state(state)
    if lab is None and index is not None:
        lab = LabLayout.make(index=index, hosts=1, state_dir=state, simulated=simulated)
    if lab is None:
        _remove_state(state)
        return
    with _index_lock(lab.index, simulated=lab.simulated):
        for h in lab.every_possible_host:
            if h.dir.exists() or netns_inode(h.netns) is not None:
                host_mod.host_down(h)
        host_mod.authorized_keys_path(lab).unlink(missing_ok=True)
        _remove_state(state)


def _remove_state(state: Path) -> None:
    if state.is_dir():
        for child in state.iterdir():
            if child.is_dir() and (child.name.startswith("host") or child.name in _STATE_DIRS):
                shutil.rmtree(child)
            elif child.name in _STATE_FILES:
                child.unlink()
        if not any(state.iterdir()):
            state.rmdir()


def up(state_dir: Path | str | None = None, index: int = 0, hosts: int = 1, image: bool = True, *,
       simulated: bool = False, knobs: dict[str, Any] | None = None, small_pool_mib: int | None = None,
       dhcp: bool = True) -> LabInfo:
    """Bring the lab up (or reuse a healthy one) and return what lab.json says. `simulated`: testbed/sim's
    daemon on each host instead of libvirtd, started with `knobs` (testbed/sim/knobs.py).
    `small_pool_mib`: every host's pool on a tmpfs of that size (testbed/lab/pool.py). `dhcp=False`:
    no DHCP server on the hosts' bridges; the providers file gives each host `staticAddresses`."""
    _require_root()
    lab = LabLayout.make(index=check_index(index), hosts=hosts, state_dir=state_dir, simulated=simulated,
                         dhcp=dhcp)
    if knobs:
        from testbed.sim.knobs import Knobs

        Knobs().update(knobs)  # a wrong name or value fails here, before anything is made
    if small_pool_mib is not None:
        if simulated:
            raise ValueError("small pool: a simulated host has no pool filesystem; use the knob "
                             "pool_capacity_bytes (--knobs)")
        pool_mod.check_mib(small_pool_mib)
    with _index_lock(lab.index, simulated=simulated):
        return _up_locked(lab, image=image, knobs=knobs, small_pool_mib=small_pool_mib)


def _up_locked(lab: LabLayout, *, image: bool, knobs: dict[str, Any] | None = None,
               small_pool_mib: int | None = None) -> LabInfo:
    index, hosts = lab.index, lab.hosts
    if not problems(lab.state_dir):
        info = LabInfo.load(lab.state_dir)
        same_pools = all(pool_mod.recorded_mib(h) == small_pool_mib for h in lab.all_hosts)
        if (info.index == index and len(info.hosts) == hosts and info.simulated == lab.simulated
                and same_pools and info.dhcp == lab.dhcp):
            if knobs:
                from testbed.sim.control import SimControl

                for h in info.hosts:
                    SimControl(h.sim_control).set(**knobs)
            if image and info.image is None:
                log.info("adding the test image to a running lab", state_dir=str(lab.state_dir))
                info = _finish(lab, image=True)
            else:
                log.info("lab already up, reusing it", state_dir=str(lab.state_dir))
            return info
    down(lab.state_dir)
    _clean_index(lab)
    lab.state_dir.mkdir(parents=True, exist_ok=True)
    lab.layout_json.write_text(json.dumps({"index": lab.index, "hosts": lab.hosts,
                                           "simulated": lab.simulated, "dhcp": lab.dhcp}) + "\n")
    try:
        public_key = keys.ensure_client_key(lab)
        host_mod.install_authorized_key(lab, public_key)
        for h in lab.all_hosts:
            log.info("bringing host up", host=h.name, netns=h.netns, ip=h.ip, lan=h.lan_cidr,
                     simulated=lab.simulated)
            if knobs:
                h.dir.mkdir(parents=True, exist_ok=True)
                h.sim_knobs.write_text(json.dumps(knobs) + "\n")
            host_mod.host_up(lab, h)
            if small_pool_mib is not None:
                pool_mod.apply(h, small_pool_mib)
            web.serve_target(h, index=lab.index)
        keys.write_known_hosts(lab)
        return _finish(lab, image=image)
    except BaseException:
        log.info("lab up failed; removing what it made", state_dir=str(lab.state_dir))
        down(lab.state_dir)
        raise


def _finish(lab: LabLayout, *, image: bool) -> LabInfo:
    """Image (optional), providers file, manifests, lab.json: the parts that depend on the image."""
    image_info: dict[str, Any] | None = None
    if image:
        from testbed.lab import image as image_mod

        image_info = image_mod.serve_image(lab)
    targets = {h.name: web.target_url(h) for h in lab.all_hosts}
    paths = manifests.write_all(lab, image=image_info, targets=targets)
    host0 = lab.host(0)
    info = LabInfo(
        index=lab.index,
        state_dir=str(lab.state_dir),
        ssh_key=str(lab.ssh_key),
        known_hosts=str(lab.known_hosts),
        providers_file=str(lab.providers_file),
        image=ImageInfo(**image_info) if image_info else None,
        http_target=web.target_url(host0),
        http_target_body=web.target_body(index=lab.index, host=host0.name),
        hosts=[_host_info(h) for h in lab.all_hosts],
        proxy_manifests=paths,
        user_data_file=str(lab.user_data_file),
        simulated=lab.simulated,
        dhcp=lab.dhcp,
    )
    info.save(lab.lab_json)
    return info


def _host_info(h: host_mod.HostLayout) -> HostInfo:
    return HostInfo(
        name=h.name, ip=h.ip, port=SSH_PORT, address=f"{h.ip}:{SSH_PORT}", user=SSH_USER, netns=h.netns,
        bridge=BRIDGE, pool=POOL, pool_path=POOL_PATH, lan_cidr=h.lan_cidr, gateway=h.gateway,
        socket=SOCKET, domain_type=manifests.domain_type(),
        libvirtd_pid=read_pid(h.pidfile(h.hypervisor)) or 0, sshd_pid=read_pid(h.pidfile("sshd")) or 0,
        dnsmasq_leases=str(h.leases), pool_dir=str(h.pool_dir), http_target=web.target_url(h),
        sim_control=str(h.sim_control) if h.simulated else "",
        pool_mib=pool_mod.recorded_mib(h) or 0,
    )


def _host_layout(info: LabInfo, host_name: str) -> host_mod.HostLayout:
    lab = LabLayout.make(index=info.index, hosts=len(info.hosts), state_dir=info.state_dir,
                         simulated=info.simulated, dhcp=info.dhcp)
    for h in lab.all_hosts:
        if h.name == host_name:
            return h
    raise LabError(f"lab {info.index} has no host {host_name!r} (hosts: {[h.name for h in info.hosts]})")


def host_run(info: LabInfo, host_name: str, argv: list[str], check: bool = True, *, timeout: float = 600,
             ) -> subprocess.CompletedProcess[str]:
    """Run argv "on the hypervisor host": inside its mount + network namespace (LabError if check fails)."""
    return run(host_mod.host_argv(_host_layout(info, host_name), list(argv)), check=check, timeout=timeout)


def virsh(info: LabInfo, host_name: str, *args: str, timeout: float = 600) -> str:
    """`virsh -c qemu:///system ARGS` on the host; its stdout (raises LabError on failure)."""
    return run(host_mod.virsh_argv(_host_layout(info, host_name), *args), timeout=timeout).stdout
