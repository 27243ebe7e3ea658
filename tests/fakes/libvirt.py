"""An in-memory libvirt hypervisor with the rpc client's method names, return shapes and error codes.

The host's state and semantics are testbed/sim/model.py's `Hypervisor` (the same code the simulated lab
host serves over the wire); `FakeHypervisor` adds what only an in-process fake has (sessions to drop,
exec over "SSH", one-shot injected failures, the call list), and `FakeLibvirtClient` exposes it through
the same methods the rpc client has (`domain_lookup_by_name`, `storage_vol_upload`, ...), returning
rpc.types values and raising rpc.errors with the codes a real libvirtd uses, and feeding the same
`observer` with rpc.observe.CallRecord values, so the provider cannot tell it from the real client.
Every call is also appended to `FakeHypervisor.calls` for counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterable, Callable, Sequence
from typing import Any, TypeVar

from egress_kvm.providers.kvm.session import DialOptions, ExecNotAllowed, ExecResult
from rpc import types as t
from rpc.agentevent import AgentLifecycleEvent
from rpc.errors import ConnectionLost, EventsLost, LibvirtError, MalformedEvent
from rpc.observe import CallRecord, Observer
from rpc.procedures import BY_NAME
from testbed.sim.model import (  # noqa: F401  (re-exported: tests stage situations with these)
    DOMAIN_PAUSED_USER,
    DOMAIN_RUNNING_UNPAUSED,
    ERROR_DOMAIN_DOMAIN,
    ERROR_DOMAIN_QEMU,
    ERROR_DOMAIN_STORAGE,
    GIB,
    Domain,
    Hypervisor,
    Volume,
    invalid,
    lv_error,
    no_pool,
    no_space,
    no_vol,
)

R = TypeVar("R")
FakeDomain = Domain
FakeVolume = Volume


class FakeHypervisor(Hypervisor):
    """One host. Mutate its attributes in tests to stage situations (agent up, pool full, host down)."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.calls: list[str] = []
        self.reachable = True
        self.dial_error = "connection refused"
        self.exec_allowed = True
        self.exec_log: list[list[str]] = []
        # OpenSSH's MaxSessions (default 10): session channels (each exec) open at once on one connection;
        # sshd refuses the next channel ("open failed"). The libvirt forward is not a session channel.
        self.max_sessions = 10
        self.execs_open = 0
        self.fail: dict[str, LibvirtError] = {}  # method -> error raised once on its next call
        self.sessions: list[FakeSession] = []
        self.events_refused = False  # registering for events fails as on a daemon without it
        self.agent_events_refused = False  # registering for agent lifecycle events (only) fails
        self.next_callback = 0

    def drop_connections(self, reason: str = "connection reset by peer") -> None:
        """The SSH connections die now (the provider hears of it like from asyncssh's connection_lost)."""
        for s in self.sessions:
            if s.lost is None:
                s.lost = reason
                for cb in s.callbacks:
                    cb(reason)
                for sub in s.subscriptions:
                    sub.wake()


