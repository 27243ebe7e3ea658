"""bench/fleet.py's arguments: a steady-state window is a whole number of resync periods, since a settled
fleet's passes come in one burst per resync and a fraction of a period would count 0 or 1 bursts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "fleet.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleet_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("window", "resync", "ok"), [
    ("120", "60s", True), ("60", "60s", True), ("600", "5m", True),
    ("20", "60s", False), ("90", "60s", False), ("30", "1m", False),
])
def test_the_steady_window_is_whole_resync_periods(window: str, resync: str, ok: bool,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--steady-window", window, "--resync-period", resync]
    if ok:
        assert load().parse(argv).steady_window == float(window)
    else:
        with pytest.raises(SystemExit):
            load().parse(argv)
        err = capsys.readouterr().err
        assert f"--steady-window {window}: must be a whole number of resync periods" in err
