"""A child process of the test stacks (the operator, the emulator): its output in a file, in its own
session, stopped by PID (never by name: other sessions run the same commands on this machine)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


class Process:
    def __init__(self, argv: list[str], *, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a node dying or the OOM killer would (no shutdown path runs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._log.close()

    def stop(self, *, timeout: float = 60) -> int:
        """SIGTERM, then SIGKILL after `timeout`; a process already gone (killed, exited) is only reaped."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()
