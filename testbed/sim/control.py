"""The client of a simulated host's control socket: what tests and benchmarks drive hosts with.

    sim = SimControl("/var/tmp/egress-kvm-lab/lab3/host0/sim.sock")
    sim.set(boot_delay_s=5, rpc_latency_s=0.01, fail_rate=0.05)   # knobs.py names them
    sim.state()["domains"]          # [{"name", "state", "reason", "persistent", "ip"}, ...]
    sim.crash("proxy-abc"); sim.pause("proxy-abc")
    sim.fill_pool(); sim.free_pool()                             # ENOSPC for the next write
    sim.kill(); sim.revive()                                     # the host dies / comes back

Blocking and one request per connection, so it is safe from any thread or process; `AsyncSimControl`
is the same for an event loop.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any


class SimControlError(RuntimeError):
    """The simulator refused a request (the message names the knob, op or domain)."""


def _result(line: bytes) -> Any:
    reply = json.loads(line)
    if not reply.get("ok"):
        raise SimControlError(reply.get("error", "refused"))
    return reply.get("result")


class SimControl:
    def __init__(self, path: str, *, timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout

    def request(self, op: str, **fields: Any) -> Any:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(self.timeout)
            s.connect(self.path)
            s.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    raise SimControlError(f"{self.path}: closed before replying to {op!r}")
                buf += chunk
        return _result(buf)

    def set(self, **knobs: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.request("set", knobs=knobs)
        return result

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request("state")
        return result

    def crash(self, domain: str) -> None:
        self.request("crash", domain=domain)

    def pause(self, domain: str) -> None:
        self.request("pause", domain=domain)

    def stop(self, domain: str) -> None:
        """The domain's QEMU stops (as SIGSTOP does to a real one): calls that need its monitor hang."""
        self.request("stop", domain=domain)

    def cont(self, domain: str) -> None:
        self.request("cont", domain=domain)

    def fill_pool(self) -> None:
        self.request("fill_pool")

    def free_pool(self) -> None:
        self.request("free_pool")

    def kill(self) -> None:
        self.request("kill")

    def revive(self) -> None:
        self.request("revive")


class AsyncSimControl:
    def __init__(self, path: str) -> None:
        self.path = path

    async def request(self, op: str, **fields: Any) -> Any:
        reader, writer = await asyncio.open_unix_connection(self.path)
        try:
            writer.write(json.dumps({"op": op, **fields}).encode() + b"\n")
            await writer.drain()
            return _result(await reader.readline())
        finally:
            writer.close()