class FakeLifecycleEvents:
    """`lifecycle_events()` over the model's listeners, shaped like rpc's LifecycleSubscription: the
    registration is a call (so `hyp.fail` can refuse it, and `hyp.events_refused` refuses every one, as a
    daemon without the procedure), the stream ends with ConnectionLost when the session drops."""

    def __init__(self, client: FakeLibvirtClient) -> None:
        self._client = client
        self._queue: list[Any] = []  # LifecycleEvent or AgentLifecycleEvent, per the subclass
        self._wake = asyncio.Event()
        self.callback_id = 0
        self._lost = 0  # events dropped, reported by the iterator once the queue is empty (`lose`)

    async def __aenter__(self) -> FakeLifecycleEvents:
        hyp = self._client.hyp

        def register() -> int:
            if hyp.events_refused:
                raise lv_error(39, "unknown procedure: 316", domain=7)
            if self.event_id == 18 and hyp.agent_events_refused:
                raise lv_error(3, "this function is not supported by the connection driver: event 18",
                               domain=7)
            hyp.next_callback += 1
            self.callback_id = hyp.next_callback
            self._listeners().append(self._on_event)
            self._client._session.subscriptions.append(self)
            return self.callback_id
        await self._call_register(register)
        return self

    async def _call_register(self, fn: Callable[[], int]) -> None:
        await self._client._call("connect_domain_event_callback_register_any", (self.event_id, None), fn)

    event_id = 0

    def _listeners(self) -> list[Any]:
        return self._client.hyp.listeners

    async def __aexit__(self, *exc: object) -> None:
        if self._on_event in self._listeners():
            self._listeners().remove(self._on_event)
        with contextlib.suppress(ValueError):
            self._client._session.subscriptions.remove(self)

    def _on_event(self, dom: Domain, event: Any, detail: int) -> None:
        self._queue.append(t.LifecycleEvent(callback_id=self.callback_id, dom=dom.handle(), event=int(event),
                                            detail=detail))
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def lose(self, n: int) -> None:
        """The consumer fell behind and `n` events were dropped: EventsLost once after those queued, as
        rpc's subscription reports it."""
        self._lost += n
        self._wake.set()

    def malformed(self) -> None:
        """An event whose body did not decode arrives: MalformedEvent in its place among the queued ones,
        once, as rpc's subscription reports it."""
        self._queue.append(MalformedEvent(f"malformed event for callback {self.callback_id}: truncated"))
        self._wake.set()

    def __aiter__(self) -> FakeLifecycleEvents:
        return self

    async def __anext__(self) -> Any:
        while True:
            if self._queue:
                item = self._queue.pop(0)
                if isinstance(item, MalformedEvent):
                    raise item
                return item
            if self._lost:
                n, self._lost = self._lost, 0
                raise EventsLost(f"{n} events dropped")
            if self._client._session.lost is not None:
                raise ConnectionLost(f"connection to fake {self._client.hyp.name} lost: "
                                     f"{self._client._session.lost}")
            self._wake.clear()
            await self._wake.wait()


class FakeAgentLifecycleEvents(FakeLifecycleEvents):
    """`agent_lifecycle_events()`: the model's agent_listeners, shaped like AgentLifecycleSubscription."""

    event_id = 18

    def _listeners(self) -> list[Any]:
        return self._client.hyp.agent_listeners

    def _on_event(self, dom: Domain, state: Any, reason: Any = 0) -> None:
        self._queue.append(AgentLifecycleEvent(self.callback_id, dom.handle(), state, reason))
        self._wake.set()


class _Download:
    def __init__(self, client: FakeLibvirtClient, vol: t.StorageVol, offset: int, length: int) -> None:
        self._client = client
        self._vol = vol
        self._offset = offset
        self._length = length
        self._chunks: list[bytes] | None = None

    async def __aenter__(self) -> _Download:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __aiter__(self) -> _Download:
        return self

    async def __anext__(self) -> bytes:
        if self._chunks is None:
            args = (self._vol, self._offset, self._length, 0)
            data = await self._client._call(
                "storage_vol_download", args,
                lambda: self._client.hyp.download_range(self._vol, self._offset, self._length))
            self._chunks = [data[i:i + 262_120] for i in range(0, len(data), 262_120)]
        if not self._chunks:
            raise StopAsyncIteration
        return self._chunks.pop(0)

    async def read_all(self) -> bytes:
        return b"".join([c async for c in self])


def _arg_names(method: str, count: int) -> tuple[str, ...]:
    """The protocol's argument names, from the rpc package's own procedure table (as the real observer)."""
    proc = BY_NAME.get(method.upper())
    if proc is None or proc.args is None:
        return tuple(f"arg{i}" for i in range(count))
    return tuple(n for n, _ in proc.args.fields)


