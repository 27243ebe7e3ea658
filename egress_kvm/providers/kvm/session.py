"""A session with one hypervisor host: one SSH connection carrying the libvirt client and `ip` execs.

`Session` is the seam between the provider and the outside world: the real one (`ssh_dial`) opens an
asyncssh connection and a libvirt client over a forwarded unix socket through it (`rpc.connect_over`);
the fake in tests/fakes implements the same shape over an in-memory hypervisor. The provider never
imports asyncssh or rpc's transports itself, so tests swap the dialer and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import asyncssh

import rpc
from egress_kvm.config.models import HostConfig
from rpc.observe import Observer
from rpc.trace import Tracer

from .libvirt_api import LibvirtApi

LIBVIRT_URI = "qemu:///system"


@dataclass(frozen=True)
class ExecResult:
    exit_status: int
    stdout: str
    stderr: str


class ExecNotAllowed(Exception):
    """The host refused to run a command for us (no exec channel, or the command is not available)."""


@dataclass(frozen=True)
class DialOptions:
    ssh_key_file: str
    known_hosts_file: str | None  # None: insecureIgnoreHostKey
    observer: Observer | None = None
    tracer: Tracer | None = None  # the V(5) wire trace (None: off)
    timeout: float = 20.0
    call_timeout: float = 60.0
    keepalive_interval: float = 10.0


class Session(Protocol):
    """What the provider needs from one host: a libvirt client, command execution, and liveness."""

    @property
    def libvirt(self) -> LibvirtApi:
        """The rpc client (or, in tests, the fake standing for it)."""
        ...

    @property
    def closed_reason(self) -> str | None:
        """None while usable; the reason once the SSH connection or the libvirt client is gone."""
        ...

    async def exec(self, argv: Sequence[str], *, time_limit: float) -> ExecResult: ...

    async def close(self) -> None: ...

    def on_close(self, callback: Callable[[str], None]) -> None:
        """Register `callback(reason)` for a drop noticed while idle (a session may also never call it)."""
        ...


Dialer = Callable[[HostConfig, DialOptions], Awaitable[Session]]


class _TrackingClient(asyncssh.SSHClient):
    """Remembers why the SSH connection ended, and tells the host at once (to log the drop with it)."""

    def __init__(self) -> None:
        self.lost: str | None = None
        self.callbacks: list[Callable[[str], None]] = []

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = str(exc) if exc else "SSH connection closed by the host"
        for cb in self.callbacks:
            cb(self.lost)


class SshSession:
    def __init__(self, conn: asyncssh.SSHClientConnection, tracker: _TrackingClient,
                 client: rpc.Client) -> None:
        self._conn = conn
        self._tracker = tracker
        self.libvirt: rpc.Client = client
        self._closed_by_us = False

    def on_close(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` when the SSH connection drops (not when we close it)."""
        self._tracker.callbacks.append(lambda reason: None if self._closed_by_us else callback(reason))

    @property
    def closed_reason(self) -> str | None:
        if self._closed_by_us:
            return "closed"
        if self._tracker.lost:
            return self._tracker.lost
        if not self.libvirt.is_connected:
            return "libvirt connection closed"
        return None

    async def exec(self, argv: Sequence[str], *, time_limit: float) -> ExecResult:
        command = shlex.join(argv)
        try:
            result = await asyncio.wait_for(self._conn.run(command, check=False), time_limit)
        except asyncssh.ChannelOpenError as exc:
            raise ExecNotAllowed(f"exec refused by the host: {exc.reason}") from None
        except TimeoutError:
            raise ExecNotAllowed(f"{argv[0]} did not finish within {time_limit:g}s") from None
        status = result.exit_status if result.exit_status is not None else -1
        if status == 127:
            raise ExecNotAllowed(f"{argv[0]} is not on the SSH user's PATH")
        return ExecResult(status, _text(result.stdout), _text(result.stderr))

    async def close(self) -> None:
        self._closed_by_us = True
        # Closing a dead link must not mask the reason we close it.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.libvirt.close(), 5)
        self._conn.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._conn.wait_closed(), 5)


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


async def ssh_dial(host: HostConfig, options: DialOptions) -> Session:
    """Open the host's SSH connection (host key checked unless insecure) and a libvirt client through it."""
    address, port = host.host_port
    tracker = _TrackingClient()
    # rpc.open_ssh makes the same host-key checks (and gives the same errors) as rpc.connect_ssh.
    conn = await rpc.open_ssh(
        address, port, username=host.user, client_keys=[options.ssh_key_file],
        known_hosts=options.known_hosts_file, timeout=options.timeout, client_factory=lambda: tracker,
        agent_path=None, config=None, keepalive_interval=options.keepalive_interval, keepalive_count_max=3,
        coalesce=True)  # one send per loop turn: calls in flight together share it (rpc/coalesce.py)
    try:
        client = await rpc.connect_over(
            conn, socket_path=host.socket, uri=LIBVIRT_URI, timeout=options.timeout,
            call_timeout=options.call_timeout, observer=options.observer, tracer=options.tracer)
    except BaseException:
        conn.close()
        raise
    return SshSession(conn, tracker, client)
