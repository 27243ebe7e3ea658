"""The protocol's structs as frozen dataclasses, with the protocol's field names in snake_case.

Object handles (Domain, StoragePool, StorageVol) are what the daemon returned; pass them back unchanged
(the daemon finds a domain by its UUID and a volume by pool name + volume name). Return structs with more
than one field are the `*Ret` classes, named after the protocol's `remote_*_ret` struct.
"""

from __future__ import annotations

import uuid as _uuid
from dataclasses import dataclass, field

# -- object handles ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Domain:
    """remote_nonnull_domain. `id` is -1 while the domain is inactive."""

    name: str
    uuid: bytes = field(repr=False)
    id: int = -1

    @property
    def uuid_str(self) -> str:
        return str(_uuid.UUID(bytes=self.uuid))

    def __repr__(self) -> str:
        return f"Domain(name={self.name!r}, uuid={self.uuid_str!r}, id={self.id})"


@dataclass(frozen=True)
class StoragePool:
    """remote_nonnull_storage_pool."""

    name: str
    uuid: bytes = field(repr=False)

    @property
    def uuid_str(self) -> str:
        return str(_uuid.UUID(bytes=self.uuid))

    def __repr__(self) -> str:
        return f"StoragePool(name={self.name!r}, uuid={self.uuid_str!r})"


@dataclass(frozen=True)
class StorageVol:
    """remote_nonnull_storage_vol; the daemon resolves it by `pool` + `name` (the pool must be active)."""

    pool: str
    name: str
    key: str


@dataclass(frozen=True)
class Network:
    """remote_nonnull_network (only seen inside remote_error)."""

    name: str
    uuid: bytes = field(repr=False)


# -- errors and events --------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteError:
    """remote_error, in wire order."""

    code: int
    domain: int
    message: str | None
    level: int
    dom: Domain | None
    str1: str | None
    str2: str | None
    str3: str | None
    int1: int
    int2: int
    net: Network | None


@dataclass(frozen=True)
class LifecycleEvent:
    """remote_domain_event_callback_lifecycle_msg, flattened: {callbackID, msg: {dom, event, detail}}."""

    callback_id: int
    dom: Domain
    event: int
    detail: int


# -- return structs with more than one field ---------------------------------------------------


@dataclass(frozen=True)
class NodeGetInfoRet:
    """`model` is char[32] on the wire, trimmed at the first NUL; `memory` in KiB."""

    model: str
    memory: int
    cpus: int
    mhz: int
    nodes: int
    sockets: int
    cores: int
    threads: int


@dataclass(frozen=True)
class StoragePoolGetInfoRet:
    """Sizes in bytes; `state` a StoragePoolState value."""

    state: int
    capacity: int
    allocation: int
    available: int


@dataclass(frozen=True)
class StorageVolGetInfoRet:
    """Sizes in bytes; `type_` (protocol `type`) a StorageVolType value."""

    type_: int
    capacity: int
    allocation: int


@dataclass(frozen=True)
class DomainGetStateRet:
    state: int
    reason: int


@dataclass(frozen=True)
class ConnectListAllDomainsRet:
    domains: tuple[Domain, ...]
    ret: int


@dataclass(frozen=True)
class ConnectListAllStoragePoolsRet:
    pools: tuple[StoragePool, ...]
    ret: int


@dataclass(frozen=True)
class StoragePoolListAllVolumesRet:
    vols: tuple[StorageVol, ...]
    ret: int


@dataclass(frozen=True)
class DomainIPAddr:
    """remote_domain_ip_addr; `type_` (protocol `type`) is IPAddrType (0 v4, 1 v6)."""

    type_: int
    addr: str
    prefix: int


@dataclass(frozen=True)
class DomainInterface:
    """remote_domain_interface; DOMAIN_INTERFACE_ADDRESSES returns a tuple of these."""

    name: str
    hwaddr: str | None
    addrs: tuple[DomainIPAddr, ...]