class FakeLibvirtClient:
    """The rpc client's surface over a FakeHypervisor (only what the provider and preflight use)."""

    def __init__(self, hyp: FakeHypervisor, session: FakeSession, observer: Observer | None) -> None:
        self.hyp = hyp
        self._session = session
        self.observer = observer

    @property
    def is_connected(self) -> bool:
        return self._session.lost is None

    async def close(self) -> None:
        self._session.lost = self._session.lost or "closed by the client"
        for sub in self._session.subscriptions:
            sub.wake()

    def lifecycle_events(self) -> FakeLifecycleEvents:
        return FakeLifecycleEvents(self)

    def agent_lifecycle_events(self) -> FakeAgentLifecycleEvents:
        return FakeAgentLifecycleEvents(self)

    async def _call(self, method: str, args: tuple[Any, ...], fn: Any) -> Any:
        await asyncio.sleep(0)  # a real call always yields to the loop
        started = time.perf_counter()
        self.hyp.calls.append(method)
        result = None
        error: BaseException | None = None
        try:
            if self._session.lost is not None:
                raise ConnectionLost(f"connection to fake {self.hyp.name} lost: {self._session.lost}")
            injected = self.hyp.fail.pop(method, None)
            if injected is not None:
                raise injected
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            if self.observer is not None:
                names = _arg_names(method, len(args))
                record_args = dict(zip(names, args, strict=False))
                self.observer(CallRecord(procedure=method.upper(), method=method, args=record_args,
                                         result=result, error=error, duration=time.perf_counter() - started))

    # -- every procedure is the model's method of the same name, called through _call ---------------

    async def _do(self, fn: Callable[..., R], *args: Any) -> R:
        result: R = await self._call(fn.__name__, args, lambda: fn(*args))
        return result

    async def connect_get_lib_version(self) -> int:
        return await self._do(self.hyp.connect_get_lib_version)

    async def connect_get_version(self) -> int:
        return await self._do(self.hyp.connect_get_version)

    async def connect_get_hostname(self) -> str:
        return await self._do(self.hyp.connect_get_hostname)

    async def node_get_free_memory(self) -> int:
        return await self._do(self.hyp.node_get_free_memory)

    async def node_get_info(self) -> t.NodeGetInfoRet:
        return await self._do(self.hyp.node_get_info)

    async def domain_lookup_by_name(self, name: str) -> t.Domain:
        return await self._do(self.hyp.domain_lookup_by_name, name)

    async def domain_define_xml(self, xml: str) -> t.Domain:
        return await self._do(self.hyp.domain_define_xml, xml)

    async def domain_create_with_flags(self, dom: t.Domain, flags: int = 0) -> t.Domain:
        return await self._do(self.hyp.domain_create_with_flags, dom, flags)

    async def domain_create(self, dom: t.Domain) -> None:
        await self._do(self.hyp.domain_create, dom)

    async def domain_destroy_flags(self, dom: t.Domain, flags: int = 0) -> None:
        await self._do(self.hyp.domain_destroy_flags, dom, flags)

    async def domain_destroy(self, dom: t.Domain) -> None:
        await self._do(self.hyp.domain_destroy, dom)

    async def domain_suspend(self, dom: t.Domain) -> None:
        await self._do(self.hyp.domain_suspend, dom)

    async def domain_resume(self, dom: t.Domain) -> None:
        await self._do(self.hyp.domain_resume, dom)

    async def domain_undefine_flags(self, dom: t.Domain, flags: int = 0) -> None:
        await self._do(self.hyp.domain_undefine_flags, dom, flags)

    async def domain_get_state(self, dom: t.Domain, flags: int = 0) -> t.DomainGetStateRet:
        return await self._do(self.hyp.domain_get_state, dom, flags)

    async def domain_is_active(self, dom: t.Domain) -> int:
        return await self._do(self.hyp.domain_is_active, dom)

    async def domain_get_xml_desc(self, dom: t.Domain, flags: int = 0) -> str:
        return await self._do(self.hyp.domain_get_xml_desc, dom, flags)

    async def domain_get_metadata(self, dom: t.Domain, type_: int, uri: str | None, flags: int = 0) -> str:
        return await self._do(self.hyp.domain_get_metadata, dom, type_, uri, flags)

    async def domain_interface_addresses(self, dom: t.Domain, source: int, flags: int = 0
                                         ) -> tuple[t.DomainInterface, ...]:
        return await self._do(self.hyp.domain_interface_addresses, dom, source, flags)

    async def connect_list_all_domains(self, need_results: int = 1, flags: int = 0
                                       ) -> t.ConnectListAllDomainsRet:
        return await self._do(self.hyp.connect_list_all_domains, need_results, flags)

    async def storage_pool_lookup_by_name(self, name: str) -> t.StoragePool:
        return await self._do(self.hyp.storage_pool_lookup_by_name, name)

    async def storage_pool_get_info(self, pool: t.StoragePool) -> t.StoragePoolGetInfoRet:
        return await self._do(self.hyp.storage_pool_get_info, pool)

    async def storage_pool_refresh(self, pool: t.StoragePool, flags: int = 0) -> None:
        await self._do(self.hyp.storage_pool_refresh, pool, flags)

    async def storage_pool_list_all_volumes(self, pool: t.StoragePool, need_results: int = 1,
                                            flags: int = 0) -> t.StoragePoolListAllVolumesRet:
        def fn() -> t.StoragePoolListAllVolumesRet:
            self.hyp.check_pool(pool)
            vols = tuple(self.hyp.vol_handle(v) for v in self.hyp.volumes.values())
            return t.StoragePoolListAllVolumesRet(vols=vols, ret=len(vols))
        return await self._call("storage_pool_list_all_volumes", (pool, need_results, flags), fn)

    async def storage_vol_lookup_by_name(self, pool: t.StoragePool, name: str) -> t.StorageVol:
        return await self._do(self.hyp.storage_vol_lookup_by_name, pool, name)

    async def storage_vol_create_xml(self, pool: t.StoragePool, xml: str, flags: int = 0) -> t.StorageVol:
        return await self._do(self.hyp.storage_vol_create_xml, pool, xml, flags)

    async def storage_vol_delete(self, vol: t.StorageVol, flags: int = 0) -> None:
        await self._do(self.hyp.storage_vol_delete, vol, flags)

    async def storage_vol_get_path(self, vol: t.StorageVol) -> str:
        return await self._do(self.hyp.storage_vol_get_path, vol)

    async def storage_vol_get_info(self, vol: t.StorageVol) -> t.StorageVolGetInfoRet:
        return await self._do(self.hyp.storage_vol_get_info, vol)

    async def storage_vol_get_xml_desc(self, vol: t.StorageVol, flags: int = 0) -> str:
        return await self._do(self.hyp.storage_vol_get_xml_desc, vol, flags)

    async def storage_vol_upload(self, vol: t.StorageVol, offset: int, length: int, flags: int,
                                 data: bytes | bytearray | memoryview | AsyncIterable[bytes]) -> int:
        async def fn() -> int:
            upload = self.hyp.upload_begin(vol, offset, length, flags)
            if isinstance(data, bytes | bytearray | memoryview):
                self._check_session()
                upload.write(bytes(data))
            else:
                async for piece in data:
                    self._check_session()
                    upload.write(piece)
            return upload.end()
        return await self._call("storage_vol_upload", (vol, offset, length, flags), fn)

    def _check_session(self) -> None:
        if self._session.lost is not None:
            raise ConnectionLost(f"connection to fake {self.hyp.name} lost: {self._session.lost}")

    def storage_vol_download(self, vol: t.StorageVol, offset: int, length: int, flags: int = 0) -> _Download:
        return _Download(self, vol, offset, length)


