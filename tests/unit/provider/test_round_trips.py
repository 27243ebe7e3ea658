"""How many round trips one after another a Create, a Get and a Start make (not how many calls): calls
that do not need each other's answers go out together (providers/kvm/together.py), so a host far away
costs a Create about half the latency it used to. Counted without a clock: every libvirt call waits for
a "wave" the test releases, and the waves a call needs are its sequential round trips."""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from fakes import FakeLibvirtClient, fake_kvm_provider
from fakes.libvirt import FakeHypervisor, lv_error
from provider_helpers import request

from egress_kvm.providers.base import (
    InProgress,
    Instance,
    NotOwned,
    PermanentError,
    PowerState,
    QuotaError,
    TransientError,
)
from egress_kvm.providers.kvm import placement
from egress_kvm.providers.kvm.hosts import reusable
from egress_kvm.providers.kvm.together import Settled, first_failure, settled, together
from rpc.constants import DomainState, ErrorCode
from rpc.errors import LibvirtError
from rpc.handles import Domain
from testbed.sim.model import DOMAIN_SHUTOFF_CRASHED

NAME = "proxy-abc"


async def waves(monkeypatch: pytest.MonkeyPatch, work: Awaitable[Any]) -> tuple[int, list[list[str]]]:
    """Run `work`, releasing the libvirt calls waiting at each moment as one wave; (waves, their calls)."""
    waiting: list[tuple[str, asyncio.Future[None]]] = []
    real = FakeLibvirtClient._call

    async def gated(self: FakeLibvirtClient, method: str, args: tuple[Any, ...], fn: Any) -> Any:
        gate = asyncio.get_running_loop().create_future()
        waiting.append((method, gate))
        await gate
        return await real(self, method, args, fn)

    monkeypatch.setattr(FakeLibvirtClient, "_call", gated)
    task = asyncio.ensure_future(work)
    rounds: list[list[str]] = []
    while not task.done():
        for _ in range(100):  # let every call that can be issued now be issued
            await asyncio.sleep(0)
        if waiting:
            batch, waiting[:] = list(waiting), []
            rounds.append(sorted(m for m, _ in batch))
            for _, gate in batch:
                gate.set_result(None)
    await task
    monkeypatch.setattr(FakeLibvirtClient, "_call", real)
    return len(rounds), rounds


async def test_a_create_makes_seven_round_trips_in_a_row_not_fourteen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    provider, hv = fake_kvm_provider()
    try:
        count, rounds = await waves(monkeypatch, provider.create(request()))
        assert len(hv["host0"].calls) == 14  # the same calls as before (test_rpc_counts_for_create_and_get)
        assert count == 7, rounds
        assert rounds[0] == ["domain_lookup_by_name", "storage_pool_lookup_by_name"]
        assert rounds[-2:] == [["domain_define_xml"], ["domain_create_with_flags"]]
        # Both volumes before the define (which names them), the space and memory checks before both.
        created = next(i for i, r in enumerate(rounds) if "storage_vol_create_xml" in r)
        assert rounds[created].count("storage_vol_create_xml") == 2
        assert all(i < created for i, r in enumerate(rounds) if "node_get_free_memory" in r
                   or "storage_pool_get_info" in r)
    finally:
        await provider.close()


