"""The controller stays small enough to read (issue 11's bounds): the reconciler under 350 lines, no
function in egress_kvm/controller/ over 60. New behaviour goes into the planner's rules, not a longer
sequence."""

from __future__ import annotations

import ast
from pathlib import Path

CONTROLLER = Path(__file__).resolve().parents[3] / "egress_kvm" / "controller"


def test_the_reconciler_stays_under_350_lines() -> None:
    assert len((CONTROLLER / "reconciler.py").read_text(encoding="utf-8").splitlines()) < 350


def test_no_controller_function_is_over_60_lines() -> None:
    long = []
    for source in sorted(CONTROLLER.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 60:
                    long.append(f"{source.name}:{node.name} ({lines} lines)")
    assert long == []
