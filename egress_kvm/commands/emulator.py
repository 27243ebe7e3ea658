"""`egress-kvm emulator` (not built yet)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("emulator", help="(not built yet)")
    p.set_defaults(func=lambda args: "egress-kvm emulator: not built yet")
