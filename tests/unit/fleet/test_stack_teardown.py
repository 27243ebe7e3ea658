"""FleetStack.teardown: a process that fails to stop must not leave the others running or the simulated
lab (its network namespaces, sshd, simulators) up."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from testbed import lab as labmod
from testbed.fleet.stack import FleetStack, StackConfig


class FakeProcess:
    def __init__(self, log: list[str], name: str, *, fails: bool = False) -> None:
        self.log, self.name, self.fails = log, name, fails

    def stop(self) -> int:
        self.log.append(f"stop {self.name}")
        if self.fails:
            raise TimeoutError(f"{self.name} did not exit")
        return 0


def test_teardown_stops_every_process_and_removes_the_lab_even_when_one_stop_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    monkeypatch.setattr(labmod, "down", lambda state_dir: log.append(f"down {state_dir}"))
    s = FleetStack(tmp_path, StackConfig(index=6))
    s.lab = SimpleNamespace(state_dir="/run/lab6")  # type: ignore[assignment]
    stuck = FakeProcess(log, "operator-1", fails=True)
    ops: list[Any] = [stuck, FakeProcess(log, "operator-2")]
    s.operators = ops
    s.emulator = FakeProcess(log, "emulator")  # type: ignore[assignment]
    with pytest.raises(TimeoutError, match="operator-1"):
        s.teardown()
    assert log == ["stop operator-1", "stop operator-2", "stop emulator", "down /run/lab6"]
    log.clear()
    stuck.fails = False
    s.teardown(keep_lab=True)
    assert log == ["stop operator-1", "stop operator-2", "stop emulator"]
