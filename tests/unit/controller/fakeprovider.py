"""A small in-memory Provider for the controller's unit tests.

It keeps the Provider protocol's promises (create idempotent by name, get None only for a VM that is not
there, TransientError for an unreachable zone, delete of a missing VM succeeds) and lets a test play the
world: power a VM off, make it vanish, cut a zone off, run out of capacity, hold a create mid-flight.
Created VMs get the address `ip_for(name)` (127.0.0.x, where the tests' proxy listens).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime

from egress_kvm.providers.base import (
    CreateRequest,
    HostUnreachable,
    Instance,
    NotOwned,
    PermanentError,
    Placement,
    PowerState,
    ProgressCallback,
    QuotaError,
    ResolvedPlacement,
    TransientError,
)


class FakeProvider:
    def __init__(self, name: str = "kvm-home", *, zones: tuple[str, ...] = ("nas1",),
                 machine_types: tuple[str, ...] = ("small", "large"),
                 images: tuple[str, ...] = ("debian-13",), ip: str | None = "127.0.0.1") -> None:
        self.name = name
        self._zones = list(zones)
        self.machine_types = machine_types
        self.images = images
        self.ip_for: Callable[[str], str | None] = lambda _name: ip
        self.vms: dict[tuple[str, str], Instance] = {}  # (zone, name)
        self.user_data: dict[str, bytes] = {}
        self.calls: list[tuple[str, str]] = []
        self.unreachable: set[str] = set()
        self.capacity: int | None = None  # max VMs per zone
        self.hold_create: asyncio.Event | None = None  # set -> creates wait for it
        self.create_started = asyncio.Event()
        self.list_fails: set[str] = set()
        self.closed = False

    # --- Provider -----------------------------------------------------------------------------------

    def zones(self) -> list[str]:
        return list(self._zones)

    def resolve(self, placement: Placement) -> ResolvedPlacement:
        zone = placement.zone
        if zone is None:
            if len(self._zones) != 1:
                raise PermanentError(f"zone is required: provider {self.name} has hosts "
                                     f"{', '.join(self._zones)}")
            zone = self._zones[0]
        if zone not in self._zones:
            raise PermanentError(f"zone {zone!r} is not a host of provider {self.name}")
        mt = placement.machine_type or self.machine_types[0]
        if mt not in self.machine_types:
            raise PermanentError(f"machineType {mt!r} is not defined in provider {self.name}")
        image = placement.image or self.images[0]
        if image not in self.images and not image.startswith(("http://", "https://")):
            raise PermanentError(f"image {image!r} is neither an image key nor an http(s) URL")
        return ResolvedPlacement(zone=zone, machine_type=mt, image=image)

    def connected(self, zone: str) -> bool:
        """A session is taken as held to every reachable zone of the fake."""
        return zone in self._zones and zone not in self.unreachable

    async def create(self, request: CreateRequest, *, progress: ProgressCallback | None = None) -> Instance:
        zone = request.placement.zone
        self._reach(zone, "create", request.name)
        existing = self.vms.get((zone, request.name))
        if existing is not None:
            self._check_owner(existing, request.owner_uid, "reuse")
            if existing.power_state is not PowerState.RUNNING:
                await self.start(request.name, zone)
            return dataclasses.replace(self.vms[(zone, request.name)], existed=True)
        if self.capacity is not None and sum(1 for z, _ in self.vms if z == zone) >= self.capacity:
            raise QuotaError(f"host {zone}: not enough free memory for {request.name}")
        self.create_started.set()
        if progress is not None:
            await progress("fetching base image debian-13: 50%")
        if self.hold_create is not None:
            await self.hold_create.wait()
        self.user_data[request.name] = request.user_data
        inst = Instance(name=request.name, zone=zone, power_state=PowerState.RUNNING,
                        ip=self.ip_for(request.name), owner_uid=request.owner_uid,
                        created_at=datetime.now(UTC), owner_namespace=request.owner_namespace,
                        owner_name=request.owner_name)
        self.vms[(zone, request.name)] = inst
        return inst

    async def get(self, name: str, zone: str, *, owner_uid: str | None = None) -> Instance | None:
        self._reach(zone, "get", name)
        inst = self.vms.get((zone, name))
        self._check_owner(inst, owner_uid, "manage")
        return inst

    async def start(self, name: str, zone: str) -> None:
        self._reach(zone, "start", name)
        inst = self.vms.get((zone, name))
        if inst is None:
            raise PermanentError(f"no instance {name} on {zone}")
        self.vms[(zone, name)] = dataclasses.replace(inst, power_state=PowerState.RUNNING, message="")

    async def delete(self, name: str, zone: str, *, owner_uid: str | None = None) -> None:
        self._reach(zone, "delete", name)
        self._check_owner(self.vms.get((zone, name)), owner_uid, "delete")
        self.vms.pop((zone, name), None)

    @staticmethod
    def _check_owner(inst: Instance | None, owner_uid: str | None, action: str) -> None:
        """As the KVM provider's metadata check (tests/unit/provider/test_ownership.py proves that one)."""
        if inst is not None and owner_uid and inst.owner_uid and inst.owner_uid != owner_uid:
            raise NotOwned(f"instance {inst.name!r} belongs to another Proxy (owner uid {inst.owner_uid}, "
                           f"not {owner_uid}); refusing to {action} it")

    async def list_managed(self, zone: str | None = None) -> list[Instance]:
        zones = [zone] if zone else self._zones
        for z in zones:
            self._reach(z, "list", "")
            if z in self.list_fails:
                raise TransientError(f"host {z}: listing failed")
        return [i for (z, _), i in self.vms.items() if z in zones]

    async def close(self) -> None:
        self.closed = True

    # --- test controls ------------------------------------------------------------------------------

    def power(self, name: str, state: PowerState, message: str = "") -> None:
        for (z, n), inst in self.vms.items():
            if n == name:
                self.vms[(z, n)] = dataclasses.replace(inst, power_state=state, message=message)

    def vanish(self, name: str) -> None:
        for k in [k for k in self.vms if k[1] == name]:
            del self.vms[k]

    def names(self) -> set[str]:
        return {n for _, n in self.vms}

    def plant(self, inst: Instance) -> None:
        self.vms[(inst.zone, inst.name)] = inst

    def _reach(self, zone: str, op: str, name: str) -> None:
        self.calls.append((op, name))
        if zone in self.unreachable:
            raise HostUnreachable(f"host {zone}: ssh: connect to 10.231.0.9:22: connection refused")
