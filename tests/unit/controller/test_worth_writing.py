"""compose.worth_writing as a table: a status write only when something changed, a newer lastProbeTime
alone only once the stored one is a refresh period old."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from egress_kvm.controller.compose import worth_writing

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def st(probe: str | None = "2026-12-01T11:59:00Z", **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"phase": "Ready", "message": "healthy", "healthy": True, **kw}
    if probe is not None:
        base["lastProbeTime"] = probe
    return base


CASES = [
    ("identical", st(), st(), 300, False),
    ("only a newer probe time, stored one 60 s old", st(), st("2026-12-01T11:59:55Z"), 300, False),
    ("only a newer probe time, stored one a period old", st("2026-12-01T11:55:00Z"),
     st("2026-12-01T11:59:55Z"), 300, True),
    ("refresh 0 (the Context default): any change", st(), st("2026-12-01T11:59:55Z"), 0, True),
    ("refresh inf (the operator's default): never alone", st("2026-01-01T00:00:00Z"),
     st("2026-12-01T11:59:55Z"), math.inf, False),
    ("refresh inf, the phase changed", st(), st("2026-12-01T11:59:55Z", phase="Running"), math.inf, True),
    ("the phase changed", st(), st(phase="Running"), 300, True),
    ("the message changed, probe time too", st(), st("2026-12-01T11:59:55Z", message="x"), 300, True),
    ("probing stopped", st(), st(None), 300, True),
    ("probing started", st(None), st(), 300, True),
    ("stored probe time unreadable", st("yesterday"), st(), 300, True),
]


@pytest.mark.parametrize(("case", "old", "new", "refresh", "write"), CASES, ids=[c[0] for c in CASES])
def test_worth_writing(case: str, old: dict[str, Any], new: dict[str, Any], refresh: float,
                       write: bool) -> None:
    assert worth_writing(old, new, now=NOW, refresh=refresh) is write
