"""The client: one method per REMOTE procedure, on top of the connection's one generic call path.

Methods are named after the procedure in snake_case and take the procedure's arguments in protocol order
under their protocol names (camelCase -> snake_case, `type` -> `type_`). `flags` defaults to 0 and
`need_results` to 1; every method takes a keyword-only `timeout=` (seconds; default: the client's
call_timeout). Returns: a one-field return struct gives that value, a larger one its `*Ret` dataclass,
void gives None. Errors: LibvirtError / NotFoundError from the daemon, DeadlineExceeded, ConnectionLost,
ProtocolError.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable

from .connection import Connection
from .constants import FEATURE_PROGRAM_KEEPALIVE, AuthType
from .errors import ConnectFailed, LibvirtError
from .events import LifecycleSubscription
from .procedures import BY_NUMBER
from .streams import Download, upload
from .types import (
    ConnectListAllDomainsRet,
    ConnectListAllStoragePoolsRet,
    Domain,
    DomainGetStateRet,
    DomainInterface,
    NodeGetInfoRet,
    StoragePool,
    StoragePoolGetInfoRet,
    StoragePoolListAllVolumesRet,
    StorageVol,
    StorageVolGetInfoRet,
)


class Client(Connection):
    """A connected libvirt client. Get one from rpc.connect_unix / connect_ssh / connect_over."""

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Send CONNECT_CLOSE (best effort, short deadline), then free the link and every waiter."""
        if self._closing:
            await self._finish_close()
            return
        self._closing = True
        if self.is_connected:
            # Best effort: the daemon may already be gone; we close either way.
            with contextlib.suppress(Exception):
                await self.call(2, (), timeout=min(self.call_timeout, 5.0))
        await self._finish_close()

    async def _finish_close(self) -> None:
        from .errors import ConnectionLost

        self._lost(ConnectionLost(f"connection to {self._link.description} closed by the client"))
        await self._link.aclose()

    async def _handshake(
        self,
        *,
        uri: str | None,
        readonly: bool = False,
        keepalive_interval: float | None,
        keepalive_count: int,
        timeout: float | None = None,
    ) -> None:
        """What libvirt's own client does: AUTH_LIST, AUTH_POLKIT if listed, keepalive, CONNECT_OPEN."""
        types = await self.auth_list(timeout=timeout)
        if types and AuthType.NONE not in types:
            if AuthType.POLKIT in types:
                complete = await self.auth_polkit(timeout=timeout)
                if not complete:
                    raise ConnectFailed(f"{self.description}: polkit authentication did not complete")
            else:
                names = ", ".join(
                    AuthType(t).name if t in AuthType._value2member_map_ else str(t) for t in types
                )
                raise ConnectFailed(
                    f"{self.description}: libvirtd requires authentication this client does not speak "
                    f"({names}); allow the SSH user's group on the socket (auth_unix_rw) or use polkit"
                )
        if keepalive_interval:
            try:
                supported = await self.connect_supports_feature(FEATURE_PROGRAM_KEEPALIVE, timeout=timeout)
            except LibvirtError:
                supported = 0
            if supported:
                self._start_keepalive(interval=keepalive_interval, count=keepalive_count)
        await self.connect_open(uri, 1 if readonly else 0, timeout=timeout)

    # -- streams and events ------------------------------------------------------------------------

    async def storage_vol_upload(
        self,
        vol: StorageVol,
        offset: int,
        length: int,
        flags: int,
        data: bytes | bytearray | memoryview | AsyncIterable[bytes],
        *,
        timeout: float | None = None,
    ) -> int:
        """Upload `data` (bytes, or an async iterable of bytes) into the volume; returns the bytes sent.

        `length` 0 means "to the end of the volume". `timeout` bounds every wait for progress (the call's
        reply, each drain of the send buffer, the final confirmation), not the whole transfer. A server
        error mid-upload (e.g. "No space left on device") ends the upload at once with that LibvirtError.
        """
        return await upload(self, BY_NUMBER[208], (vol, offset, length, flags), data, timeout=timeout)

    def storage_vol_download(
        self, vol: StorageVol, offset: int, length: int, flags: int = 0, *, timeout: float | None = None
    ) -> Download:
        """An async iterator over the volume's bytes (`length` 0 = to the end); the call is made on first use.

        Use `async with client.storage_vol_download(...) as chunks:` when you may stop early: leaving the
        block aborts the stream on the server. `timeout` bounds each wait for data.
        """
        return Download(self, BY_NUMBER[209], (vol, offset, length, flags), timeout=timeout)

    def lifecycle_events(
        self, dom: Domain | None = None, *, timeout: float | None = None, max_queue: int | None = None
    ) -> LifecycleSubscription:
        """Lifecycle events of `dom` (None: all domains): `async with ... as events: async for ev in ...`."""
        return LifecycleSubscription(
            self,
            dom,
            timeout=timeout,
            max_queue=max_queue if max_queue is not None else self.event_queue_max,
        )

    # -- one method per procedure (protocol order and names) --------------------------------------

    async def connect_open(self, name: str | None, flags: int = 0, *, timeout: float | None = None) -> None:
        return await self.call(1, (name, flags), timeout=timeout)

    async def connect_close(self, *, timeout: float | None = None) -> None:
        return await self.call(2, (), timeout=timeout)

    async def connect_get_type(self, *, timeout: float | None = None) -> str:
        return await self.call(3, (), timeout=timeout)

    async def connect_get_version(self, *, timeout: float | None = None) -> int:
        return await self.call(4, (), timeout=timeout)

    async def node_get_info(self, *, timeout: float | None = None) -> NodeGetInfoRet:
        return await self.call(6, (), timeout=timeout)

    async def domain_create(self, dom: Domain, *, timeout: float | None = None) -> None:
        return await self.call(9, (dom,), timeout=timeout)

    async def domain_define_xml(self, xml: str, *, timeout: float | None = None) -> Domain:
        return await self.call(11, (xml,), timeout=timeout)

    async def domain_destroy(self, dom: Domain, *, timeout: float | None = None) -> None:
        return await self.call(12, (dom,), timeout=timeout)

    async def domain_get_xml_desc(self, dom: Domain, flags: int = 0, *, timeout: float | None = None) -> str:
        return await self.call(14, (dom, flags), timeout=timeout)

    async def domain_lookup_by_name(self, name: str, *, timeout: float | None = None) -> Domain:
        return await self.call(23, (name,), timeout=timeout)

    async def domain_lookup_by_uuid(self, uuid: bytes, *, timeout: float | None = None) -> Domain:
        return await self.call(24, (uuid,), timeout=timeout)

    async def domain_resume(self, dom: Domain, *, timeout: float | None = None) -> None:
        """Run a paused domain's vCPUs again; OPERATION_INVALID (55) if it is not paused."""
        return await self.call(28, (dom,), timeout=timeout)

    async def domain_suspend(self, dom: Domain, *, timeout: float | None = None) -> None:
        """Pause a running domain's vCPUs (state PAUSED, reason USER); the memory stays allocated."""
        return await self.call(34, (dom,), timeout=timeout)

    async def domain_undefine(self, dom: Domain, *, timeout: float | None = None) -> None:
        return await self.call(35, (dom,), timeout=timeout)

    async def connect_get_hostname(self, *, timeout: float | None = None) -> str:
        return await self.call(59, (), timeout=timeout)

    async def connect_supports_feature(self, feature: int, *, timeout: float | None = None) -> int:
        return await self.call(60, (feature,), timeout=timeout)

    async def auth_list(self, *, timeout: float | None = None) -> tuple[int, ...]:
        return await self.call(66, (), timeout=timeout)

    async def auth_polkit(self, *, timeout: float | None = None) -> int:
        return await self.call(70, (), timeout=timeout)

    async def storage_pool_refresh(
        self, pool: StoragePool, flags: int = 0, *, timeout: float | None = None
    ) -> None:
        return await self.call(83, (pool, flags), timeout=timeout)

    async def storage_pool_lookup_by_name(self, name: str, *, timeout: float | None = None) -> StoragePool:
        return await self.call(84, (name,), timeout=timeout)

    async def storage_pool_get_info(
        self, pool: StoragePool, *, timeout: float | None = None
    ) -> StoragePoolGetInfoRet:
        return await self.call(87, (pool,), timeout=timeout)

    async def storage_vol_create_xml(
        self, pool: StoragePool, xml: str, flags: int = 0, *, timeout: float | None = None
    ) -> StorageVol:
        return await self.call(93, (pool, xml, flags), timeout=timeout)

    async def storage_vol_delete(
        self, vol: StorageVol, flags: int = 0, *, timeout: float | None = None
    ) -> None:
        return await self.call(94, (vol, flags), timeout=timeout)

    async def storage_vol_lookup_by_name(
        self, pool: StoragePool, name: str, *, timeout: float | None = None
    ) -> StorageVol:
        return await self.call(95, (pool, name), timeout=timeout)

    async def storage_vol_get_info(
        self, vol: StorageVol, *, timeout: float | None = None
    ) -> StorageVolGetInfoRet:
        return await self.call(98, (vol,), timeout=timeout)

    async def storage_vol_get_xml_desc(
        self, vol: StorageVol, flags: int = 0, *, timeout: float | None = None
    ) -> str:
        return await self.call(99, (vol, flags), timeout=timeout)

    async def storage_vol_get_path(self, vol: StorageVol, *, timeout: float | None = None) -> str:
        return await self.call(100, (vol,), timeout=timeout)

    async def node_get_free_memory(self, *, timeout: float | None = None) -> int:
        return await self.call(102, (), timeout=timeout)

    async def connect_get_uri(self, *, timeout: float | None = None) -> str:
        return await self.call(110, (), timeout=timeout)

    async def storage_vol_create_xml_from(
        self,
        pool: StoragePool,
        xml: str,
        clonevol: StorageVol,
        flags: int = 0,
        *,
        timeout: float | None = None,
    ) -> StorageVol:
        return await self.call(125, (pool, xml, clonevol, flags), timeout=timeout)

    async def domain_is_active(self, dom: Domain, *, timeout: float | None = None) -> int:
        return await self.call(150, (dom,), timeout=timeout)

    async def connect_get_lib_version(self, *, timeout: float | None = None) -> int:
        return await self.call(157, (), timeout=timeout)

    async def domain_create_with_flags(
        self, dom: Domain, flags: int = 0, *, timeout: float | None = None
    ) -> Domain:
        return await self.call(196, (dom, flags), timeout=timeout)

    async def domain_get_state(
        self, dom: Domain, flags: int = 0, *, timeout: float | None = None
    ) -> DomainGetStateRet:
        return await self.call(212, (dom, flags), timeout=timeout)

    async def domain_undefine_flags(
        self, dom: Domain, flags: int = 0, *, timeout: float | None = None
    ) -> None:
        return await self.call(231, (dom, flags), timeout=timeout)

    async def domain_destroy_flags(
        self, dom: Domain, flags: int = 0, *, timeout: float | None = None
    ) -> None:
        return await self.call(234, (dom, flags), timeout=timeout)

    async def domain_shutdown_flags(
        self, dom: Domain, flags: int = 0, *, timeout: float | None = None
    ) -> None:
        return await self.call(258, (dom, flags), timeout=timeout)

    async def storage_vol_resize(
        self, vol: StorageVol, capacity: int, flags: int = 0, *, timeout: float | None = None
    ) -> None:
        return await self.call(260, (vol, capacity, flags), timeout=timeout)

    async def domain_set_metadata(
        self,
        dom: Domain,
        type_: int,
        metadata: str | None,
        key: str | None,
        uri: str | None,
        flags: int = 0,
        *,
        timeout: float | None = None,
    ) -> None:
        return await self.call(264, (dom, type_, metadata, key, uri, flags), timeout=timeout)

    async def domain_get_metadata(
        self, dom: Domain, type_: int, uri: str | None, flags: int = 0, *, timeout: float | None = None
    ) -> str:
        return await self.call(265, (dom, type_, uri, flags), timeout=timeout)

    async def connect_list_all_domains(
        self, need_results: int = 1, flags: int = 0, *, timeout: float | None = None
    ) -> ConnectListAllDomainsRet:
        return await self.call(273, (need_results, flags), timeout=timeout)

    async def connect_list_all_storage_pools(
        self, need_results: int = 1, flags: int = 0, *, timeout: float | None = None
    ) -> ConnectListAllStoragePoolsRet:
        return await self.call(281, (need_results, flags), timeout=timeout)

    async def storage_pool_list_all_volumes(
        self, pool: StoragePool, need_results: int = 1, flags: int = 0, *, timeout: float | None = None
    ) -> StoragePoolListAllVolumesRet:
        return await self.call(282, (pool, need_results, flags), timeout=timeout)

    async def connect_domain_event_callback_register_any(
        self, event_id: int, dom: Domain | None = None, *, timeout: float | None = None
    ) -> int:
        return await self.call(316, (event_id, dom), timeout=timeout)

    async def connect_domain_event_callback_deregister_any(
        self, callback_id: int, *, timeout: float | None = None
    ) -> None:
        return await self.call(317, (callback_id,), timeout=timeout)

    async def domain_define_xml_flags(
        self, xml: str, flags: int = 0, *, timeout: float | None = None
    ) -> Domain:
        return await self.call(350, (xml, flags), timeout=timeout)

    async def domain_interface_addresses(
        self, dom: Domain, source: int, flags: int = 0, *, timeout: float | None = None
    ) -> tuple[DomainInterface, ...]:
        return await self.call(353, (dom, source, flags), timeout=timeout)

    async def storage_vol_get_info_flags(
        self, vol: StorageVol, flags: int = 0, *, timeout: float | None = None
    ) -> StorageVolGetInfoRet:
        return await self.call(378, (vol, flags), timeout=timeout)
