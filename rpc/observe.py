"""The observer hook: one record per call, so a caller can log or measure every RPC.

The rpc package never logs calls itself (it knows nothing of the operator's logger or levels); it hands
each finished call to `observer(record)`. Records carry the decoded arguments by their protocol names,
except stream payloads: an upload's data is never put in a record, only its byte count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import LibvirtError
from .types import Domain, StoragePool, StorageVol


@dataclass(frozen=True)
class CallRecord:
    """One finished call.

    `procedure` is the protocol name ("DOMAIN_LOOKUP_BY_NAME"), `method` the client method
    ("domain_lookup_by_name"), `args` the arguments by protocol name, `result` the decoded return value
    (None on error; for streams the number of bytes moved), `error` the exception raised (None on
    success), `duration` seconds from send to reply (for streams: to the end of the transfer).
    """

    procedure: str
    method: str
    args: Mapping[str, Any] = field(repr=False)
    result: Any = field(repr=False)
    error: BaseException | None
    duration: float

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def identifiers(self) -> dict[str, str]:
        """The objects the call named: `domain`, `pool`, `volume` (from arguments, else from the result)."""
        ids: dict[str, str] = {}
        for name, value in self.args.items():
            _add_ids(ids, value)
            if name == "name" and isinstance(value, str):
                key = _NAME_KIND.get(self.procedure)
                if key:
                    ids.setdefault(key, value)
        if self.error is None:
            _add_ids(ids, self.result)
        return ids

    @property
    def libvirt_error(self) -> LibvirtError | None:
        return self.error if isinstance(self.error, LibvirtError) else None


_NAME_KIND = {
    "DOMAIN_LOOKUP_BY_NAME": "domain",
    "STORAGE_POOL_LOOKUP_BY_NAME": "pool",
    "STORAGE_VOL_LOOKUP_BY_NAME": "volume",
}


def _add_ids(ids: dict[str, str], value: Any) -> None:
    if isinstance(value, Domain):
        ids.setdefault("domain", value.name)
    elif isinstance(value, StoragePool):
        ids.setdefault("pool", value.name)
    elif isinstance(value, StorageVol):
        ids.setdefault("pool", value.pool)
        ids.setdefault("volume", value.name)


Observer = Callable[[CallRecord], None]
