"""`python -m testbed.sim ...`: one simulated host's daemon (the lab starts it where libvirtd would run)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import grp
import json
import os
import signal
import sys
from pathlib import Path

from .host import make_host
from .knobs import Knobs


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m testbed.sim", description=__doc__)
    p.add_argument("--name", required=True, help="the host's name (its hostname to clients)")
    p.add_argument("--socket", required=True, help="where libvirtd's unix socket would be")
    p.add_argument("--control", required=True, help="the control socket (JSON lines, testbed/sim/control.py)")
    p.add_argument("--pool-path", required=True, help="the pool directory (volumes are files there)")
    p.add_argument("--guest-network", help="CIDR the guests take addresses from (.1 is skipped)")
    p.add_argument("--knobs", help="a JSON file of initial knobs (testbed/sim/knobs.py)")
    p.add_argument("--socket-group", default="libvirt", help="group owning the socket (default libvirt)")
    p.add_argument("--pidfile", help="write the daemon's pid here once it listens")
    p.add_argument("--leases", help="a dnsmasq lease file to record each booted guest's address in")
    p.add_argument("--bridge", help="the bridge whose kernel neighbour table learns each guest's address")
    return p.parse_args(argv)


async def _main(args: argparse.Namespace, knobs: Knobs) -> int:
    try:
        group: int | None = grp.getgrnam(args.socket_group).gr_gid
    except KeyError:
        group = None
    host = make_host(name=args.name, pool_path=args.pool_path, knobs=knobs, socket_path=args.socket,
                     guest_network=args.guest_network, socket_group=group)
    host.leases = Path(args.leases) if args.leases else None
    host.bridge = args.bridge
    await host.listen()
    control = await host.serve_control(args.control)
    if args.pidfile:
        with open(args.pidfile, "w") as f:  # noqa: ASYNC230  (once, at start)
            f.write(f"{os.getpid()}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    control.close()
    host.kill()
    await host.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.control)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    knobs = Knobs()
    if args.knobs:
        knobs.update(json.loads(Path(args.knobs).read_text()))
    return asyncio.run(_main(args, knobs))


if __name__ == "__main__":
    sys.exit(main())
