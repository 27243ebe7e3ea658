"""egress-kvm: the operator (`run`), host checks (`preflight`), and the test bed (`lab`, `emulator`).

One subcommand per module, each exposing `register(subparsers)`: a new command is a new file and this
dispatcher never grows logic of its own. A bare `egress-kvm` (no subcommand) runs the operator, as the
manager Deployment invokes it with controller-runtime-style flags only. Only the chosen command's
module is imported, so `egress-kvm run` never loads the test bed, which lives in the `testbed` package
and is not in the operator image.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Sequence

from egress_kvm import eventloop

OPERATOR_COMMANDS = {"run": "egress_kvm.commands.run", "preflight": "egress_kvm.commands.preflight",
                     "version": "egress_kvm.commands.version"}
TESTBED_COMMANDS = {"lab": "testbed.commands.lab", "emulator": "testbed.commands.emulator"}
COMMANDS = (*OPERATOR_COMMANDS, *TESTBED_COMMANDS)


def _testbed_installed() -> bool:
    return importlib.util.find_spec("testbed") is not None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser for every available command, or for `only` alone (what `main` runs)."""
    parser = argparse.ArgumentParser(prog="egress-kvm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = dict(OPERATOR_COMMANDS)
    if _testbed_installed():
        modules.update(TESTBED_COMMANDS)
    for name, module_name in modules.items():
        if only is None or name == only:
            importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "--version":  # as `egress-kvm version`
        args_list[0] = "version"
    if not args_list or (args_list[0].startswith("-") and args_list[0] not in ("-h", "--help")):
        args_list.insert(0, "run")
    chosen = args_list[0]
    if chosen in TESTBED_COMMANDS and not _testbed_installed():
        print(f"egress-kvm {chosen}: the test bed is not installed here (the operator image holds only "
              "the operator); run it from a development checkout (./scripts/setup)", file=sys.stderr)
        raise SystemExit(2)
    parser = build_parser(chosen if chosen in COMMANDS else None)
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
