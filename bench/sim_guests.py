"""Benchmark: a simulated host's CPU per guest booted and forgotten (testbed/sim/host.py), in-process.

    .venv/bin/python bench/sim_guests.py [--guests 200] [--rounds 3] [--tree PATH]

What the fleet benchmark's simulators spend per Proxy apart from the RPCs: a guest's boot (its seed ISO
read, its address, its proxy listening, its lease line and kernel neighbour entry) and its forget (the
neighbour entry deleted, the address freed), then the domain's volumes deleted. It runs as root in a
private network namespace of its own (`unshare --net`, made here and gone with the process): a bridge
`br0` with the guest LAN made local, as `lab up --simulated` makes a host's. Each round starts N defined
domains at once (boot delay 0), waits for every boot, checks the kernel's table holds N permanent
entries, destroys them all, waits for every forget, checks the table is empty, then deletes the volumes.
CPU is the process's user+system time, its children's included (getrusage), per phase.

`--tree PATH` imports testbed/ from another checkout (e.g. a `git worktree add --detach` of main), to
compare; run it alternately with this tree's, as other work on the machine makes the numbers noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LAN = "10.99.0.0/24"
NETNS_ENV = "SIM_GUESTS_IN_NETNS"
USER_DATA = (b"#cloud-config\nwrite_files:\n- path: /etc/tinyproxy/tinyproxy.conf\n"
             b"  content: |\n    Port 3128\n")
DOMAIN_XML = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><devices>
<disk type='volume' device='disk'><source pool='default' volume='{name}.qcow2'/></disk>
<disk type='volume' device='cdrom'><driver name='qemu' type='raw'/>
<source pool='default' volume='{name}-seed.iso'/><target dev='sda' bus='sata'/></disk>
<interface type='bridge'><mac address='{mac}'/><source bridge='br0'/></interface></devices></domain>"""


def cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def permanent_entries() -> int:
    return sum(1 for e in json.loads(sh("ip", "-j", "neigh", "show", "dev", "br0") or "[]")
               if "PERMANENT" in e.get("state", []))


async def one_round(host: Any, names: list[str]) -> dict[str, float]:
    hyp = host.hyp
    handles = [hyp.domain_lookup_by_name(n) for n in names]
    t0, c0 = time.perf_counter(), cpu()
    for h in handles:
        hyp.domain_create_with_flags(h, 0)
    await asyncio.gather(*(g.boot for g in host.guests.values() if g.boot is not None))
    c1 = cpu()
    booted = permanent_entries()
    assert booted == len(names), f"{booted} permanent neighbour entries after {len(names)} boots"
    c2 = cpu()
    for h in handles:
        hyp.domain_destroy_flags(h, 0)
    while host._background:
        await asyncio.gather(*list(host._background))
    c3, t3 = cpu(), time.perf_counter()
    left = permanent_entries()
    assert left == 0, f"{left} permanent neighbour entries left after every forget"
    return {"boot_ms": (c1 - c0) * 1000 / len(names), "forget_ms": (c3 - c2) * 1000 / len(names),
            "wall_s": t3 - t0}


async def run(args: argparse.Namespace) -> None:
    from egress_kvm.providers.kvm.seed import build_seed_iso
    from testbed.sim.host import make_host
    from testbed.sim.knobs import Knobs
    from testbed.sim.model import Upload

    with tempfile.TemporaryDirectory(prefix="sim-guests-") as tmp:
        host = make_host(name="bench0", pool_path=f"{tmp}/pool", knobs=Knobs(boot_delay_s=0.0),
                         socket_path=f"{tmp}/libvirt-sock", guest_network=LAN)
        host.bridge, host.leases = "br0", Path(tmp) / "leases"
        pool = host.hyp.storage_pool_lookup_by_name("default")
        names = [f"g{i:04d}" for i in range(args.guests)]
        for i, name in enumerate(names):
            host.hyp.storage_vol_create_xml(pool, f"<volume><name>{name}.qcow2</name><capacity>1</capacity>"
                                                  f"</volume>", 0)
            seed = host.hyp.storage_vol_create_xml(pool, f"<volume><name>{name}-seed.iso</name>"
                                                         f"<capacity>1</capacity></volume>", 0)
            up = Upload(host.hyp, host.hyp.volume(seed), 0)
            up.write(build_seed_iso(name=name, user_data=USER_DATA, vendor_data="#cloud-config\n{}\n"))
            up.end()
            host.hyp.domain_define_xml(DOMAIN_XML.format(name=name, mac=f"52:54:00:77:{i // 256:02x}:"
                                                                        f"{i % 256:02x}"))
        rounds = [await one_round(host, names) for _ in range(args.rounds)]
        c0 = cpu()
        for name in names:
            host.hyp.domain_undefine_flags(host.hyp.domain_lookup_by_name(name), 0)
            for vol in (f"{name}.qcow2", f"{name}-seed.iso"):
                host.hyp.storage_vol_delete(host.hyp.vol_handle(host.hyp.volumes[vol]), 0)
        undefine_ms = (cpu() - c0) * 1000 / len(names)
        close = getattr(host, "close", None)
        if close is not None:
            await close()
    tree = args.tree or str(ROOT)
    print(f"tree {tree}: {args.guests} guests x {args.rounds} rounds (CPU ms per guest, best / median)")
    for key in ("boot_ms", "forget_ms"):
        values = [r[key] for r in rounds]
        print(f"  {key:10s} {min(values):7.3f} / {statistics.median(values):7.3f}")
    print(f"  {'undefine+2 vol deletes':10s} {undefine_ms:7.3f}")
    walls = " ".join(f"{r['wall_s']:.2f}" for r in rounds)
    print(f"  wall per round, s: {walls}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--guests", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tree", help="import testbed/ from this checkout instead of this one")
    args = p.parse_args()
    if os.environ.get(NETNS_ENV) != "1":  # a private network namespace, gone when this process ends
        env = {**os.environ, NETNS_ENV: "1"}
        sys.exit(subprocess.run(["unshare", "--net", sys.executable, *sys.argv], env=env).returncode)
    sys.path.insert(0, args.tree or str(ROOT))
    for argv in (["link", "set", "lo", "up"], ["link", "add", "br0", "type", "bridge"],
                 ["link", "set", "br0", "up"], ["addr", "add", "10.99.0.1/24", "dev", "br0"],
                 ["route", "add", "local", LAN, "dev", "lo", "table", "local"]):
        sh("ip", *argv)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
