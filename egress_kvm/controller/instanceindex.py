"""Which Proxies record an instance: `hostevents.keys_for`'s answer in O(1) per lookup, not a scan.

Every lifecycle event a host sends (several per Proxy created) asks which Proxies record the instance
it names. Scanning every cached Proxy per event made a ramp of N Proxies cost O(N^2) in the operator's
CPU (issue 8: 1,000 Proxies). This index is kept by the controller from the informer's events (each
event carries the object as the cache now holds it, delivered before anything else can read the cache;
a relist delivers its differences, so the initial list, a relist and a restart all go through `put` and
`drop`). The controller seeds it from the store when it starts too, so a store filled before its
handler was attached is indexed as well.

The matching rules are `keys_for`'s, exactly (tests/unit/controller/test_instanceindex.py compares the
two over random stores): a reference is `status.instance` or `status.previousInstance`; a non-dict one
counts for nothing; a reference without `provider` (or with an empty one) matches any provider; a
lookup without a name matches every reference on the zone. Only where `keys_for` would raise (a
`status` that is not an object, which the CRD's schema rules out) does the index see no references.

It lives beside hostevents.py because what a reference means is the controller's business (the informer
only lists and watches objects); the index only makes `keys_for` cheap.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from egress_kvm.kube.interfaces import Key, Obj

from .hostevents import INSTANCE_FIELDS


@dataclass(frozen=True, slots=True)
class Ref:
    """One recorded instance reference, as the index files it."""

    provider: str | None  # None: any provider (the reference names none, or an empty one)
    zone: str
    name: str | None  # None: not a string, so no named lookup can match it (zone-wide ones do)


ZoneSlot = tuple[str | None, str]  # (provider or None, zone)
NameSlot = tuple[str | None, str, str]  # (provider or None, zone, name)
S = TypeVar("S", ZoneSlot, NameSlot)


def refs_of(obj: Obj | None) -> frozenset[Ref]:
    """The references of `obj` that some lookup can match (keys_for's rules; see the module docstring).
    A zone or a provider that is not a string never equals the string an event carries: left out."""
    status = (obj or {}).get("status") or {}
    if not isinstance(status, dict):
        return frozenset()
    out: set[Ref] = set()
    for field in INSTANCE_FIELDS:
        ref = status.get(field) or {}
        if not isinstance(ref, dict):
            continue
        zone = ref.get("zone")
        provider = ref.get("provider", "")
        if not isinstance(zone, str) or not isinstance(provider, str):
            continue
        name = ref.get("name")
        out.add(Ref(provider or None, zone, name if isinstance(name, str) else None))
    return frozenset(out)


def zone_slots(refs: Iterable[Ref]) -> frozenset[ZoneSlot]:
    return frozenset((r.provider, r.zone) for r in refs)


def name_slots(refs: Iterable[Ref]) -> frozenset[NameSlot]:
    return frozenset((r.provider, r.zone, r.name) for r in refs if r.name is not None)


class InstanceIndex:
    """Key -> its references, and the two inverse maps lookups read. `put` and `drop` cost the size of
    one object's references; `keys` the number of keys it returns."""

    def __init__(self) -> None:
        self._refs: dict[Key, frozenset[Ref]] = {}
        self._by_zone: dict[ZoneSlot, set[Key]] = {}
        self._by_name: dict[NameSlot, set[Key]] = {}

    def put(self, key: Key, obj: Obj | None) -> None:
        """`key` is now `obj` (None: gone). What it recorded before is the index's own memory, so a
        repeated or missed-and-resent object leaves it right."""
        new = refs_of(obj)
        old = self._refs.get(key, frozenset())
        if new == old:
            return
        if new:
            self._refs[key] = new
        else:
            self._refs.pop(key, None)
        _move(self._by_zone, key, zone_slots(old), zone_slots(new))
        _move(self._by_name, key, name_slots(old), name_slots(new))

    def drop(self, key: Key) -> None:
        self.put(key, None)

    def keys(self, *, provider: str, zone: str, name: str | None) -> list[Key]:
        """keys_for's answer (sorted): the keys recording an instance on `provider`/`zone`, named `name`
        (None: any name)."""
        if name is None:
            found = _union(self._by_zone.get((provider, zone)), self._by_zone.get((None, zone)))
        else:
            found = _union(self._by_name.get((provider, zone, name)), self._by_name.get((None, zone, name)))
        return sorted(found)

    def __len__(self) -> int:
        """Keys with at least one reference."""
        return len(self._refs)


def _move(slots: dict[S, set[Key]], key: Key, old: frozenset[S], new: frozenset[S]) -> None:
    for slot in old - new:
        keys = slots[slot]
        keys.discard(key)
        if not keys:
            del slots[slot]
    for slot in new - old:
        slots.setdefault(slot, set()).add(key)


def _union(a: set[Key] | None, b: set[Key] | None) -> set[Key]:
    if a is None:
        return set(b or ())
    return a | b if b else set(a)