async def test_a_later_create_on_a_host_sends_its_room_reads_with_the_lookup_six_rounds_thirteen_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's handle kept from the first create: the base image check, the pool refresh and the free
    memory go out with the domain lookup, and no pool lookup is made. The order of the guarantees holds:
    both room checks before any volume, both volumes before the define."""
    provider, hv = fake_kvm_provider()
    try:
        await provider.create(request())
        hv["host0"].calls.clear()
        count, rounds = await waves(monkeypatch, provider.create(request(name="proxy-two")))
        assert rounds[0] == ["domain_lookup_by_name", "node_get_free_memory", "storage_pool_refresh",
                             "storage_vol_lookup_by_name", "storage_vol_lookup_by_name"]
        assert rounds[1] == ["storage_pool_get_info", "storage_vol_get_info", "storage_vol_get_path"]
        assert rounds[2:] == [["storage_vol_create_xml", "storage_vol_create_xml"], ["storage_vol_upload"],
                              ["domain_define_xml"], ["domain_create_with_flags"]]
        assert count == 6 and len(hv["host0"].calls) == 13
    finally:
        await provider.close()


async def test_a_pool_defined_again_is_looked_up_afresh_and_the_create_goes_on() -> None:
    """A kept handle gone stale (libvirt resolves it by UUID, drawn anew when the pool is defined again)
    answers NO_STORAGE_POOL: the create forgets it, looks the pool up and makes the VM as the first create
    did; the next one uses the new handle."""
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        h.redefine_pool()
        h.calls.clear()
        inst = await provider.create(request(name="proxy-two"))
        assert inst.name in h.domains and h.calls.count("storage_pool_lookup_by_name") == 1
        assert {v for v in h.volumes if v.startswith("proxy-two")}  # overlay and seed made
        h.calls.clear()
        await provider.create(request(name="proxy-three"))
        assert "storage_pool_lookup_by_name" not in h.calls and len(h.calls) == 13
    finally:
        await provider.close()


async def test_a_create_on_a_kept_handle_raises_what_a_create_without_one_raises() -> None:
    """The same short host, a create with the pool handle kept and one without (a fresh provider): the
    same QuotaError (the checks' order is the sequential one), and neither writes a volume."""
    async def attempt(known: bool) -> str:
        provider, hv = fake_kvm_provider()
        h = hv["host0"]
        try:
            if known:
                await provider.create(request(name="proxy-first"))
            h.outside_usage = h.pool_available()  # the pool full (seen after the refresh)
            h.memory = 0
            written = h.calls.count("storage_vol_create_xml")
            with pytest.raises(QuotaError) as caught:
                await provider.create(request())
            assert h.calls.count("storage_vol_create_xml") == written
            return str(caught.value)
        finally:
            await provider.close()

    assert await attempt(True) == await attempt(False)


async def test_a_get_of_a_running_vm_makes_two_round_trips_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lookup, then the metadata, the state and the address sources at once: the lookup's id says the
    domain runs, and none of the three needs another's answer. The same calls as three rounds made."""
    provider, hv = fake_kvm_provider()
    try:
        await provider.create(request())
        hv["host0"].set_vm_ip(NAME, "192.0.2.7")
        hv["host0"].calls.clear()
        count, rounds = await waves(monkeypatch, provider.get(NAME, "host0"))
        assert rounds == [["domain_lookup_by_name"],
                          ["domain_get_metadata", "domain_get_state", "domain_interface_addresses"]]
        assert count == 2
        assert sorted(hv["host0"].calls) == ["domain_get_metadata", "domain_get_state",
                                             "domain_interface_addresses", "domain_lookup_by_name"]
    finally:
        await provider.close()


async def test_a_get_of_a_stopped_vm_asks_no_address_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """An inactive domain (lookup id -1) has no address to find: the metadata and the state only."""
    provider, hv = fake_kvm_provider()
    try:
        await provider.create(request())
        hv["host0"].shut_off(NAME)
        hv["host0"].exec_log.clear()
        _, rounds = await waves(monkeypatch, provider.get(NAME, "host0"))
        assert rounds == [["domain_lookup_by_name"], ["domain_get_metadata", "domain_get_state"]]
        assert hv["host0"].exec_log == []  # no `ip neigh` either
    finally:
        await provider.close()


class Boom(Exception):
    pass


async def ok(value: int) -> int:
    await asyncio.sleep(0)
    return value


async def fails(message: str, *, turns: int = 0) -> int:
    for _ in range(turns):
        await asyncio.sleep(0)
    raise Boom(message)


@pytest.mark.parametrize(("results", "first"), [
    ((1, 2, 3), None),
    ((1, Boom("a"), 3), "a"),
    ((Boom("a"), Boom("b")), "a"),
    ((1, 2, Boom("c")), "c"),
])
def test_first_failure_is_the_earliest_in_argument_order(results: tuple[object, ...],
                                                         first: str | None) -> None:
    found = first_failure(results)
    assert (str(found) if found is not None else None) == first


async def test_together_raises_the_first_failure_in_order_even_when_a_later_one_fails_first() -> None:
    with pytest.raises(Boom, match=r"^early-in-order$"):
        await together(fails("early-in-order", turns=5), fails("fails-first"))
    assert await together(ok(1), ok(2), ok(3)) == (1, 2, 3)


async def test_a_cancelled_together_returns_only_once_every_call_has_ended() -> None:
    """A reconcile cut off (its timeout, a shutdown) mid-`together`: no call is left running behind it."""
    started: list[int] = []
    ended: list[int] = []

    async def pending(i: int) -> int:
        started.append(i)
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(i)
        return i

    task = asyncio.ensure_future(together(pending(1), pending(2)))
    for _ in range(10):
        await asyncio.sleep(0)
    assert sorted(started) == [1, 2]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(ended) == [1, 2]


@pytest.mark.parametrize(("finished_at", "now", "max_age", "reuse"), [
    (None, 10.0, 1.0, False),  # never ran
    (9.5, 10.0, 1.0, True),
    (9.0, 10.0, 1.0, False),  # exactly max_age old: stale
    (10.0, 10.0, 0.0, False),  # max_age 0 (the default): a finished run serves nobody
    (11.0, 10.0, 5.0, False),  # a clock that went backwards: do not trust it
])
def test_reusable(finished_at: float | None, now: float, max_age: float, reuse: bool) -> None:
    assert reusable(finished_at=finished_at, now=now, max_age=max_age) is reuse


async def test_concurrent_gets_on_a_host_share_one_neighbour_table_read() -> None:
    """Every Get reads the bridge's neighbour table over SSH exec; Gets in flight together on one host
    share one run (Host.shared_exec), and a later Get runs it afresh (no answer older than one run)."""
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    names = [f"proxy-n{i}" for i in range(5)]
    try:
        for i, name in enumerate(names):
            await provider.create(request(name=name))
            h.set_vm_ip(name, f"192.0.2.{10 + i}")
        h.exec_log.clear()
        found = await asyncio.gather(*(provider.get(name, "host0") for name in names))
        assert [inst.ip if inst else None for inst in found] == [f"192.0.2.{10 + i}" for i in range(5)]
        neigh = [argv for argv in h.exec_log if argv[:3] == ["ip", "-j", "neigh"]]
        assert len(neigh) == 1, h.exec_log
        await provider.get(names[0], "host0")
        assert len([argv for argv in h.exec_log if argv[:3] == ["ip", "-j", "neigh"]]) == 2
    finally:
        await provider.close()


async def test_gc_listing_reads_each_domains_metadata_once() -> None:
    """list_managed (GC, every gc interval) reads a domain's metadata element the first time it lists it,
    then one listing call per host per pass; a domain defined since is read, one gone is forgotten."""
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        for name in ("proxy-a1", "proxy-a2", "proxy-a3"):
            await provider.create(request(name=name))
        h.calls.clear()
        assert sorted(i.name for i in await provider.list_managed()) == ["proxy-a1", "proxy-a2", "proxy-a3"]
        assert h.calls.count("domain_get_metadata") == 3
        h.calls.clear()
        assert len(await provider.list_managed()) == 3
        assert h.calls == ["connect_list_all_domains"]
        await provider.delete("proxy-a1", "host0")
        await provider.create(request(name="proxy-a4"))
        h.calls.clear()
        assert sorted(i.name for i in await provider.list_managed()) == ["proxy-a2", "proxy-a3", "proxy-a4"]
        assert h.calls == ["connect_list_all_domains", "domain_get_metadata"]
        assert len(provider._listed_meta["host0"]) == 3  # nothing kept for the domain that went
    finally:
        await provider.close()


async def test_a_paused_vm_drops_the_addresses_asked_beside_its_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Paused, a domain keeps its id, so its sources are asked with the state; a paused VM serves nothing,
    so what they said is not its endpoint (as when they were asked only for a running one)."""
    provider, hv = fake_kvm_provider()
    try:
        await provider.create(request())
        hv["host0"].set_vm_ip(NAME, "192.0.2.7")
        hv["host0"].pause(NAME)
        count, rounds = await waves(monkeypatch, provider.get(NAME, "host0"))
        assert count == 2, rounds
        inst = await provider.get(NAME, "host0")
        assert inst is not None and inst.power_state is PowerState.PAUSED and inst.ip is None
    finally:
        await provider.close()


async def test_settled_keeps_an_error_as_a_value_until_asked_and_together_does_not_raise_it() -> None:
    """A speculative read's failure is not the call's failure until its value is wanted; a cancel is not
    kept (it ends the caller)."""
    kept, value = await together(settled(fails("later")), settled(ok(7)))
    assert isinstance(kept.error, Boom) and value.error is None and await value.value() == 7
    with pytest.raises(Boom, match=r"^later$"):
        await kept.value()

    async def cancelled() -> int:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await settled(cancelled())


async def test_a_create_while_its_image_imports_reads_no_cache_on_speculation() -> None:
    """The importer answers InProgress without reading the cache while the import runs; the create's room
    reads sent with its lookup leave the cache alone then too (no base or marker lookup)."""
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    hold = asyncio.Event()

    async def fetch(_progress: Any) -> Any:
        await hold.wait()
        raise AssertionError("not reached")

    async def nothing() -> None:
        return None

    try:
        await provider.create(request())  # the pool's handle is kept
        source = placement.image_source(provider.config, "debian-12")
        key = ("host0", h.pool_name, source.base_volume)
        with pytest.raises(InProgress):
            await provider._importer.base(key, label="held", instance="proxy-other", cached=nothing,
                                          fetch=fetch)
        h.calls.clear()
        with pytest.raises(InProgress):
            await provider.create(request(name="proxy-two"))
        assert "storage_vol_lookup_by_name" not in h.calls and "storage_pool_refresh" in h.calls, h.calls
    finally:
        await provider.close()


# -- start: the reads after the lookup in one round --------------------------------------------------

LOOKUP = ["domain_lookup_by_name"]
READS = ["domain_get_metadata", "domain_get_state"]
READS_AND_MEMORY = ["domain_get_metadata", "domain_get_state", "node_get_free_memory"]
PAUSED_MIGRATION = 2


def boom(method: str) -> LibvirtError:
    return lv_error(ErrorCode.INTERNAL_ERROR, f"internal error: {method} boom")


def disown(h: FakeHypervisor) -> None:
    h.domains[NAME].metadata.clear()  # a domain of no operator's under the name


def other_cluster(h: FakeHypervisor) -> None:
    meta = h.domains[NAME].metadata
    uri = next(iter(meta))
    meta[uri] = meta[uri].replace(">test-cluster<", ">cluster-b<")


def other_machine_type(h: FakeHypervisor) -> None:
    meta = h.domains[NAME].metadata
    uri = next(iter(meta))
    meta[uri] = meta[uri].replace('machineType="small"', 'machineType="retired"')


Stage = Callable[[FakeHypervisor], None]


@dataclass(frozen=True)
class StartCase:
    """A start of a VM staged by `stage`: what it raises (or None), the state the VM is left in, the calls
    in each round. `before`: how many rounds the sequential start made (lookup, metadata, state, then the
    free memory and the start, or the resume, each after the one before)."""

    stage: Stage
    error: tuple[type[Exception], str] | None
    state: DomainState | None
    rounds: list[list[str]]
    before: int
    name: str = NAME


def fails_once(*methods: str) -> Stage:
    def stage(h: FakeHypervisor) -> None:
        for method in methods:
            h.fail[method] = boom(method)
    return stage


def staged(*stages: Stage) -> Stage:
    def stage(h: FakeHypervisor) -> None:
        for s in stages:
            s(h)
    return stage


def shut_off(h: FakeHypervisor) -> None:
    h.shut_off(NAME)


def crashed(h: FakeHypervisor) -> None:
    h.shut_off(NAME, DOMAIN_SHUTOFF_CRASHED)


def undefined_meanwhile(h: FakeHypervisor) -> None:
    for method in READS:
        h.fail[method] = lv_error(ErrorCode.NO_DOMAIN, f"Domain not found: no domain with matching uuid "
                                  f"(name '{NAME}')")


def after_the_lookup(h: FakeHypervisor, then: Callable[[Domain], object]) -> None:
    """Someone else does `then` to the domain the lookup found, after the lookup answered and before the
    start's next round reads it."""
    lookup = h.domain_lookup_by_name

    @functools.wraps(lookup)
    def and_then(name: str) -> Domain:
        found = lookup(name)
        then(found)
        return found

    h.domain_lookup_by_name = and_then  # type: ignore[method-assign]


def started_after_the_lookup(h: FakeHypervisor) -> None:
    """Shut off at the lookup (its id -1: the free memory is read on speculation), running by the state
    read (started by someone else in between)."""
    h.shut_off(NAME)
    after_the_lookup(h, h.domain_create_with_flags)


def stopped_after_the_lookup(h: FakeHypervisor) -> None:
    """Running at the lookup (an id: no memory read on speculation), shut off by the state read."""
    after_the_lookup(h, lambda found: h.shut_off(found.name))


def nothing(h: FakeHypervisor) -> None:
    pass


def no_memory(h: FakeHypervisor) -> None:
    h.memory = 0


RUNNING, SHUTOFF, PAUSED = DomainState.RUNNING, DomainState.SHUTOFF, DomainState.PAUSED
START_CASES = {
    "running: left alone": StartCase(nothing, None, RUNNING, [LOOKUP, READS], before=3),
    "shut off: started": StartCase(shut_off, None, RUNNING,
                                   [LOOKUP, READS_AND_MEMORY, ["domain_create_with_flags"]], before=5),
    "crashed: started": StartCase(crashed, None, RUNNING,
                                  [LOOKUP, READS_AND_MEMORY, ["domain_create_with_flags"]], before=5),
    "paused: resumed": StartCase(lambda h: h.pause(NAME), None, RUNNING, [LOOKUP, READS, ["domain_resume"]],
                                 before=4),
    "paused by a migration: left": StartCase(
        lambda h: h.pause(NAME, PAUSED_MIGRATION), (TransientError, r"paused during a migration"), PAUSED,
        [LOOKUP, READS], before=3),
    "not found": StartCase(nothing, (TransientError, r"VM 'proxy-gone' does not exist on host 'host0'"),
                           RUNNING, [LOOKUP], before=1, name="proxy-gone"),
    "not ours": StartCase(disown, (PermanentError, r"not made by this operator.*refusing to start it"),
                          RUNNING, [LOOKUP, READS], before=2),
    "another cluster's": StartCase(other_cluster, (NotOwned, r"belongs to cluster 'cluster-b'"), RUNNING,
                                   [LOOKUP, READS], before=2),
    # Ownership is judged before the state's error, as when the state was read after it.
    "not ours, shut off, state unreadable": StartCase(
        staged(disown, shut_off, fails_once("domain_get_state", "node_get_free_memory")),
        (PermanentError, r"not made by this operator"), SHUTOFF, [LOOKUP, READS_AND_MEMORY], before=2),
    "metadata and state unreadable: the metadata's error": StartCase(
        fails_once("domain_get_metadata", "domain_get_state"),
        (TransientError, r"start 'proxy-abc' failed: internal error: domain_get_metadata boom"), RUNNING,
        [LOOKUP, READS], before=2),
    "state unreadable": StartCase(
        fails_once("domain_get_state"), (TransientError, r"internal error: domain_get_state boom"), RUNNING,
        [LOOKUP, READS], before=3),
    "shut off, state and memory unreadable: the state's error": StartCase(
        staged(shut_off, fails_once("domain_get_state", "node_get_free_memory")),
        (TransientError, r"internal error: domain_get_state boom"), SHUTOFF, [LOOKUP, READS_AND_MEMORY],
        before=3),
    "shut off, memory unreadable": StartCase(
        staged(shut_off, fails_once("node_get_free_memory")),
        (TransientError, r"internal error: node_get_free_memory boom"), SHUTOFF, [LOOKUP, READS_AND_MEMORY],
        before=4),
    "shut off, no memory": StartCase(
        staged(shut_off, no_memory), (QuotaError, r"host 'host0'.*memory"), SHUTOFF,
        [LOOKUP, READS_AND_MEMORY], before=4),
    # No memory check for a machine type the config no longer has: libvirt's own refusal is the answer.
    "shut off, machine type no longer configured, no memory": StartCase(
        staged(shut_off, other_machine_type, no_memory),
        (QuotaError, r"out of memory: start 'proxy-abc': .*cannot allocate memory"), SHUTOFF,
        [LOOKUP, READS_AND_MEMORY, ["domain_create_with_flags"]], before=4),
    # A speculative read the sequential start would not have made: its error is never the answer.
    "started after the lookup, memory unreadable: left alone": StartCase(
        staged(started_after_the_lookup, fails_once("node_get_free_memory")), None, RUNNING,
        [LOOKUP, READS_AND_MEMORY], before=3),
    "shut off, machine type no longer configured, memory unreadable: started": StartCase(
        staged(shut_off, other_machine_type, fails_once("node_get_free_memory")), None, RUNNING,
        [LOOKUP, READS_AND_MEMORY, ["domain_create_with_flags"]], before=4),
    # The lookup's id was wrong the other way: the memory is read after the state, as it always was.
    "stopped after the lookup: started": StartCase(
        stopped_after_the_lookup, None, RUNNING,
        [LOOKUP, READS, ["node_get_free_memory"], ["domain_create_with_flags"]], before=5),
    "shut off, start refused": StartCase(
        staged(shut_off, fails_once("domain_create_with_flags")),
        (TransientError, r"internal error: domain_create_with_flags boom"), SHUTOFF,
        [LOOKUP, READS_AND_MEMORY, ["domain_create_with_flags"]], before=5),
    "undefined before its metadata was read": StartCase(
        undefined_meanwhile, (TransientError, r"Domain not found.*\(libvirt NO_DOMAIN\)"), RUNNING,
        [LOOKUP, READS], before=2),
}


@pytest.mark.parametrize("case", START_CASES.values(), ids=START_CASES.keys())
async def test_start_sends_its_reads_after_the_lookup_in_one_round(monkeypatch: pytest.MonkeyPatch,
                                                                   case: StartCase) -> None:
    """After the lookup, the metadata and the state go out together, and for an inactive domain (lookup
    id -1: shut off or crashed, to be started) the host's free memory with them: a restart of a crashed VM
    is 3 rounds, not 5. The outcome of every case is the sequential start's: the same error, first in
    the same order (lookup, metadata, ownership, state, memory, start), the VM left in the same state."""
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        case.stage(h)
        h.calls.clear()
        outcome: list[Settled[None]] = []

        async def start() -> None:
            outcome.append(await settled(provider.start(case.name, "host0")))

        count, rounds = await waves(monkeypatch, start())
        raised = outcome[0].error
        if case.error is None:
            assert raised is None
        else:
            assert isinstance(raised, case.error[0]) and re.search(case.error[1], str(raised)), raised
        dom = h.domains.get(NAME)
        assert (dom.state if dom else None) == case.state
        assert rounds == case.rounds
        assert count <= case.before  # no case slower than it was
    finally:
        await provider.close()


# -- create of a domain that exists already: the same round as start's ------------------------------

def unreadable(*methods: str) -> Stage:
    """Each method fails on every call, not once: a create with the pool's handle kept reads the free
    memory on speculation with its lookup, and again before a start."""
    def stage(h: FakeHypervisor) -> None:
        for method in methods:
            real = getattr(h, method)

            @functools.wraps(real)
            def refuse(*_args: Any, method: str = method) -> Any:
                raise boom(method)

            setattr(h, method, refuse)
    return stage


ADDRESSES = ["domain_interface_addresses"]
#: The rounds up to the domain lookup's answer: a fresh provider's {domain lookup, pool lookup}; with the
#: pool's handle kept, a later create's room reads go with the lookup, and the cache's second round.
BEFORE_THE_DOMAIN = {
    "fresh": [["domain_lookup_by_name", "storage_pool_lookup_by_name"]],
    "handle kept": [["domain_lookup_by_name", "node_get_free_memory", "storage_pool_refresh",
                     "storage_vol_lookup_by_name", "storage_vol_lookup_by_name"],
                    ["storage_pool_get_info", "storage_vol_get_info", "storage_vol_get_path"]],
}


@dataclass(frozen=True)
class ReuseCase:
    """A create of NAME finding the domain staged by `stage`: what it raises (or None: the Instance,
    running, `existed`), the state the domain is left in, the calls in each round after the lookup's.
    `before`: how many rounds the sequential reuse made after it (metadata, state, then the free memory
    and the start, or the resume, then the address sources, each after the one before)."""

    stage: Stage
    error: tuple[type[Exception], str] | None
    state: DomainState
    rounds: list[list[str]]
    before: int
    uid: str = "uid-1"


STARTED = [READS_AND_MEMORY, ["domain_create_with_flags"], ADDRESSES]
REUSE_CASES = {
    "running: kept": ReuseCase(nothing, None, RUNNING, [READS, ADDRESSES], before=3),
    "shut off: started": ReuseCase(shut_off, None, RUNNING, STARTED, before=5),
    "crashed: started": ReuseCase(crashed, None, RUNNING, STARTED, before=5),
    "paused: resumed": ReuseCase(lambda h: h.pause(NAME), None, RUNNING,
                                 [READS, ["domain_resume"], ADDRESSES], before=4),
    "paused by a migration: left": ReuseCase(
        lambda h: h.pause(NAME, PAUSED_MIGRATION), (TransientError, r"paused during a migration"), PAUSED,
        [READS], before=2),
    "not ours": ReuseCase(disown, (PermanentError, r"not made by this operator.*refusing to reuse it"),
                          RUNNING, [READS], before=1),
    "another cluster's": ReuseCase(other_cluster, (NotOwned, r"belongs to cluster 'cluster-b'.*reuse it"),
                                   RUNNING, [READS], before=1),
    "another Proxy's": ReuseCase(nothing, (NotOwned, r"belongs to another Proxy.*refusing to reuse it"),
                                 RUNNING, [READS], before=1, uid="uid-2"),
    # Nothing is acted on before the ownership check: another's domain is neither started nor resumed.
    "another Proxy's, shut off: left shut off": ReuseCase(
        shut_off, (NotOwned, r"belongs to another Proxy"), SHUTOFF, [READS_AND_MEMORY], before=1,
        uid="uid-2"),
    "not ours, paused: left paused": ReuseCase(
        staged(disown, lambda h: h.pause(NAME)), (PermanentError, r"not made by this operator"), PAUSED,
        [READS], before=1),
    # Ownership is judged before the state's error, as when the state was read after it.
    "not ours, shut off, state and memory unreadable": ReuseCase(
        staged(disown, shut_off, unreadable("domain_get_state", "node_get_free_memory")),
        (PermanentError, r"not made by this operator"), SHUTOFF, [READS_AND_MEMORY], before=1),
    "metadata and state unreadable: the metadata's error": ReuseCase(
        unreadable("domain_get_metadata", "domain_get_state"),
        (TransientError, r"create 'proxy-abc' failed: internal error: domain_get_metadata boom"), RUNNING,
        [READS], before=1),
    "state unreadable": ReuseCase(
        unreadable("domain_get_state"), (TransientError, r"internal error: domain_get_state boom"), RUNNING,
        [READS], before=2),
    "shut off, state and memory unreadable: the state's error": ReuseCase(
        staged(shut_off, unreadable("domain_get_state", "node_get_free_memory")),
        (TransientError, r"internal error: domain_get_state boom"), SHUTOFF, [READS_AND_MEMORY], before=2),
    "shut off, memory unreadable": ReuseCase(
        staged(shut_off, unreadable("node_get_free_memory")),
        (TransientError, r"internal error: node_get_free_memory boom"), SHUTOFF, [READS_AND_MEMORY],
        before=3),
    "shut off, no memory": ReuseCase(
        staged(shut_off, no_memory), (QuotaError, r"host 'host0'.*memory"), SHUTOFF, [READS_AND_MEMORY],
        before=3),
    # The memory checked is the request's machine type's (start, with no request, goes by the metadata's).
    "shut off, the metadata's machine type no longer configured, no memory": ReuseCase(
        staged(shut_off, other_machine_type, no_memory), (QuotaError, r"host 'host0'.*memory"), SHUTOFF,
        [READS_AND_MEMORY], before=3),
    # A speculative read the sequential reuse would not have made: its error is never the answer.
    "started after the lookup, memory unreadable: kept": ReuseCase(
        staged(started_after_the_lookup, unreadable("node_get_free_memory")), None, RUNNING,
        [READS_AND_MEMORY, ADDRESSES], before=3),
    "stopped after the lookup: started": ReuseCase(
        stopped_after_the_lookup, None, RUNNING,
        [READS, ["node_get_free_memory"], ["domain_create_with_flags"], ADDRESSES], before=5),
    "shut off, start refused": ReuseCase(
        staged(shut_off, unreadable("domain_create_with_flags")),
        (TransientError, r"internal error: domain_create_with_flags boom"), SHUTOFF,
        [READS_AND_MEMORY, ["domain_create_with_flags"]], before=4),
    "undefined before its metadata was read": ReuseCase(
        undefined_meanwhile, (TransientError, r"Domain not found.*\(libvirt NO_DOMAIN\)"), RUNNING,
        [READS], before=1),
}


@pytest.mark.parametrize("handle", BEFORE_THE_DOMAIN.keys())
@pytest.mark.parametrize("case", REUSE_CASES.values(), ids=REUSE_CASES.keys())
async def test_a_create_of_an_existing_domain_sends_its_reads_after_the_lookup_in_one_round(
        monkeypatch: pytest.MonkeyPatch, case: ReuseCase, handle: str) -> None:
    """A create finding its domain there already (a status write lost) reads it as start does: the
    metadata and the state together, and for an inactive domain the free memory with them. The outcome of
    every case is the sequential reuse's: the same error, first in the same order (metadata, ownership,
    state, memory, start), the domain left in the same state; no case makes more rounds than it did."""
    provider, hv = fake_kvm_provider()
    h = hv["host0"]
    try:
        await provider.create(request())
        if handle == "fresh":
            provider._pools.clear()  # as after a restart: the pool looked up with the domain
        case.stage(h)
        h.calls.clear()
        outcome: list[Settled[Instance]] = []

        async def create() -> None:
            outcome.append(await settled(provider.create(request(uid=case.uid))))

        count, rounds = await waves(monkeypatch, create())
        result = outcome[0].result
        got = ((result.existed, result.power_state) if isinstance(result, Instance)
               else (type(result), case.error is not None and bool(re.search(case.error[1], str(result)))))
        assert got == ((True, PowerState.RUNNING) if case.error is None else (case.error[0], True)), result
        assert h.domains[NAME].state == case.state
        assert rounds == BEFORE_THE_DOMAIN[handle] + case.rounds
        assert count <= len(BEFORE_THE_DOMAIN[handle]) + case.before
    finally:
        await provider.close()
