"""faults.ImageServer: a process SIGSTOPped most of the time, then held stopped, then running again (on a
plain child process; the fault campaign uses it on the lab's image server)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from testbed.lab.faults import ImageServer
from testbed.lab.procs import state

pytestmark = pytest.mark.timeout(30)

# A main thread asleep and a second one spinning, as a server's handler thread copying a file would.
TWO_THREADS = "import threading, time; threading.Thread(target=lambda: [0 for _ in iter(int, 1)]).start(); " \
    "time.sleep(60)"


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", TWO_THREADS])
    yield proc
    proc.kill()
    proc.wait()


def thread_states(pid: int) -> set[str | None]:
    return {state(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


def stopped(pid: int) -> bool:
    return state(pid) == "T"


def test_slowed_then_held_then_running_again(child: subprocess.Popen[bytes]) -> None:
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
    assert "T" not in thread_states(child.pid)


def test_hold_in_the_running_half_stops_every_thread_before_returning(child: subprocess.Popen[bytes]) -> None:
    server = ImageServer(child.pid, running_share=0.99, period=60)  # running for the next ~59 s
    server.start()
    try:
        t0 = time.monotonic()
        server.hold()
        assert time.monotonic() - t0 < 10  # not the rest of the running half
        assert thread_states(child.pid) == {"T"}  # at once, the spinning thread too
    finally:
        server.close()
    assert "T" not in thread_states(child.pid)


def test_closing_after_the_server_died_raises_nothing(child: subprocess.Popen[bytes]) -> None:
    server = ImageServer(child.pid, running_share=0.5, period=0.05)
    server.start()
    child.kill()
    child.wait()
    server.close()  # a with block's own error is not masked by ProcessLookupError
