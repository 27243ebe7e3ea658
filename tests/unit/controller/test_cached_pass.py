"""A routine pass starts from the informer's cache (controller/cached.py): a settled Proxy's resync reads
nothing from the API server, and a routine pass that must act (write status, finalize, name the desired
instance it cannot know from the cache) reads the Proxy fresh first and acts on that, never on the cache."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from egress_kvm.controller import actions
from egress_kvm.controller.actions import acting
from egress_kvm.controller.cached import cached_copy, check_step
from egress_kvm.controller.context import Context, FreshReadNeeded
from egress_kvm.controller.desired import Desired
from egress_kvm.controller.manager import Controller
from egress_kvm.controller.memory import Memory
from egress_kvm.controller.outcome import Fail, Result, Retry, Trouble
from egress_kvm.controller.plan import Event
from egress_kvm.controller.planner import (
    Act,
    Create,
    Delete,
    HandOver,
    Importing,
    Look,
    Readdress,
    Record,
    Remember,
    Start,
    Unwatch,
    Watch,
    WriteStatus,
)
from egress_kvm.controller.status import Ref
from egress_kvm.controller.verdict import ProbeKey, ProbeTarget
from egress_kvm.kube.interfaces import Key, Obj, ProxyGone, SpecChanged
from egress_kvm.kube.rest import KubeApiError
from egress_kvm.kube.trim import trimmed
from egress_kvm.log import get_logger
from egress_kvm.providers.base import ResolvedPlacement

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy
from .test_lifecycle import KEY, phase, spec_for
from .test_planner import NEW, OLD, OWN, REPL, SPEC


class InformerLike:
    """A ProxyStore as the informer keeps it: trimmed copies (no inline user-data), and whether it follows
    the server (`current`, which a test can turn off); frozen on demand (a cache behind the API server)."""

    def __init__(self, api: FakeKube) -> None:
        self.api = api
        self.alive = True
        self.synced = True
        self.frozen: dict[Key, Obj] | None = None

    def freeze(self) -> None:
        self.frozen = {k: trimmed(copy.deepcopy(v)) for k, v in self.api.objects.items()}

    def get(self, key: Key) -> Obj | None:
        if self.frozen is not None:
            return self.frozen.get(key)
        obj = self.api.objects.get(key)
        return trimmed(copy.deepcopy(obj)) if obj is not None else None

    def keys(self) -> list[Key]:
        return list(self.frozen if self.frozen is not None else self.api.objects)

    def has_synced(self) -> bool:
        return self.synced

    def current(self) -> bool:
        return self.alive


class Counted:
    """Counts the fresh reads of the Proxy (FakeKube.get_proxy) and the passes the controller runs."""

    def __init__(self, kube: FakeKube, c: Controller) -> None:
        self.reads: list[Key] = []
        self.passes: list[bool] = []
        real_get, real_reconcile = kube.get_proxy, c.reconciler.reconcile

        async def get_proxy(namespace: str, name: str) -> Obj | None:
            self.reads.append((namespace, name))
            return await real_get(namespace, name)

        async def reconcile(key: Key, *, routine: bool = False) -> Any:
            result = await real_reconcile(key, routine=routine)
            self.passes.append(routine)
            return result

        kube.get_proxy = get_proxy  # type: ignore[method-assign]
        c.reconciler.reconcile = reconcile  # type: ignore[method-assign]


def provider_calls(provider: FakeProvider) -> int:
    return len(provider.calls)


async def settled(kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy,
                  make_controller: Callable[..., Controller]) -> tuple[Controller, InformerLike, Counted]:
    """px1 (inline user-data: not in the cache) Ready and healthy, nothing queued; probe-time refresh off,
    as the operator runs by default; resync only when the test calls it."""
    store = InformerLike(kube)
    c = make_controller({"kvm-home": provider}, store=store, probe_refresh=math.inf)
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready" and kube.status(KEY).get("healthy") is True)
    await eventually(lambda: not c.queue.wanted(KEY) and KEY not in c.queue.processing()
                     and not c.queue.pending_delayed(), what="nothing queued")
    return c, store, Counted(kube, c)


async def resync(c: Controller, counted: Counted) -> None:
    """One resync pass of px1, run to its end."""
    before = len(counted.passes)
    await c._resync()
    await eventually(lambda: len(counted.passes) > before, what="the resync pass")


async def test_a_settled_proxys_resync_reads_nothing(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c, _, counted = await settled(kube, provider, proxy_server, make_controller)
    writes, calls = kube.status_writes, provider_calls(provider)
    for _ in range(3):
        await resync(c, counted)
    assert counted.passes == [True, True, True]
    assert counted.reads == []  # no GET of the Proxy
    assert provider_calls(provider) == calls  # no provider call (planner.vouched)
    assert kube.status_writes == writes and phase(kube) == "Ready"
    c.enqueue(KEY)  # anything but the clock: a real look, fresh
    await eventually(lambda: len(counted.passes) == 4)
    assert counted.passes[-1] is False and counted.reads == [KEY]


async def test_the_desired_instance_unknown_to_this_process_is_read_fresh_once(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The cache has no inline user-data, so the instance name is known only from a fresh pass (a new
    leader, a restart: memory is empty). The first routine pass reads fresh, the next ones need not; the
    VM is never replaced on the cache's word."""
    c, _, counted = await settled(kube, provider, proxy_server, make_controller)
    name = kube.status(KEY)["instance"]["name"]
    c.reconciler.memory.forget(KEY)  # as after a restart
    await resync(c, counted)
    assert counted.reads == [KEY]
    await resync(c, counted)
    assert counted.reads == [KEY]
    assert kube.status(KEY)["instance"]["name"] == name and provider.names() == {name}


