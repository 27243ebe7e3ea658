"""`egress-kvm lab up|down|status`: a real hypervisor lab on this machine (see docs/lab.md)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from testbed.lab.layout import MAX_HOSTS, MAX_INDEX, MAX_SIM_HOSTS, default_state_dir


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir) if args.state_dir else default_state_dir(args.index, simulated=args.simulated)


def _up(args: argparse.Namespace) -> int:
    from testbed import lab

    knobs = None
    if args.knobs:
        try:
            knobs = json.loads(args.knobs)
        except ValueError as e:
            raise ValueError(f"--knobs: not a JSON object: {e}") from None
        if not isinstance(knobs, dict):
            raise ValueError("--knobs: not a JSON object")
        if not args.simulated:
            raise ValueError("--knobs: only a --simulated lab has knobs")
    if args.small_pool is not None and args.simulated:
        raise ValueError("--small-pool: a simulated host has no pool filesystem; use --knobs "
                         "'{\"pool_capacity_bytes\": N}'")
    info = lab.up(state_dir=_state_dir(args), index=args.index, hosts=args.hosts, image=not args.no_image,
                  simulated=args.simulated, knobs=knobs, small_pool_mib=args.small_pool,
                  dhcp=not args.no_dhcp)
    print(Path(info.state_dir) / "lab.json")
    return 0


def _pool(args: argparse.Namespace) -> int:
    from testbed import lab
    from testbed.lab.pool import set_pool_size

    state = _state_dir(args)
    found = lab.problems(state)
    if found:
        raise ValueError(f"the lab at {state} is not up: {found[0]}")
    info = lab.LabInfo.load(state)
    info.host(args.host)  # KeyError naming the hosts there is
    set_pool_size(info, args.host, None if args.size == "none" else _mib("--size", args.size))
    return 0


def _down(args: argparse.Namespace) -> int:
    from testbed import lab

    lab.down(_state_dir(args), index=args.index, simulated=args.simulated)
    return 0


def _status(args: argparse.Namespace) -> int:
    from testbed import lab

    state = _state_dir(args)
    found = lab.problems(state)
    if found:
        for p in found:
            print(f"not up: {p}", file=sys.stderr)
        return 1
    info = lab.LabInfo.load(state)
    print(json.dumps(info.to_dict(), indent=2))
    return 0


def _index(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--index: {value!r} is not an integer") from None
    if not 0 <= n <= MAX_INDEX:
        raise argparse.ArgumentTypeError(f"--index: {n} is not in 0..{MAX_INDEX}")
    return n


def _hosts(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hosts: {value!r} is not an integer") from None
    if not 1 <= n <= MAX_SIM_HOSTS:
        raise argparse.ArgumentTypeError(
            f"--hosts: {n} is not in 1..{MAX_HOSTS} (1..{MAX_SIM_HOSTS} simulated)")
    return n


def _mib(flag: str, value: str) -> int:
    from testbed.lab.pool import MAX_MIB, MIN_MIB

    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag}: {value!r} is not an integer (MiB)") from None
    if not MIN_MIB <= n <= MAX_MIB:
        raise argparse.ArgumentTypeError(f"{flag}: {n} MiB is not in {MIN_MIB}..{MAX_MIB}")
    return n


def _size(value: str) -> str:
    if value != "none":
        _mib("--size", value)
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", help="lab state dir (default /var/tmp/egress-kvm-lab/lab<INDEX>)")
    p.add_argument("--index", type=_index, default=0,
                   help=f"lab number 0..{MAX_INDEX}: keeps labs apart (names, subnets derive from it)")
    p.add_argument("--simulated", action="store_true",
                   help="simulated hosts (testbed/sim) instead of libvirtd: a lab beside the real one")


def _run(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Lab failures end as one line naming the step, exit 1 (not a traceback)."""
    def wrapper(args: argparse.Namespace) -> int:
        from egress_kvm.log import configure
        from testbed.lab import LabError

        configure("info")
        try:
            return func(args)
        except (LabError, ValueError, KeyError, argparse.ArgumentTypeError) as e:
            print(f"egress-kvm lab {args.lab_command}: {e}", file=sys.stderr)
            return 1
    return wrapper


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lab", help="a real libvirt hypervisor lab on this machine (root)",
                       description=__doc__)
    cmds = p.add_subparsers(dest="lab_command", metavar="up|down|status|pool", required=True)
    up = cmds.add_parser("up", help="bring the lab up (reuses a healthy one; cleans a crashed one first)")
    _common(up)
    up.add_argument("--hosts", type=_hosts, default=1, help="number of hypervisor hosts (default 1)")
    up.add_argument("--no-image", action="store_true", help="skip building and serving the test image")
    up.add_argument("--no-dhcp", action="store_true",
                    help="no DHCP on the hosts' bridges: the providers file gives each host staticAddresses "
                    "(its VM LAN's .100-.199) and the operator allocates the VMs' addresses")
    up.add_argument("--knobs", help='simulated hosts\' knobs as JSON, e.g. \'{"boot_delay_s": 5}\' '
                    "(testbed/sim/knobs.py; a running lab gets them at once)")
    up.add_argument("--small-pool", type=lambda v: _mib("--small-pool", v), metavar="MIB",
                    help="every host's pool on a tmpfs of MIB MiB (a pool that fills up; not --simulated)")
    up.set_defaults(func=_run(_up))
    down = cmds.add_parser("down", help="remove everything the lab made")
    _common(down)
    down.set_defaults(func=_run(_down))
    status = cmds.add_parser("status", help="print lab.json if the lab is up and healthy, else why not")
    _common(status)
    status.set_defaults(func=_run(_status))
    pool = cmds.add_parser("pool", help="resize one host's small pool (tmpfs), give it one, or take it away")
    _common(pool)
    pool.add_argument("--host", default="host0", help="the host (default host0)")
    pool.add_argument("--size", type=_size, required=True, metavar="MIB|none",
                      help="the tmpfs size in MiB (grow or shrink it, or mount one on an empty pool), "
                           "or none to unmount it")
    pool.set_defaults(func=_run(_pool))
