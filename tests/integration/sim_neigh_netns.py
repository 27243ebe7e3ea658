"""Run by tests/integration/test_sim_neighbours.py inside `unshare --net` (a network namespace of its own,
gone with the process): one SimHost with a bridge as `lab up --simulated` makes it, guests booted and
forgotten, and what the kernel's neighbour table, the process's threads and children showed at each step,
printed as one JSON object (the test asserts on it and on this process's stderr, the simulator's log).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

LAN = "10.99.0.0/24"
DOMAIN_XML = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><devices>
<interface type='bridge'><mac address='{mac}'/><source bridge='br0'/></interface></devices></domain>"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def table() -> list[dict[str, Any]]:
    return list(json.loads(sh("ip", "-d", "-j", "neigh", "show", "dev", "br0") or "[]"))


def workers() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("sim-neigh"))


def children() -> list[str]:
    return [pid for task in Path("/proc/self/task").iterdir()
            for pid in (task / "children").read_text().split()]


async def main() -> dict[str, Any]:
    from testbed.sim.host import make_host
    from testbed.sim.knobs import Knobs

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sim-neigh-") as tmp:
        host = make_host(name="sim0", pool_path=f"{tmp}/pool", knobs=Knobs(boot_delay_s=0.0),
                         socket_path=f"{tmp}/libvirt-sock", guest_network=LAN)
        host.bridge, host.leases = "br0", Path(tmp) / "leases"
        hyp = host.hyp

        async def boot(i: int) -> None:
            dom = hyp.domain_define_xml(DOMAIN_XML.format(name=f"g{i}", mac=f"52:54:00:00:00:{i:02x}"))
            hyp.domain_create_with_flags(dom, 0)
            task = host.guests[f"g{i}"].boot
            assert task is not None
            await task

        async def settle() -> None:
            while host._background:
                await asyncio.gather(*list(host._background))

        for i in (1, 2, 3):
            await boot(i)
        out["booted"] = table()
        out["workers_booted"], out["children_booted"] = workers(), children()
        hyp.domain_destroy_flags(hyp.domain_lookup_by_name("g2"), 0)
        await settle()
        out["after_destroy"] = table()
        host.bridge = "nosuch0"  # the kernel refuses both requests for this guest: each is logged
        await boot(4)
        hyp.domain_destroy_flags(hyp.domain_lookup_by_name("g4"), 0)
        await settle()
        host.bridge = "br0"
        host.kill()  # the daemon's exit: every guest shut off, then close()
        await host.close()
        out["after_close"] = table()
        out["workers_closed"], out["children_closed"] = workers(), children()
    sh("ip", "neigh", "replace", "10.99.0.200", "lladdr", "52:54:00:00:00:c8", "dev", "br0",
       "nud", "permanent")
    out["iproute2"] = table()
    return out


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    for argv in (["link", "set", "lo", "up"], ["link", "add", "br0", "type", "bridge"],
                 ["link", "set", "br0", "up"], ["addr", "add", "10.99.0.1/24", "dev", "br0"],
                 ["route", "add", "local", LAN, "dev", "lo", "table", "local"]):
        sh("ip", *argv)
    print(json.dumps(asyncio.run(main())))
