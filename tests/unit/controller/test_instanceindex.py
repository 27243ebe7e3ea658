"""The instance index (controller/instanceindex.py) answers exactly what `hostevents.keys_for`'s scan
answers: a table of what an object contributes, a table of updates (a reference moving, a replacement
starting and ending, a delete), and a property test replaying random updates against both over random
status shapes. Then the controller keeping it from the informer's events (and from the store when it
starts); the controller acting on host events over it: test_hostevents.py, test_host_back.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress_kvm.controller.hostevents import keys_for
from egress_kvm.controller.instanceindex import InstanceIndex, Ref, refs_of
from egress_kvm.controller.manager import Controller
from egress_kvm.controller.outcome import Result
from egress_kvm.kube.interfaces import Key, Obj, key_of

from .conftest import eventually
from .fakekube import FakeKube

P, Q = "p", "q"


def obj(**status: object) -> Obj:
    return {"metadata": {"name": "x"}, "status": status}


def ref(name: object = "vm", zone: object = "z0", **more: object) -> dict[str, object]:
    return {"name": name, "zone": zone, **more}


@pytest.mark.parametrize(("o", "refs"), [
    (None, set()),
    ({"metadata": {}}, set()),
    (obj(), set()),
    (obj(instance=ref(provider=P)), {Ref(P, "z0", "vm")}),
    (obj(instance=ref()), {Ref(None, "z0", "vm")}),  # written before `provider` existed: any provider
    (obj(instance=ref(provider="")), {Ref(None, "z0", "vm")}),  # empty: any provider, as keys_for has it
    (obj(instance=ref(provider=None)), set()),  # null never equals a provider's name
    (obj(instance=ref(provider=P), previousInstance=ref("old", "z1", provider=P)),
     {Ref(P, "z0", "vm"), Ref(P, "z1", "old")}),
    (obj(instance=ref(provider=P), previousInstance=ref(provider=P)), {Ref(P, "z0", "vm")}),  # counted once
    (obj(instance=ref(name=None, provider=P)), {Ref(P, "z0", None)}),  # zone-wide lookups only
    (obj(instance={"zone": "z0"}), {Ref(None, "z0", None)}),
    (obj(instance=ref(zone=None)), set()),
    (obj(instance={"name": "vm"}), set()),  # no zone: no lookup names it
    (obj(instance=ref(zone=3)), set()),
    (obj(instance="vm"), set()),  # not a dict: ignored
    (obj(instance=["vm"], previousInstance=ref(provider=Q)), {Ref(Q, "z0", "vm")}),
    (obj(instance={}), set()),
    ({"status": ["not", "an", "object"]}, set()),  # keys_for would raise; the CRD's schema forbids it
])
def test_what_an_object_contributes(o: Obj | None, refs: set[Ref]) -> None:
    assert refs_of(o) == refs


A, B, C = ("ns", "a"), ("ns", "b"), ("ns", "c")


@pytest.mark.parametrize(("steps", "lookups"), [
    # a Proxy's instance recorded, then replaced on another zone: while the replacement runs, both
    ([(A, obj(instance=ref(provider=P)))], {(P, "z0", "vm"): [A], (P, "z0", None): [A], (Q, "z0", "vm"): []}),
    ([(A, obj(instance=ref(provider=P))),
      (A, obj(instance=ref("new", "z1", provider=P), previousInstance=ref(provider=P)))],
     {(P, "z0", "vm"): [A], (P, "z1", "new"): [A], (P, "z1", None): [A], (P, "z0", None): [A]}),
    # ... and once it is done the old one is nobody's
    ([(A, obj(instance=ref(provider=P))),
      (A, obj(instance=ref("new", "z1", provider=P), previousInstance=ref(provider=P))),
      (A, obj(instance=ref("new", "z1", provider=P)))],
     {(P, "z0", "vm"): [], (P, "z0", None): [], (P, "z1", "new"): [A]}),
    # the same name twice (instance and previousInstance) and one of them goes: still found
    ([(A, obj(instance=ref(provider=P), previousInstance=ref(provider=P))),
      (A, obj(instance=ref(provider=P)))], {(P, "z0", "vm"): [A], (P, "z0", None): [A]}),
    # two refs on one zone, one goes: still on the zone
    ([(A, obj(instance=ref("x", provider=P), previousInstance=ref("y", provider=P))),
      (A, obj(instance=ref("x", provider=P)))],
     {(P, "z0", None): [A], (P, "z0", "y"): [], (P, "z0", "x"): [A]}),
    # deleted (None), or its status emptied
    ([(A, obj(instance=ref(provider=P))), (B, obj(instance=ref(provider=P))), (A, None)],
     {(P, "z0", "vm"): [B], (P, "z0", None): [B]}),
    ([(A, obj(instance=ref(provider=P))), (A, obj())], {(P, "z0", "vm"): [], (P, "z0", None): []}),
    # a legacy reference (no provider) answers every provider, beside an exact one
    ([(A, obj(instance=ref())), (B, obj(instance=ref(provider=P))), (C, obj(instance=ref(provider=Q)))],
     {(P, "z0", "vm"): [A, B], (Q, "z0", "vm"): [A, C], ("", "z0", "vm"): [A], (P, "z0", None): [A, B]}),
    # the same object again changes nothing; a delete of a key never seen is harmless
    ([(A, obj(instance=ref(provider=P))), (A, obj(instance=ref(provider=P))), (C, None)],
     {(P, "z0", "vm"): [A]}),
])
def test_updates_and_lookups(steps: list[tuple[Key, Obj | None]],
                             lookups: dict[tuple[str, str, str | None], list[Key]]) -> None:
    index = InstanceIndex()
    store: dict[Key, Obj] = {}
    for key, o in steps:
        index.put(key, o)
        if o is None:
            store.pop(key, None)
        else:
            store[key] = o
    for (provider, zone, name), keys in lookups.items():
        assert index.keys(provider=provider, zone=zone, name=name) == keys
        assert sorted(keys_for(provider=provider, zone=zone, name=name, proxies=store.items())) == keys


# --- the index against the scan, over random stores ---------------------------------------------------

PROVIDERS = ["p", "q", ""]
ZONES = ["z0", "z1"]
NAMES = ["a", "b"]
# Mostly references that some lookup matches, with the odd shapes among them (nulls, numbers, absences).
_PROVIDER = st.sampled_from([*PROVIDERS, None, 1])
_ZONE = st.sampled_from([*ZONES, *ZONES, None, 1])
_NAME = st.sampled_from([*NAMES, None, 1])
ON_A_ZONE = st.fixed_dictionaries({"zone": _ZONE}, optional={"provider": _PROVIDER, "name": _NAME})
ANY_DICT = st.fixed_dictionaries({}, optional={"provider": _PROVIDER, "zone": _ZONE, "name": _NAME})
REF = st.one_of(ON_A_ZONE, ON_A_ZONE, ON_A_ZONE, ANY_DICT, st.sampled_from([None, "", "a", 0, [], ["a"], {}]))
STATUS = st.fixed_dictionaries({}, optional={"instance": REF, "previousInstance": REF})
OBJ = st.one_of(st.none(), st.just({"metadata": {}}), *[st.builds(lambda s: {"metadata": {}, "status": s},
                                                                   STATUS)] * 4)
KEYS = st.sampled_from([("ns", str(i)) for i in range(6)])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(KEYS, OBJ), max_size=25))
def test_the_index_answers_what_the_scan_answers(updates: list[tuple[Key, Any]]) -> None:
    index = InstanceIndex()
    store: dict[Key, Obj] = {}
    for key, o in updates:
        if o is None:
            index.drop(key)
            store.pop(key, None)
        else:
            index.put(key, o)
            store[key] = o
        for provider in PROVIDERS:
            for zone in ZONES:
                for name in (None, *NAMES):
                    scanned = keys_for(provider=provider, zone=zone, name=name, proxies=store.items())
                    assert len(scanned) == len(set(scanned))
                    assert index.keys(provider=provider, zone=zone, name=name) == sorted(scanned)
    assert len(index) == sum(1 for o in store.values() if refs_of(o))


# --- the controller keeps it from the informer's events ------------------------------------------------

def at(name: str, zone: str = "z0") -> dict[str, str]:
    return {"name": name, "zone": zone, "provider": P}


async def test_the_controller_follows_each_proxys_instance_through_its_events(kube: FakeKube) -> None:
    c = Controller(kube=kube, store=kube, providers={})
    created = kube.create_proxy("px1", {"mode": "Managed", "provider": P})
    key = key_of(created)
    c.on_event("ADDED", created)
    assert c._zone_keys(P, "z0", None) == []
    c.on_event("MODIFIED", {**created, "status": {"instance": at("vm1")}})
    assert c._zone_keys(P, "z0", "vm1") == [key]
    replacing = {"instance": at("vm2", "z1"), "previousInstance": at("vm1")}
    c.on_event("MODIFIED", {**created, "status": replacing})
    assert c._zone_keys(P, "z0", "vm1") == [key] and c._zone_keys(P, "z1", "vm2") == [key]
    c.on_event("MODIFIED", {**created, "status": {"instance": at("vm2", "z1")}})
    assert c._zone_keys(P, "z0", "vm1") == [] and c._zone_keys(P, "z0", None) == []
    assert c._zone_keys(P, "z1", None) == [key]
    c.on_event("DELETED", {**created, "status": {"instance": at("vm2", "z1")}})
    assert c._zone_keys(P, "z1", "vm2") == [] and c._zone_keys(P, "z1", None) == []
    await c.stop(timeout=0)


async def no_reconcile(key: Key, *, routine: bool = False) -> Result:
    return Result()


async def test_a_store_filled_before_the_controller_heard_of_it_is_indexed_when_it_starts(
        kube: FakeKube) -> None:
    """FakeKube replays nothing to a late watcher (the real informer's first list does): what the
    store holds when the controller starts is indexed from the store."""
    for i in range(3):
        kube.create_proxy(f"px{i}", {"mode": "Managed", "provider": P})
        kube.objects[("default", f"px{i}")]["status"] = {"instance": at(f"vm{i}")}
    c = Controller(kube=kube, store=kube, providers={})
    c.reconciler.reconcile = no_reconcile  # type: ignore[method-assign]  # only the index is looked at
    assert c._zone_keys(P, "z0", None) == []
    task = asyncio.get_running_loop().create_task(c.run())
    await eventually(lambda: c._tasks != [], what="started")
    assert c._zone_keys(P, "z0", "vm1") == [("default", "px1")]
    assert c._zone_keys(P, "z0", None) == [("default", f"px{i}") for i in range(3)]
    await c.stop(timeout=0)
    await asyncio.wait_for(task, 5)
