"""A host's pool on a small filesystem: a pool that fills up without filling this machine's disk.

`lab up --small-pool MIB` (every host) and `set_pool_size(info, host, mib)` (one host of a running lab,
at any time) mount a `mib`-MiB tmpfs over the pool directory inside the host's mount namespace, where
libvirtd, QEMU and SSH sessions see it (the pool is refreshed after a mount or unmount). Growing or
shrinking a mounted one is a `remount,size=` and nothing else: space freed outside libvirt, as when a
neighbour deletes a file, so libvirt's figures stay stale until someone refreshes the pool (the operator
does before each space check; the fault campaign and tests/e2e/test_two_clusters.py rely on this).
`mib=None` unmounts it (the volumes on it go with it, so the caller empties the pool first).
The size is recorded in the host dir (`pool-mib`) and in lab.json (`pool_mib`), so `lab up` reuses a lab
only with the size it asks for. `lab down` needs no step of its own: the tmpfs belongs to the host's
mount namespace, which goes with the host's last process.

tmpfs pages are RAM, but only what is written: a pool "of 16 GiB" holding a 240 MiB base and two thin
overlays costs about 300 MiB.
"""

from __future__ import annotations

from pathlib import Path

from testbed.lab import host as host_mod
from testbed.lab.info import LabInfo
from testbed.lab.layout import POOL, POOL_PATH, HostLayout
from testbed.lab.procs import LabError, run, wait_for

MIN_MIB = 16
MAX_MIB = 64 * 1024
SIZE_FILE = "pool-mib"


def check_mib(mib: int) -> int:
    if not isinstance(mib, int) or isinstance(mib, bool) or not MIN_MIB <= mib <= MAX_MIB:
        raise ValueError(f"small pool: {mib!r} MiB is not an integer in {MIN_MIB}..{MAX_MIB}")
    return mib


def recorded_mib(host: HostLayout) -> int | None:
    """The size this host's pool was given (None: the pool is the state dir's plain directory)."""
    try:
        return int((host.dir / SIZE_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _mounted(host: HostLayout) -> bool:
    out = run(host_mod.host_argv(host, ["findmnt", "-n", "-o", "FSTYPE", "--mountpoint", POOL_PATH]),
              check=False)
    return out.returncode == 0 and out.stdout.strip() == "tmpfs"


def apply(host: HostLayout, mib: int | None) -> None:
    """Give the host's pool a `mib`-MiB tmpfs (or resize the one it has); None takes it away."""
    if host.simulated:
        raise ValueError("small pool: a simulated host has no pool filesystem; use the knob "
                         "pool_capacity_bytes (--knobs)")
    if mib is not None:
        check_mib(mib)
    mounted = _mounted(host)
    if mib is None:
        if mounted:
            # a QEMU just destroyed may hold its disk open a moment longer: "target is busy" until then
            def unmounted() -> bool:
                umount = run(host_mod.host_argv(host, ["umount", POOL_PATH]), check=False)
                return umount.returncode == 0 or not _mounted(host)
            wait_for(unmounted, timeout=30, interval=0.5, what=f"{host.name}: small pool unmounted")
            run(host_mod.virsh_argv(host, "pool-refresh", POOL))
    elif mounted:
        # no refresh: space freed outside libvirt, which keeps its old figures until someone refreshes
        run(host_mod.host_argv(host, ["mount", "-o", f"remount,size={mib}m", POOL_PATH]))
    else:
        left = run(host_mod.host_argv(host, ["ls", "-A", POOL_PATH])).stdout.split()
        if left:
            raise LabError(f"{host.name}: small pool: the pool holds {len(left)} volume(s) "
                           f"({', '.join(sorted(left)[:3])}...) a tmpfs would hide; empty it first")
        run(host_mod.host_argv(host, ["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0711", "tmpfs",
                                      POOL_PATH]))
        run(host_mod.virsh_argv(host, "pool-refresh", POOL))
    size_file = host.dir / SIZE_FILE
    if mib is None:
        size_file.unlink(missing_ok=True)
    else:
        size_file.write_text(f"{mib}\n")


def set_pool_size(info: LabInfo, host_name: str, mib: int | None) -> None:
    """`apply` on one host of a running lab, and lab.json updated to say so."""
    from testbed.lab.lifecycle import _host_layout

    apply(_host_layout(info, host_name), mib)
    info.host(host_name).pool_mib = mib or 0
    info.save(Path(info.state_dir) / "lab.json")
