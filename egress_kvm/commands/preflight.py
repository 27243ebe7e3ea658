"""`egress-kvm preflight --providers-config FILE`: check every host before wiring it in.

FILE is a providers file, a ConfigMap manifest holding one (deploy/providers/providers_config.yaml), or
`kubectl get cm -o yaml` output; `-` reads stdin. One line per check (PASS / WARN / FAIL / SKIP and what
to do), or `-o json` for scripts; exit status 0 when nothing failed (warnings included), 1 when a check
failed, 2 when the providers file itself is unusable.
"""

from __future__ import annotations

import argparse
import json
import sys

from egress_kvm.config import ConfigError, ProvidersConfig
from egress_kvm.operator.flags import _positive_int  # the operator's own flags' rule
from egress_kvm.preflight import CheckResult, run_preflight, source
from egress_kvm.preflight.verdicts import Status


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("preflight", help="check SSH, libvirt, pool, bridge, KVM and images of every host",
                       description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--providers-config", required=True, metavar="FILE",
                   help="providers file, ConfigMap manifest or `kubectl get cm -o yaml` output; - for stdin")
    p.add_argument("--provider", metavar="NAME", help="check only this provider's hosts")
    p.add_argument("--ssh-key", metavar="PATH", help="private key to use instead of each sshKeyFile "
                   "(a cluster's file names the in-pod path)")
    p.add_argument("--known-hosts", metavar="PATH", help="known_hosts to use instead of each knownHostsFile")
    p.add_argument("--vms", type=_positive_int, default=1, metavar="N",
                   help="the pool must have room for one base image plus N VM overlays (default 1)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(func=main)


def with_overrides(config: ProvidersConfig, *, ssh_key: str | None,
                   known_hosts: str | None) -> ProvidersConfig:
    """The config with --ssh-key / --known-hosts in place of every kvm provider's paths."""
    update: dict[str, object] = {}
    if ssh_key is not None:
        update["ssh_key_file"] = ssh_key
    if known_hosts is not None:
        update["known_hosts_file"] = known_hosts
    if not update:
        return config
    providers = [p.model_copy(update={"kvm": p.kvm.model_copy(update=update)}) if p.kvm is not None else p
                 for p in config.providers]
    return config.model_copy(update={"providers": providers})


def summary(results: list[CheckResult]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for r in results:
        counts[r.status.value] += 1
    counts["hosts"] = len({(r.provider, r.host) for r in results if r.host is not None})
    return counts


async def main(args: argparse.Namespace) -> int:
    as_json = args.output == "json"

    def emit(r: CheckResult) -> None:
        if not as_json:
            print(r.line(), flush=True)

    def refuse(message: str) -> int:
        if as_json:
            print(json.dumps({"error": message, "results": []}))
        print(f"preflight: {message}", file=sys.stderr)
        return 2

    try:
        config = with_overrides(source.load(args.providers_config), ssh_key=args.ssh_key,
                                known_hosts=args.known_hosts)
        results = await run_preflight(config, provider=args.provider, vms=args.vms, emit=emit)
    except ConfigError as exc:
        return refuse(str(exc))
    if not results:
        return refuse("no kvm providers configured")
    counts = summary(results)
    if as_json:
        print(json.dumps({"results": [r.as_json() for r in results], "summary": counts}, indent=2))
    failed = counts[Status.FAIL.value]
    warned = f", {counts[Status.WARN.value]} warning(s)" if counts[Status.WARN.value] else ""
    if failed:
        print(f"preflight: {failed} check(s) failed on {counts['hosts']} host(s){warned}", file=sys.stderr)
        return 1
    if not as_json:
        print(f"preflight: all {len(results)} checks passed on {counts['hosts']} host(s){warned}")
    return 0
