"""`egress-kvm lab` (not built yet)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lab", help="(not built yet)")
    p.set_defaults(func=lambda args: "egress-kvm lab: not built yet")