class FakeSession:
    """The Session the provider's Host expects: a fake libvirt client plus `ip` exec over "SSH"."""

    def __init__(self, hyp: FakeHypervisor, observer: Observer | None) -> None:
        self.hyp = hyp
        self.lost: str | None = None
        self.callbacks: list[Any] = []
        self.subscriptions: list[FakeLifecycleEvents] = []
        self.libvirt = FakeLibvirtClient(hyp, self, observer)

    def on_close(self, callback: Any) -> None:
        self.callbacks.append(callback)

    @property
    def closed_reason(self) -> str | None:
        return self.lost

    async def exec(self, argv: Sequence[str], *, time_limit: float) -> ExecResult:
        await asyncio.sleep(0)
        if self.lost is not None:
            raise ConnectionLost(f"connection to fake {self.hyp.name} lost: {self.lost}")
        if not self.hyp.exec_allowed:
            raise ExecNotAllowed("exec refused by the host: administratively prohibited")
        if self.hyp.execs_open >= self.hyp.max_sessions:
            raise ExecNotAllowed("exec refused by the host: open failed")
        self.hyp.execs_open += 1
        try:
            for _ in range(50):  # a process on the host takes a while: execs in flight together overlap
                await asyncio.sleep(0)
        finally:
            self.hyp.execs_open -= 1
        if self.lost is not None:
            raise ConnectionLost(f"connection to fake {self.hyp.name} lost: {self.lost}")
        argv = list(argv)
        self.hyp.exec_log.append(argv)
        if argv[:4] == ["ip", "-j", "neigh", "show"] and len(argv) == 6 and argv[4] == "dev":
            if argv[5] not in self.hyp.bridges:
                return ExecResult(1, "", f'Cannot find device "{argv[5]}"\n')
            return ExecResult(0, json.dumps(self.hyp.neighbours.get(argv[5], [])), "")
        if argv == ["cat", "/proc/meminfo"]:
            free_kb = self.hyp.free_memory() // 1024
            avail_kb = (self.hyp.free_memory() + self.hyp.page_cache) // 1024
            return ExecResult(0, f"MemTotal: {self.hyp.memory // 1024} kB\nMemFree: {free_kb} kB\n"
                                 f"MemAvailable: {avail_kb} kB\n", "")
        if argv[:3] == ["ip", "link", "show"] and len(argv) == 4:
            if argv[3] not in self.hyp.bridges:
                return ExecResult(1, "", f'Device "{argv[3]}" does not exist.\n')
            return ExecResult(0, f"5: {argv[3]}: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 state UP\n", "")
        return ExecResult(127, "", f"sh: {argv[0]}: command not found\n")

    async def close(self) -> None:
        self.lost = self.lost or "closed"
        for sub in self.subscriptions:
            sub.wake()


class FakeHypervisors:
    """Several fake hosts by name, and the dialer the provider uses to reach them."""

    def __init__(self, names: Sequence[str], **host_kwargs: Any) -> None:
        self.hosts: dict[str, FakeHypervisor] = {n: FakeHypervisor(n, **host_kwargs) for n in names}
        self.dials: list[str] = []

    def __getitem__(self, name: str) -> FakeHypervisor:
        return self.hosts[name]

    async def dial(self, host: Any, options: DialOptions) -> FakeSession:
        await asyncio.sleep(0)
        self.dials.append(host.name)
        hyp = self.hosts[host.name]
        if not hyp.reachable:
            raise OSError(f"connect to {host.address}: {hyp.dial_error}")
        session = FakeSession(hyp, options.observer)
        hyp.sessions.append(session)
        return session

    def set_unreachable(self, name: str, unreachable: bool = True) -> None:
        """Make a host refuse new connections and drop the current ones (or bring it back)."""
        hyp = self.hosts[name]
        hyp.reachable = not unreachable
        if unreachable:
            hyp.drop_connections("host unreachable")
