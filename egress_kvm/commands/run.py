"""`egress-kvm run`: the operator process (also what a bare `egress-kvm --flags` runs)."""

from __future__ import annotations

import argparse
from collections.abc import Coroutine
from typing import Any

from ..operator.flags import Options, add_flags


def _run(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    from ..operator.process import (
        run,  # keeps `egress-kvm --help` and other commands free of the operator's imports
    )

    return run(Options.from_args(args))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the operator (controller-runtime style flags)",
                       description="Run the egress-kvm operator: watch Proxies and run their VMs.")
    add_flags(p)
    p.set_defaults(func=_run)
