"""`egress-kvm version`: which build this is (the same version the startup log line and the
`egress_kvm_build_info` metric carry)."""

from __future__ import annotations

import argparse
import json
import platform


def _version(args: argparse.Namespace) -> int:
    from ..metrics import version

    info = {"version": version(), "pythonVersion": platform.python_version(),
            "platform": f"{platform.system().lower()}/{platform.machine()}"}
    if args.output == "json":
        print(json.dumps(info, indent=2))
    else:
        print(f"egress-kvm {info['version']} (python {info['pythonVersion']}, {info['platform']})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("version", help="print the version", description="Print egress-kvm's version.")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")
    p.set_defaults(func=_version)
