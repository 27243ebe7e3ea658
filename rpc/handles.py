"""The object handles callers pass around, written by hand because they carry helpers (uuid_str, a
readable repr). The generator builds their codecs from the .x and checks these fields match it.

Handles are what the daemon returned; pass them back unchanged (the daemon finds a domain by its UUID
and a volume by pool name + volume name).
"""

from __future__ import annotations

import uuid as _uuid
from dataclasses import dataclass, field


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
    """remote_nonnull_network."""

    name: str
    uuid: bytes = field(repr=False)
