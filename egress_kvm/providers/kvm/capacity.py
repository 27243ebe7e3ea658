"""Quota and capacity: the conditions that mean "out of room" rather than "try again soon".

The spec lists no capacity detection as a known gap; this closes it. Each case raises QuotaError naming
the host, the pool and the figures, so the reconciler backs off slowly and the message tells the user
what to free: pool space below what the overlay and seed need (the overlay counted at its full
`diskSizeGb`, since a thin disk may grow to it), host free memory below the machine type's memory,
"No space left on device" from libvirt, and a domain paused with reason I/O error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from egress_kvm.providers.base import QuotaError
from rpc.errors import LibvirtError

if TYPE_CHECKING:
    from rpc.types import StoragePool

    from .hosts import Host

GIB = 1024**3
MIB = 1024**2


def fmt_bytes(n: int) -> str:
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.1f} MiB"


def is_no_space(err: BaseException) -> bool:
    return isinstance(err, LibvirtError) and "no space left on device" in (err.message or "").lower()


def no_space(err: LibvirtError, *, host: str, pool: str, available: int | None, action: str) -> QuotaError:
    figures = f"; pool available {fmt_bytes(available)}" if available is not None else ""
    return QuotaError(f"host {host!r} pool {pool!r} is out of space while {action}: {err.message}{figures}")


def check_pool_space(*, host: str, pool: str, available: int, needed: int, what: str,
                     reserve: int = 0) -> None:
    """`reserve` (poolReserveGb) stays free: the host needs room of its own (logs, qcow2 growth)."""
    if available - reserve < needed:
        kept = f" ({fmt_bytes(reserve)} of it kept in reserve, poolReserveGb)" if reserve else ""
        raise QuotaError(f"host {host!r} pool {pool!r} has {fmt_bytes(available)} available{kept}, "
                         f"{what} needs {fmt_bytes(needed)}")


async def refreshed_available(host: Host, pool: StoragePool) -> int:
    """The pool's free bytes after a refresh: libvirt's figure changes only on refresh, so without one
    space freed outside libvirt stays invisible and a full pool never recovers on its own. A refusal
    (an upload in progress on that pool) leaves libvirt's last figure, which is then the best we have."""
    try:
        await host.call("storage_pool_refresh", lambda lv: lv.storage_pool_refresh(pool, 0))
    except LibvirtError as exc:
        host.log.v(1).info("pool refresh refused; using libvirt's last figures", pool=pool.name,
                           error=exc.message)
    info = await host.call("storage_pool_get_info", lambda lv: lv.storage_pool_get_info(pool))
    return int(info.available)


def check_free_memory(*, host: str, free_bytes: int, memory_mib: int, machine_type: str) -> None:
    needed = memory_mib * MIB
    if free_bytes < needed:
        raise QuotaError(f"host {host!r} has {fmt_bytes(free_bytes)} free memory, machineType "
                         f"{machine_type!r} needs {memory_mib} MiB")


def paused_on_io_error(*, host: str, pool: str, name: str, available: int | None,
                       needed: int | None = None) -> QuotaError:
    figures = f"pool available {fmt_bytes(available)}" if available is not None else ""
    if needed is not None:
        figures += f"{', ' if figures else ''}resuming needs {fmt_bytes(needed)}"
    figures = f" ({figures})" if figures else ""
    return QuotaError(f"VM {name!r} on host {host!r} is paused on an I/O error, usually a full pool "
                      f"{pool!r}{figures}; free space in the pool and the operator resumes it")


async def mem_available(host: Host) -> int | None:
    """MemAvailable (bytes) from the host's /proc/meminfo over SSH exec; None if it cannot be read.

    Shared (`Host.shared_exec`): the reconcile workers' creates on one host may all ask at once, and sshd
    opens at most MaxSessions (10 by default) session channels per connection; a refused exec would read
    as no MemAvailable and fail the create with a false QuotaError."""
    from .session import ExecNotAllowed

    try:
        result = await host.shared_exec(["cat", "/proc/meminfo"])
    except ExecNotAllowed:
        return None
    if result.exit_status != 0:
        return None
    for line in result.stdout.splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            parts = value.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * 1024 if parts[1:] == ["kB"] else int(parts[0])
    return None
