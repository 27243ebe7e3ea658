"""One hypervisor host: its session, opened on first use, shared by every reconcile, re-dialled with backoff.

Every libvirt call, downloads and uploads too, goes through `Host.call`, which (a) opens the session if
there is none, (b) turns a lost link into a TransientError after logging `libvirt connection dropped`
with the reason and forgetting the session, so the next call re-dials, and (c) refuses to dial again
before the backoff has passed, so a dead host costs one failed dial per backoff period instead of one
per reconcile.

While a host is down and someone listens (`on_back`: the controller), the host re-dials by itself on that
backoff, and the moment a dial succeeds again the listeners hear of it: the Proxies on that host are
re-queued at once instead of each waiting out the per-Proxy backoff it grew during the outage. Messages
carry no countdown: one written into status would stand there frozen.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from egress_kvm.backoff import Backoff
from egress_kvm.config.models import HostConfig
from egress_kvm.log import Logger
from egress_kvm.providers.base import HostUnreachable, TransientError
from rpc.errors import ConnectFailed, ConnectionLost, DeadlineExceeded, LibvirtError, ProtocolError
from rpc.types import StorageVol

from .calllog import current_instance
from .libvirt_api import LibvirtApi
from .session import Dialer, DialOptions, ExecNotAllowed, ExecResult, Session

BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0
T = TypeVar("T")

# What "the link is gone" looks like from below: the rpc client's errors, asyncssh's, and the OS's.
LINK_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionLost, ConnectFailed, DeadlineExceeded, ProtocolError, OSError, TimeoutError)


#: How long a finished shared read (`Host.shared_exec`) serves later callers. 0: only callers that arrive
#: while it runs share it, so an answer is never older than one run (a VM's address learnt a moment ago
#: shows in the next Get, as before).
SHARED_EXEC_MAX_AGE = 0.0


def reusable(*, finished_at: float | None, now: float, max_age: float) -> bool:
    """Whether a read that finished at `finished_at` (None: never) may answer a caller at `now`."""
    return finished_at is not None and 0.0 <= now - finished_at < max_age


class _KeyLock:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class Host:
    def __init__(self, *, config: HostConfig, dial: Dialer, options: DialOptions, log: Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.name = config.name
        self._dial = dial
        self._options = options
        self._log = log.with_values(host=config.name)
        self._clock = clock
        self._session: Session | None = None
        self._lock = asyncio.Lock()
        self._backoff = Backoff(BACKOFF_INITIAL, BACKOFF_MAX)  # re-dials of a host that did not answer
        self._retry_at = 0.0
        self._last_error = ""
        # Per-host single-flight locks (e.g. one download per base image), created on demand.
        self.locks: dict[str, _KeyLock] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._back_listeners: list[Callable[[str], None]] = []
        self._redial: asyncio.TimerHandle | None = None
        self._redialling: asyncio.Task[None] | None = None
        self._closed = False
        self._shared: dict[tuple[str, ...], asyncio.Task[ExecResult]] = {}  # argv -> its run in flight
        self._shared_done: dict[tuple[str, ...], tuple[float, ExecResult]] = {}  # argv -> (finished, result)

    def on_back(self, listener: Callable[[str], None]) -> None:
        """Call `listener(host name)` whenever a dial succeeds after a failed one."""
        self._back_listeners.append(listener)

    @property
    def log(self) -> Logger:
        """The host's logger, with `name` when called on behalf of one instance (every operation sets it)."""
        name = current_instance.get()
        return self._log.with_values(name=name) if name else self._log

    def retry_in(self) -> float:
        """Seconds until the backoff allows the next dial (0 when it may dial now)."""
        return max(self._retry_at - self._clock(), 0.0)

    @property
    def connected(self) -> bool:
        return self._session is not None and self._session.closed_reason is None

    async def session(self) -> Session:
        current = self._session
        if current is not None and current.closed_reason is None:
            return current
        async with self._lock:
            current = self._session
            if current is not None:
                reason = current.closed_reason
                if reason is None:
                    return current
                self._forget(reason)
            now = self._clock()
            if now < self._retry_at:
                raise HostUnreachable(f"host {self.name!r} unreachable ({self._last_error}); "
                                      "re-dialling with backoff")
            address = self.config.address
            try:
                session = await self._dial(self.config, self._options)
            except Exception as exc:
                delay = self._backoff.next()
                self._retry_at = self._clock() + delay
                self._last_error = _describe(exc)
                self.log.v(1).info("libvirt host dial failed", address=address, error=self._last_error,
                                    retryIn=round(delay, 2))
                self._schedule_redial()
                raise HostUnreachable(
                    f"host {self.name!r} ({address}) unreachable: {self._last_error}") from None
            was_down = self._backoff.failures > 0
            self._backoff.reset()
            self._retry_at = 0.0
            self._session = session
            session.on_close(functools.partial(self._dropped_while_idle, session))
            self.log.v(1).info("libvirt host connected", address=address, user=self.config.user,
                                socket=self.config.socket)
        if was_down:
            self.log.info("libvirt host answers again", address=address)
            for listener in list(self._back_listeners):
                try:
                    listener(self.name)
                except Exception as exc:  # a listener's bug must not fail this call
                    self.log.error(exc, "host-back listener failed")
        return session

    def _schedule_redial(self) -> None:
        if not self._back_listeners or self._closed or self._redial is not None:
            return
        loop = asyncio.get_running_loop()
        self._redial = loop.call_at(loop.time() + max(self._retry_at - self._clock(), 0.0), self._redial_now)

    def _redial_now(self) -> None:
        self._redial = None
        if self._closed or self.connected:
            return
        self._redialling = asyncio.get_running_loop().create_task(self._redial_once(),
                                                                  name=f"re-dial {self.name}")

    async def _redial_once(self) -> None:
        with contextlib.suppress(TransientError):  # a failure schedules the next attempt itself
            await self.session()

    def _dropped_while_idle(self, session: Session, reason: str) -> None:
        """The link died between calls: log it now, and let the next call re-dial."""
        if self._session is session:
            self._forget(reason)
            task = asyncio.get_running_loop().create_task(session.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _forget(self, reason: str) -> None:
        if self._session is not None:
            self.log.v(1).info("libvirt connection dropped", reason=reason)
            self._session = None

    @contextlib.asynccontextmanager
    async def exclusive(self, key: str) -> AsyncIterator[None]:
        """One holder per key on this host (e.g. one download per base image, one create per name).

        The lock entry is dropped when nobody holds or waits for it, so names do not accumulate.
        """
        entry = self.locks.get(key)
        if entry is None:
            entry = self.locks[key] = _KeyLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0 and self.locks.get(key) is entry:
                del self.locks[key]

    def held(self, key: str) -> bool:
        """Whether someone holds or waits for `exclusive(key)` (a look that never waits: the GC pass
        skips a base an import is writing rather than wait out the download)."""
        return key in self.locks

    async def call(self, what: str, op: Callable[[LibvirtApi], Awaitable[T]]) -> T:
        """Run `op` against this host's libvirt client (`what` names it in messages): the one place where
        a lost link becomes HostUnreachable and the session is dropped for the next call to re-dial. A
        call that ran out of time (DeadlineExceeded) says so and keeps the session: a slow call is not
        a dead link, and the client's keepalive ends a link that is."""
        session = await self.session()
        try:
            return await op(session.libvirt)
        except LibvirtError:
            raise
        except LINK_ERRORS as exc:
            if isinstance(exc, DeadlineExceeded):
                raise HostUnreachable(f"host {self.name!r}: {what} timed out: {_describe(exc)}") from None
            reason = session.closed_reason or _describe(exc)
            if self._session is session:
                await self._drop(session, reason)
            raise HostUnreachable(
                f"host {self.name!r}: libvirt connection lost during {what}: {reason}") from None

    async def upload(self, vol: StorageVol, data: bytes | AsyncIterable[bytes], *, length: int = 0) -> None:
        await self.call("storage_vol_upload", lambda lv: lv.storage_vol_upload(vol, 0, length, 0, data))

    async def download(self, vol: StorageVol, *, limit: int) -> bytes:
        """Read a small volume (a marker) whole; refuses more than `limit` bytes."""
        async def read(lv: LibvirtApi) -> bytes:
            out = bytearray()
            async with lv.storage_vol_download(vol, 0, 0, 0) as chunks:
                async for chunk in chunks:
                    out += chunk
                    if len(out) > limit:
                        raise TransientError(
                            f"host {self.name!r}: volume {vol.name!r} is larger than {limit} bytes")
            return bytes(out)

        return await self.call(f"reading {vol.name!r}", read)

    async def exec(self, argv: Sequence[str], *, time_limit: float = 10.0) -> ExecResult:
        """Run a command on the host over the same SSH connection (raises ExecNotAllowed if it cannot)."""
        session = await self.session()
        return await session.exec(argv, time_limit=time_limit)

    async def shared_exec(self, argv: Sequence[str], *, max_age: float = SHARED_EXEC_MAX_AGE) -> ExecResult:
        """`exec` for a read of host-wide state (the bridge's neighbour table, /proc/meminfo), shared: a
        caller joins the run in flight (or takes one finished less than `max_age` ago). Every Proxy's Get
        reads the same table; at hundreds of VMs per host that was one SSH channel and one process on the
        host per Get, and sshd refuses channels past MaxSessions (10 by default) open at once. A failure
        is not kept: the next caller runs it again."""
        key = tuple(argv)
        task = self._shared.get(key)
        if task is None:
            done = self._shared_done.get(key)
            if done is not None and reusable(finished_at=done[0], now=self._clock(), max_age=max_age):
                return done[1]
            task = asyncio.get_running_loop().create_task(self._run_shared(key),
                                                          name=f"{argv[0]} on {self.name}")
            self._shared[key] = task
            task.add_done_callback(functools.partial(self._shared_finished, key))
        return await asyncio.shield(task)

    async def _run_shared(self, key: tuple[str, ...]) -> ExecResult:
        result = await self.exec(key)
        self._shared_done[key] = (self._clock(), result)
        return result

    def _shared_finished(self, key: tuple[str, ...], task: asyncio.Task[ExecResult]) -> None:
        if self._shared.get(key) is task:
            del self._shared[key]
        if not task.cancelled():
            task.exception()  # retrieved: every caller may have gone (cancelled) before it ended

    async def _drop(self, session: Session, reason: str) -> None:
        self._forget(reason)
        with contextlib.suppress(Exception):  # the link is already gone
            await session.close()

    async def close(self) -> None:
        self._closed = True
        if self._redial is not None:
            self._redial.cancel()
            self._redial = None
        if self._redialling is not None and not self._redialling.done():
            self._redialling.cancel()
            with contextlib.suppress(BaseException):
                await self._redialling
        for task in list(self._closing):
            with contextlib.suppress(Exception):
                await task
        for shared in list(self._shared.values()):
            shared.cancel()
            with contextlib.suppress(BaseException):
                await shared
        self._shared_done.clear()
        async with self._lock:
            session, self._session = self._session, None
        if session is not None:
            await session.close()
            self._log.v(1).info("libvirt host disconnected")


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 300 else text[:297] + "..."


__all__ = ["ExecNotAllowed", "ExecResult", "Host"]
