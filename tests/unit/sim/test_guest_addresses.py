"""A simulated host hands a gone guest's address to a new guest only once the address's neighbour entry
is gone: until then the kernel still maps it to the old guest's MAC (testbed/sim/host.py)."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest

from rpc.constants import DomainState
from testbed.sim.host import Guest, SimHost
from testbed.sim.knobs import Knobs
from testbed.sim.model import Domain, Hypervisor
from testbed.sim.neigh import NeighbourError, Op, Request


class HeldNeighbours:
    """The kernel's neighbour table behind a gate: each request waits for `answer` (then fails with
    `refuse`, if set); `sent` holds the requests as they were sent."""

    def __init__(self) -> None:
        self.sent: list[Request] = []
        self.answer = asyncio.Event()
        self.refuse: int | None = None

    async def apply(self, request: Request) -> None:
        self.sent.append(request)
        await self.answer.wait()
        if self.refuse is not None:
            raise NeighbourError(self.refuse, f"{request.command()}: refused")

    def close(self) -> None:
        pass


def running_guest(host: SimHost, name: str, mac: str, *, static: str | None = None) -> str:
    """A booted guest, as SimHost._boot leaves it: the pool's next address, or its `static` one."""
    dom = Domain(name, name.encode().ljust(16, b"\0"), "<domain/>", 64, mac, {},
                 state=DomainState.RUNNING, id=1)
    host.hyp.domains[name] = dom
    guest = host.guests[name] = Guest()
    if static is not None and static in host.free_ips:
        host.free_ips.remove(static)
    guest.ip = static or host.free_ips.pop(0)
    return guest.ip


def held_host(tmp_path: Path) -> tuple[SimHost, HeldNeighbours]:
    """A simulated host on a small network whose neighbour requests wait for the test's word."""
    host = SimHost(Hypervisor("h1"), Knobs(), socket_path=str(tmp_path / "sock"),
                   guest_network="10.99.0.0/29")
    host.bridge = "br-sim"
    kernel = host.neighbours = HeldNeighbours()  # type: ignore[assignment]
    return host, kernel


@pytest.mark.parametrize("refuse", [None, errno.ENOENT, errno.ENODEV], ids=["deleted", "absent", "refused"])
async def test_a_released_address_is_free_again_only_after_its_neighbour_delete(
        tmp_path: Path, refuse: int | None) -> None:
    host, kernel = held_host(tmp_path)
    ip = running_guest(host, "vm1", "52:54:00:00:00:01")
    host.hyp.shut_off("vm1")
    await asyncio.sleep(0.01)
    assert kernel.sent == [Request(Op.DELETE, ip, "br-sim")]
    assert ip not in host.free_ips  # the old entry still stands: no new guest may take the address
    kernel.refuse = refuse
    kernel.answer.set()
    await host.close()
    assert host.free_ips[0] == ip  # the next guest's (also after a refusal: the pool does not shrink)


async def test_an_address_a_guest_took_meanwhile_is_not_freed_twice(tmp_path: Path) -> None:
    """A static address is taken whether the pool holds it or not: the delete finishing later must not put
    it back in the pool under the guest holding it (the deferred return above must check)."""
    host, kernel = held_host(tmp_path)
    ip = running_guest(host, "vm1", "52:54:00:00:00:01")
    host.hyp.shut_off("vm1")
    await asyncio.sleep(0.01)
    running_guest(host, "vm2", "52:54:00:00:00:02", static=ip)  # its seed names the address
    kernel.answer.set()
    await host.close()
    assert ip not in host.free_ips
