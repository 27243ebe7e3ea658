"""`egress-kvm preflight --providers-config FILE [--provider NAME]`: check every host before wiring it in.

One line per check (PASS / FAIL / SKIP with a reason); exit status 0 when every check passed, 1 when any
failed, 2 when the providers file itself is unusable.
"""

from __future__ import annotations

import argparse
import sys

from egress_kvm.config import ConfigError, load_providers_file
from egress_kvm.preflight import CheckResult, run_preflight


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preflight", help="check SSH, libvirt, pool and bridge of every configured host",
                       description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--providers-config", required=True, metavar="FILE", help="the providers file (YAML)")
    p.add_argument("--provider", metavar="NAME", help="check only this provider's hosts")
    p.set_defaults(func=main)


async def main(args: argparse.Namespace) -> int:
    def emit(r: CheckResult) -> None:
        print(r.line(), flush=True)

    try:
        config = load_providers_file(args.providers_config)
        results = await run_preflight(config, provider=args.provider, emit=emit)
    except ConfigError as exc:
        print(f"preflight: {exc}", file=sys.stderr)
        return 2
    if not results:
        print("preflight: no kvm providers configured", file=sys.stderr)
        return 2
    failed = [r for r in results if r.ok is False]
    hosts = len({(r.provider, r.host) for r in results})
    if failed:
        print(f"preflight: {len(failed)} check(s) failed on {hosts} host(s)", file=sys.stderr)
        return 1
    print(f"preflight: all {len(results)} checks passed on {hosts} host(s)")
    return 0
