"""`egress-kvm` command line: one subcommand per module under egress_kvm/commands/.

Each command module exposes `register(subparsers)` (adds its parser and sets `func`), so a new command
is a new file and this dispatcher never grows logic of its own. A bare `egress-kvm` (no subcommand)
runs the operator, as the manager Deployment invokes it with controller-runtime-style flags only.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from collections.abc import Sequence

from egress_kvm import eventloop

COMMANDS = ("run", "preflight", "lab", "emulator")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="egress-kvm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"egress_kvm.commands.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (args_list[0].startswith("-") and args_list[0] not in ("-h", "--help")):
        args_list.insert(0, "run")
    parser = build_parser()
    args = parser.parse_args(args_list)
    result = args.func(args)
    if inspect.iscoroutine(result):
        try:
            loop = eventloop.choose(os.environ)
        except ValueError as e:
            result.close()
            parser.error(str(e))
        result = eventloop.run(result, loop)
    raise SystemExit(int(result or 0))


if __name__ == "__main__":
    main()
