"""bench/fleet.py's arguments: a steady-state window is a whole number of resync periods, since a settled
fleet's passes come in one burst per resync and a fraction of a period would count 0 or 1 bursts; and it
starts once the orphan GC's one-off first reads are over."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from testbed.fleet.stack import StackConfig

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


def test_the_host_knobs_reach_the_simulator_as_its_own_knobs() -> None:
    """--rtt-ms, --start-service-ms and --max-client-requests become knobs the simulator takes."""
    from testbed.sim.knobs import Knobs

    args = load().parse(["--rtt-ms", "50", "--start-service-ms", "500", "--max-client-requests", "20"])
    config = StackConfig(rtt_ms=args.rtt_ms, start_service_ms=args.start_service_ms,
                         max_client_requests=args.max_client_requests, index=9)
    knobs = Knobs()
    knobs.update(config.knobs())
    assert (knobs.rpc_latency_s, knobs.start_service_s, knobs.max_client_requests) == (0.05, 0.5, 20)
    assert load().parse([]).max_client_requests == Knobs().max_client_requests == 5


@pytest.mark.parametrize(("gc_interval", "proxies", "rtt_ms", "start"), [
    ("30s", 1000, 0.0, 35.0),  # the bench's defaults
    ("30s", 1000, 50.0, 85.0),  # GC's first reads of 1,000 domains, one 50 ms round trip each: 50 s
    ("1m30s", 100, 50.0, 100.0),
    ("10s", 100, 0.0, 15.0),  # tests/e2e/test_fleet.py's interval
])
def test_the_steady_window_starts_after_the_gc_pass_that_reads_every_new_domain(
        gc_interval: str, proxies: int, rtt_ms: float, start: float) -> None:
    """GC reads each domain's metadata once, one after another: at 50 ms RTT that pass outlasted a
    fixed 5 s margin and its one-off reads counted as steady state."""
    gc_seconds = StackConfig(gc_interval=gc_interval, index=6).gc_seconds
    assert load().steady_start(gc_seconds=gc_seconds, proxies=proxies, rtt_ms=rtt_ms) == pytest.approx(start)
