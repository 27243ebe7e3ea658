"""faults.ImageServer: a process SIGSTOPped most of the time, then held stopped, then running again (on a
plain child process; the fault campaign uses it on the lab's image server)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.lab.faults import ImageServer

pytestmark = pytest.mark.timeout(30)


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_slowed_then_held_then_running_again() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        server = ImageServer(child.pid, running_share=0.3, period=0.05)
        server.start()
        try:
            seen = set()
            deadline = time.monotonic() + 5
            while seen != {True, False} and time.monotonic() < deadline:
                seen.add(stopped(child.pid))
                time.sleep(0.003)
            assert seen == {True, False}  # stopped and running by turns while slowed
            server.hold()
            held = set()
            for _ in range(50):
                held.add(stopped(child.pid))
                time.sleep(0.005)
            assert held == {True}
        finally:
            server.close()
        time.sleep(0.05)
        assert not stopped(child.pid)
    finally:
        child.kill()
        child.wait()