async def test_the_remembered_instance_keeps_no_user_data(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """KeyState lives as long as the process and is shown by anything that prints it: the secret
    user-data is dropped from the Desired remembered there (the name, a keyed digest, stands in)."""
    c, _, _ = await settled(kube, provider, proxy_server, make_controller)
    remembered = c.reconciler.memory[KEY].desired
    assert remembered is not None and remembered[1].user_data is None
    assert remembered[1].name == kube.status(KEY)["instance"]["name"]
    assert "runcmd" not in repr(c.reconciler.memory[KEY])


async def test_a_spec_edit_is_named_afresh_not_from_the_remembered_instance(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The remembered desired instance is keyed by generation: a cache showing a newer spec (its event
    lost in the queue) is not matched to it; the pass reads fresh."""
    c, store, counted = await settled(kube, provider, proxy_server, make_controller)
    store.freeze()
    assert store.frozen is not None
    store.frozen[KEY]["metadata"]["generation"] += 1
    result = await c.reconciler.reconcile(KEY, routine=True)
    assert counted.reads == [KEY] and result.retry is None


@pytest.mark.parametrize("changed", ["the providers file", "the uid (recreated under the same name)"])
async def test_the_remembered_instance_name_is_used_only_for_the_same_inputs(
        changed: str, kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy,
        make_controller) -> None:
    """Either may change the name (a new default image; the uid is hashed in), and neither shows in
    what the vouching probes look at: the remembered name is not matched, the pass reads fresh."""
    c, store, counted = await settled(kube, provider, proxy_server, make_controller)
    if changed == "the providers file":
        c.reconciler.set_providers(c.reconciler.providers, "another file")
    else:
        store.freeze()
        assert store.frozen is not None
        store.frozen[KEY]["metadata"]["uid"] = "uid-recreated"
    await c.reconciler.reconcile(KEY, routine=True)
    assert counted.reads == [KEY]


async def test_a_routine_pass_that_must_write_reads_fresh_and_writes_from_that(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The cache lags (our Ready write's event not yet seen): planned from it, the pass would write Ready
    again with the cache's resourceVersion. It reads fresh instead, finds Ready, writes nothing."""
    c, store, counted = await settled(kube, provider, proxy_server, make_controller)
    store.freeze()
    assert store.frozen is not None
    stale = store.frozen[KEY]
    stale["status"] = {**stale["status"], "phase": "Running", "message": "waiting for health probes"}
    stale["metadata"]["resourceVersion"] = "1"
    writes, conflicts = kube.status_writes, kube.conflicts
    result = await c.reconciler.reconcile(KEY, routine=True)
    assert counted.reads == [KEY]
    assert kube.status_writes == writes and kube.conflicts == conflicts  # nothing written, no stale PUT
    assert phase(kube) == "Ready" and result.retry is None


async def test_a_routine_pass_writes_a_lone_probe_time_only_after_a_fresh_read(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """With --probe-time-refresh the routine pass has something to write (a newer lastProbeTime): it
    reads the Proxy fresh and writes onto that."""
    c, _, counted = await settled(kube, provider, proxy_server, make_controller)
    c.reconciler.probe_refresh = 0.0  # any newer lastProbeTime is worth a write
    stored = datetime.strptime(kube.status(KEY)["lastProbeTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)

    def newer_probe() -> bool:
        health = c.prober.health(ProbeKey(KEY))
        last = health.last_probe if health is not None else None
        return last is not None and last.replace(microsecond=0) > stored

    await eventually(newer_probe, what="a probe in a later second than the stored lastProbeTime")
    writes = kube.status_writes
    await c.reconciler.reconcile(KEY, routine=True)
    assert counted.reads == [KEY] and kube.status_writes == writes + 1 and kube.conflicts == 0


@pytest.mark.parametrize("cached_phase", ["Ready", "Deleting"])
async def test_a_deletion_in_the_cache_is_never_finalized_on_its_word(
        cached_phase: str, kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy,
        make_controller) -> None:
    """A cache that says deleting (wrongly, here) sends the pass to a fresh read; the server's object is
    not being deleted, so its VM stays, its probe and its finalizer too. "Deleting": as a retry of the
    finalizer flow sees it, which deletes through the provider with no status write first."""
    c, store, counted = await settled(kube, provider, proxy_server, make_controller)
    name = kube.status(KEY)["instance"]["name"]
    store.freeze()
    assert store.frozen is not None
    store.frozen[KEY]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    store.frozen[KEY]["status"]["phase"] = cached_phase
    await c.reconciler.reconcile(KEY, routine=True)
    assert counted.reads == [KEY]
    assert provider.names() == {name} and not any(op == "delete" for op, _ in provider.calls)
    assert kube.objects[KEY]["metadata"]["finalizers"] and c.prober.target(ProbeKey(KEY)) is not None


@pytest.mark.parametrize("why", ["not following the server", "not synced", "not cached"])
async def test_a_cache_that_cannot_be_trusted_is_not_used(
        why: str, kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c, store, counted = await settled(kube, provider, proxy_server, make_controller)
    if why == "not following the server":
        store.alive = False
    elif why == "not synced":
        store.synced = False
    else:
        store.freeze()
        assert store.frozen is not None
        store.frozen.clear()
    await c.reconciler.reconcile(KEY, routine=True)
    assert counted.reads == [KEY]
    await c.reconciler.reconcile(KEY, routine=False)  # a pass not routine reads fresh whatever the cache
    assert counted.reads == [KEY, KEY]


def test_cached_copy_is_a_copy() -> None:
    kube = FakeKube()
    kube.create_proxy("px1", {"mode": "Managed"})
    store = InformerLike(kube)
    store.freeze()
    got = cached_copy(store, KEY)
    assert got is not None and got == store.get(KEY)
    got["metadata"]["name"] = "changed"
    assert store.get(KEY)["metadata"]["name"] == "px1"  # type: ignore[index]
    assert cached_copy(None, KEY) is None


class TargetsOnly:
    """The prober as actions.acting reads it: the current target per key."""

    def __init__(self, targets: dict[ProbeKey, ProbeTarget]) -> None:
        self.targets = targets

    def target(self, key: ProbeKey) -> ProbeTarget | None:
        return self.targets.get(key)


HERE = ProbeTarget("10.0.0.1", 3128, SPEC.health, "ns")
SETTLED = {"phase": "Ready", "message": "ok", "observedGeneration": 1}
ACTS: list[tuple[str, Act, str | None]] = [
    ("a look", Look(NEW), "look at instance proxy-new"),
    ("create", Create(NEW, None, None, ()), "create instance proxy-new"),
    ("start", Start(NEW), "start instance proxy-new"),
    ("readdress", Readdress(NEW), "readdress instance proxy-new"),
    ("delete", Delete(OLD), "delete instance proxy-old"),
    ("an Event", Record(Event("Normal", "Ready", "x")), "record a Ready Event"),
    ("status as stored", WriteStatus(dict(SETTLED)), None),
    ("status that changed", WriteStatus({**SETTLED, "message": "other"}), "write status"),
    ("the same probe", Watch(OWN, HERE), None),
    ("a new probe target", Watch(OWN, replace(HERE, host="10.0.0.2")), "watch a new probe target"),
    ("unwatch what is not probed", Unwatch(REPL), None),
    ("unwatch a probe", Unwatch(OWN), "stop a probe"),
    ("hand over", HandOver(REPL, OWN), "hand the probes over"),
    ("memory as it is", Remember(restarts=0, ip_waits=0, stranded_looks=0), None),
    ("memory that changes", Remember(restarts=0, ip_waits=1, stranded_looks=2),
     "remember ip_waits, stranded_looks"),
]


def settled_context(*, remembered_phase: str = "Ready") -> Context:
    """A pass from the cache of a Ready Proxy this process remembers as `remembered_phase`."""
    proxy = {"metadata": {"name": "px", "namespace": "ns", "generation": 1}, "status": dict(SETTLED)}
    memory = Memory()
    memory.set_phase(KEY, remembered_phase)
    return Context(key=KEY, proxy=proxy, log=get_logger("test"), kube=FakeKube(),
                   prober=TargetsOnly({OWN: HERE}), memory=memory, probe_refresh=math.inf,  # type: ignore[arg-type]
                   cached=True)


@pytest.mark.parametrize(("case", "act", "what"), ACTS, ids=[a[0] for a in ACTS])
def test_what_acts_change(case: str, act: Act, what: str | None) -> None:
    assert acting(settled_context(), act) == what


@pytest.mark.parametrize(("case", "act", "what"), ACTS, ids=[a[0] for a in ACTS])
def test_a_step_with_any_act_that_changes_something_is_not_begun(
        case: str, act: Act, what: str | None) -> None:
    """check_step refuses a step before its first act runs if any of its acts, wherever it stands, would
    change something."""
    steps = ((act,), (Remember(restarts=0), act))
    for step in steps:
        if what is None:
            check_step(settled_context(), step)
        else:
            with pytest.raises(FreshReadNeeded, match=what):
                check_step(settled_context(), step)


def test_status_as_stored_still_changes_the_phase_remembered_otherwise() -> None:
    """The phase gauge (KeyState.phase) is not set from a status the cache may not have caught up with."""
    assert acting(settled_context(remembered_phase="Provisioning"), WriteStatus(dict(SETTLED))) == \
        "remember the phase"


REMEMBERED: list[tuple[str, Callable[[Memory], None]]] = [
    ("a trouble", lambda m: setattr(m[KEY], "trouble", ("HostUnreachable", "zone nas1 unreachable"))),
    ("an import", lambda m: setattr(m[KEY], "importing", True)),
    ("a Failed verdict about other inputs", lambda m: setattr(m[KEY], "failed", (99, "other"))),
    ("another phase", lambda m: m.set_phase(KEY, "Provisioning")),
    ("restarts", lambda m: setattr(m[KEY], "restarts", 2)),
]


@pytest.mark.parametrize(("case", "remember"), REMEMBERED, ids=[r[0] for r in REMEMBERED])
async def test_what_the_reconciler_remembers_changes_only_after_a_fresh_read(
        case: str, remember: Callable[[Memory], None], kube: FakeKube, provider: FakeProvider,
        proxy_server: MiniProxy, make_controller) -> None:
    """KeyState outlives the pass and later fresh passes trust it (restart backoff, one Event per trouble,
    Failed verdicts, the phase gauge): a pass from a cache that may lag never changes it. Here the settled
    Ready Proxy's pass would set each back as a fresh pass does: it reads fresh first, then does."""
    c, _, counted = await settled(kube, provider, proxy_server, make_controller)
    remember(c.reconciler.memory)
    result = await c.reconciler.reconcile(KEY, routine=True)
    assert counted.reads == [KEY] and result.retry is None
    state = c.reconciler.memory[KEY]
    assert (state.trouble, state.importing, state.failed, c.reconciler.memory.phase(KEY), state.restarts) == \
        (None, False, None, "Ready", 0)


async def test_a_pass_that_must_look_reads_fresh_first_and_looks_once(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """Not vouched for by its probes (here none: as after a restart), the routine pass looks at the VM: it
    reads the Proxy fresh before that, so a pass that then acts (here: probe the VM again) does not look
    twice, and nothing it concludes rests on a status the cache may not have caught up with."""
    c, _, counted = await settled(kube, provider, proxy_server, make_controller)
    c.prober.unwatch(ProbeKey(KEY))
    calls = len(provider.calls)
    await c.reconciler.reconcile(KEY, routine=True)
    assert counted.reads == [KEY]
    assert [op for op, _ in provider.calls[calls:]] == ["get"]
    assert c.prober.target(ProbeKey(KEY)) is not None


async def test_a_cache_without_the_finalizer_does_not_add_it(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """Adding the finalizer is a write: done on a fresh read (which has it here), not on the cache's."""
    c, store, counted = await settled(kube, provider, proxy_server, make_controller)
    finalizer_calls: list[Obj] = []
    real = kube.set_finalizer

    async def set_finalizer(obj: Obj, *, present: bool) -> Obj:
        finalizer_calls.append(obj)
        return await real(obj, present=present)

    kube.set_finalizer = set_finalizer  # type: ignore[method-assign]
    store.freeze()
    assert store.frozen is not None
    store.frozen[KEY]["metadata"]["finalizers"] = []
    await c.reconciler.reconcile(KEY, routine=True)
    assert counted.reads == [KEY] and finalizer_calls == []


ENDS: list[tuple[str, Callable[[], Any]]] = [
    ("a trouble", lambda: Trouble("QuotaExceeded", "no room", Retry.QUOTA)),
    ("a failure", lambda: Fail("cannot work", "SpecInvalid")),
    ("an import", lambda: Importing("importing the image")),
    ("an error", lambda: KubeApiError(500, "InternalError", "boom")),
    ("a bug", lambda: AssertionError("a planner bug")),
    ("the Proxy gone", lambda: ProxyGone("px1")),
    ("a spec change", lambda: SpecChanged("generation 2")),
]


@pytest.mark.parametrize(("case", "end"), ENDS, ids=[e[0] for e in ENDS])
async def test_a_pass_from_the_cache_ends_plainly_or_starts_over_fresh(
        case: str, end: Callable[[], Any], kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy,
        make_controller, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any end but a plain result (a trouble, a failure, an import, an exception) is acted on (status,
    Events, memory, backoff) by a fresh pass, whose outcome is the reconcile's: the cached pass's end is
    neither returned nor raised, nor counted as a failure."""
    c, _, counted = await settled(kube, provider, proxy_server, make_controller)
    fresh_result = Result(requeue_after=42.0)

    async def planned(ctx: Context) -> Any:
        if not ctx.cached:
            return fresh_result
        outcome = end()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(c.reconciler, "_reconcile", planned)
    assert await c.reconciler.reconcile(KEY, routine=True) is fresh_result
    assert counted.reads == [KEY]


PLACED = ResolvedPlacement("nas1", "small", "debian")
FRESH_ONLY: list[tuple[str, Act]] = [
    ("create", Create(Ref("proxy-x", "nas1"), None, None, ())),
    ("start", Start(Ref("proxy-x", "nas1"))),
    ("readdress", Readdress(Ref("proxy-x", "nas1"))),
    ("delete", Delete(Ref("proxy-x", "nas1"))),
    ("look", Look(Ref("proxy-x", "nas1"), spec_provider=True)),
    ("an Event", Record(Event("Normal", "Ready", "x"))),
    ("a status write", WriteStatus({"phase": "Pending", "message": "m"})),
    ("a hand-over", HandOver(REPL, OWN)),
    ("memory", Remember(restarts=3)),
]


@pytest.mark.parametrize(("case", "act"), FRESH_ONLY, ids=[a[0] for a in FRESH_ONLY])
async def test_the_last_line_actions_run_refuses_to_act_for_a_pass_from_the_cache(
        case: str, act: Act, provider: FakeProvider) -> None:
    """The reconciler checks a whole step first (check_step); actions.run checks again, so an act the
    step check missed still never runs on the cache's word."""
    kube = FakeKube()
    kube.create_proxy("px1", {"mode": "Managed"})
    proxy = kube.objects[KEY]
    memory = Memory()
    ctx = Context(key=KEY, proxy=copy.deepcopy(proxy), log=get_logger("test"), kube=kube,
                  prober=TargetsOnly({}), memory=memory, providers={"kvm-home": provider},  # type: ignore[arg-type]
                  cached=True)
    desired = Desired(provider=provider, resolved=PLACED, name="proxy-x", user_data=None)
    with pytest.raises(FreshReadNeeded):
        await actions.run(ctx, act, spec_provider_name="kvm-home", provider=provider, desired=desired,
                          progress_interval=0.0)
    assert provider.calls == [] and kube.status_writes == 0 and kube.events == [] and KEY not in memory


async def test_the_last_line_context_refuses_writes_and_deletes_for_a_pass_from_the_cache(
        provider: FakeProvider) -> None:
    kube = FakeKube()
    kube.create_proxy("px1", {"mode": "Managed"})
    ctx = Context(key=KEY, proxy=copy.deepcopy(kube.objects[KEY]), log=get_logger("test"), kube=kube,
                  prober=TargetsOnly({}), memory=Memory(), providers={"kvm-home": provider},  # type: ignore[arg-type]
                  cached=True)
    with pytest.raises(FreshReadNeeded):
        await ctx.write({"phase": "Pending", "message": "m"})
    with pytest.raises(FreshReadNeeded):
        await ctx.delete("kvm-home", Ref("proxy-x", "nas1"))
    assert provider.calls == [] and kube.status_writes == 0 and kube.events == []
    ctx.proxy["status"] = {"phase": "Ready", "message": "ok"}
    with pytest.raises(FreshReadNeeded, match="remember the phase"):  # nothing to write but the gauge
        await ctx.write({"phase": "Ready", "message": "ok"})
    assert KEY not in ctx.memory


async def test_a_remember_of_what_is_remembered_makes_no_state_for_a_pass_from_the_cache() -> None:
    """A key forgotten while its pass from the cache ran (the Proxy deleted) is not remembered again."""
    ctx = settled_context()
    ctx.memory.forget(KEY)
    await actions.run(ctx, Remember(restarts=0, ip_waits=0, stranded_looks=0), spec_provider_name="kvm",
                      provider=None, desired=None, progress_interval=0.0)
    assert KEY not in ctx.memory


async def test_a_create_without_user_data_loaded_refuses() -> None:
    """Desired.user_data is None only for a pass from the cache, which never creates; if one ever got
    that far, no VM is made with empty user-data (its name hashes the real ones)."""
    provider = FakeProvider()
    kube = FakeKube()
    kube.create_proxy("px1", {"mode": "Managed"})
    ctx = Context(key=KEY, proxy=copy.deepcopy(kube.objects[KEY]), log=get_logger("test"), kube=kube,
                  prober=TargetsOnly({}), memory=Memory(), providers={"kvm-home": provider})  # type: ignore[arg-type]
    desired = Desired(provider=provider, resolved=PLACED, name="proxy-x", user_data=None)
    with pytest.raises(RuntimeError, match="without its user-data loaded"):
        await actions.create(ctx, Create(Ref("proxy-x", "nas1"), None, None, ()), desired,
                             progress_interval=0.0)
    assert provider.calls == []
