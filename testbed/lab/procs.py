"""Processes and commands: run a tool, find a namespace's processes, stop a PID and wait until it is gone.

PID 1 on this machine reaps orphans slowly (seconds), so "gone" means no /proc entry or a zombie, read
from /proc/PID/stat, not `kill -0` (which succeeds on zombies). Every process the lab stops is one it
started (a PID from a pid file) or one living in a network namespace the lab created itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


class LabError(RuntimeError):
    """A lab step failed; the message names the step and carries the tool's stderr."""


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 120, input: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired as e:
        raise LabError(f"{' '.join(argv)}: timed out after {timeout}s") from e
    except FileNotFoundError as e:
        raise LabError(f"{argv[0]}: not installed (run scripts/setup)") from e
    if check and proc.returncode != 0:
        detail = proc.stderr.strip() or proc.stdout.strip()
        raise LabError(f"{' '.join(argv)}: exit {proc.returncode}: {detail}")
    return proc


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def state(pid: int) -> str | None:
    """The process state letter from /proc/PID/stat, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int | None) -> bool:
    return pid is not None and state(pid) not in (None, "Z", "X")


def netns_inode(netns: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{netns}").st_ino
    except OSError:
        return None


def in_netns(pid: int, inode: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == inode
    except OSError:
        return False


def pids_in_netns(netns: str) -> list[int]:
    inode = netns_inode(netns)
    if inode is None:
        return []
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and alive(int(p)) and in_netns(int(p), inode)]


def wait_gone(pids: Sequence[int], *, timeout: float) -> list[int]:
    """Wait until every PID is gone (or a zombie); return those still alive at the timeout."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left


def stop(pids: Sequence[int], *, grace: float = 5.0) -> None:
    """SIGTERM, wait up to `grace`, then SIGKILL what is left and wait for it too."""
    live = [p for p in pids if alive(p)]
    for p in live:
        _signal(p, signal.SIGTERM)
    left = wait_gone(live, timeout=grace)
    for p in left:
        _signal(p, signal.SIGKILL)
    left = wait_gone(left, timeout=5.0)
    if left:
        raise LabError(f"processes {left} did not exit after SIGKILL")


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def wait_for(predicate: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise LabError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
