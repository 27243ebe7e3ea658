"""A Managed Proxy's reconcile as one pure function: `plan_managed` takes what has been observed and
returns the next `Step` (the actions, in order, and either what the pass ends in or nothing, meaning
"re-plan with what these actions observed"). The reconciler gathers the inputs, runs the actions and
writes what the step composed; it decides nothing.

The rules are plan.py's (the phase table, `plan_retire`, `quota_fallback`, the retry schedules); this
module strings them together. A pass takes a few rounds, each a call of `plan_managed` on a richer
observation (at most `MAX_ROUNDS`):

1. look at the instances the rules need (provider reads: no side effects);
2. a replacement: retire what `plan_retire` says, say "replacing" (status then names the target);
3. look at the target (not while status names no instance and its host's session is live:
   `look_first`); a missing one is created, and the create's outcome is the next observation (an
   instance, or no capacity: `quota_fallback` or a QuotaExceeded trouble);
4. the phase table's plan: start, probe, hand the probes over, compose the status, when to look again.

Probes are data too: the step says which key to watch, unwatch or hand over, and the status it composes
reads the verdicts as they will be after those actions (`Probes`, mirroring `Prober.watch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from egress_kvm.kube.interfaces import Key, Obj
from egress_kvm.policy.external import external_refusal
from egress_kvm.policy.policies import EgressPolicies
from egress_kvm.providers.base import InProgress, Instance, PowerState, QuotaError, TransientError

from . import plan as rules
from .compose import Serving, Verdict, compose, external_verdict, reason_for
from .memory import KeyState
from .outcome import Fail, Result, Retry, Trouble, outcome_for
from .plan import NORMAL, WARNING, Action, Event, Plan
from .proxyspec import EXTERNAL, ProxySpec, SpecError, parse_spec
from .status import COND_HOST, PENDING, PROVISIONING, READY, RUNNING, Ref, get_condition, remove_condition
from .verdict import Health, ProbeKey, ProbeTarget, start_seed

MAX_ROUNDS = 8  # look, replace, look, create, create again (quota fallback), settle: 6 in the worst case


@dataclass(frozen=True)
class Timings:
    poll: float = 5.0  # look again at an instance that is starting or has no IP yet
    pending_retry: float = 30.0  # look again for something outside (a missing Secret)
    progress_interval: float = 2.0  # at most one status write per this many seconds for create progress
    import_poll: float = 10.0  # while a background import runs: refresh its progress in status
    restart_backoff_max: float = 300.0  # a VM that keeps stopping is started again at most this often
    # A VM running without an IP is looked at every `poll` this many times, then on a growing delay up
    # to ip_wait_max: a guest whose network never comes up must not cost a provider call every poll.
    ip_wait_polls: int = 60
    ip_wait_max: float = 60.0


# --- what is observed ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Unanswered:
    """The provider could not tell (a TransientError; HostUnreachable when the host did not answer)."""

    error: TransientError = field(compare=False)
    unreachable: bool = False


@dataclass(frozen=True)
class NoProvider:
    """No entry of the providers file serves the instance status names."""


Looked = Instance | None | Unanswered | NoProvider


@dataclass(frozen=True)
class Probe:
    target: ProbeTarget
    health: Health | None


@dataclass(frozen=True)
class Probes:
    """The prober's state per key, and what watch/unwatch/hand-over make of it (Prober.watch: a new target
    starts over from the seed, the same one keeps its verdict)."""

    by_key: Mapping[ProbeKey, Probe] = field(default_factory=dict)

    def health(self, key: ProbeKey) -> Health | None:
        probe = self.by_key.get(key)
        return probe.health if probe is not None else None

    def target(self, key: ProbeKey) -> ProbeTarget | None:
        probe = self.by_key.get(key)
        return probe.target if probe is not None else None

    def watch(self, key: ProbeKey, target: ProbeTarget, seed: Health | None) -> Probes:
        if self.target(key) == target:
            return self
        return Probes({**self.by_key, key: Probe(target, seed or Health())})

    def unwatch(self, key: ProbeKey) -> Probes:
        return Probes({k: v for k, v in self.by_key.items() if k != key})

    def hand_over(self, source: ProbeKey, dest: ProbeKey) -> Probes:
        probe = self.by_key.get(source)
        moved = self.unwatch(source)
        return Probes({**moved.by_key, dest: probe}) if probe is not None else moved


@dataclass(frozen=True)
class Observed:
    """Everything a Managed pass knows so far."""

    key: Key
    spec: ProxySpec
    status: Obj  # as last read or written
    generation: int
    desired: Ref | None  # the instance the spec asks for; None while `waiting`
    waiting: str | None = None  # why the desired instance cannot be computed (a missing Secret)
    seen: Mapping[Ref, Looked] = field(default_factory=dict)  # provider reads this pass
    probes: Probes = field(default_factory=Probes)
    memory: KeyState = field(default_factory=KeyState)
    created: bool = False  # this pass created the target
    quota: QuotaError | None = field(default=None, compare=False)  # the last create found no capacity
    importing: InProgress | None = field(default=None, compare=False)  # the last create waits on an import
    namespace: str = ""
    routine: bool = False  # queued only by the clock or its probes turning healthy: see vouched
    # Instances status names whose providers-file entry is gone (desired.unserved): never retired by a
    # Delete (nothing can delete them; dropping them from status would leak their VMs), kept in status
    # as previousInstance until the entry is back.
    unserved: frozenset[Ref] = frozenset()
    # The target's provider held a live session to its zone when the pass began (Provider.connected: no
    # I/O). Only then may a first create go without a look (look_first).
    target_connected: bool = False

    @property
    def own(self) -> ProbeKey:
        return ProbeKey(self.key)


# --- what is done ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Look:
    """Read an instance from its provider. `spec_provider`: through the spec's provider (the target),
    else through the one status names (provider_for_ref)."""

    ref: Ref
    spec_provider: bool = False


@dataclass(frozen=True)
class Create:
    target: Ref
    previous: Ref | None  # for the progress messages
    serving: ProbeTarget | None
    events: tuple[Event, ...]  # recorded once it succeeded


@dataclass(frozen=True)
class Start:
    target: Ref


@dataclass(frozen=True)
class Readdress:
    """Put a stranded instance back on the network (providers.base.Readdresses)."""

    target: Ref


@dataclass(frozen=True)
class Delete:
    ref: Ref


@dataclass(frozen=True)
class Watch:
    key: ProbeKey
    target: ProbeTarget
    seed: Health | None = None


@dataclass(frozen=True)
class Unwatch:
    key: ProbeKey


@dataclass(frozen=True)
class HandOver:
    """The replacement's probes, verdict and all, become the Proxy's own."""

    source: ProbeKey
    dest: ProbeKey


@dataclass(frozen=True)
class Record:
    event: Event  # recorded with the next status write


@dataclass(frozen=True)
class WriteStatus:
    status: Obj


@dataclass(frozen=True)
class Remember:
    restarts: int | None = None
    ip_waits: int | None = None
    stranded_looks: int | None = None


Act = (Look | Create | Start | Readdress | Delete | Watch | Unwatch | HandOver | Record | WriteStatus
       | Remember)


@dataclass(frozen=True)
class Unreachable:
    """The target's host did not answer: status held with this message, nothing else changes."""

    message: str
    error: str


@dataclass(frozen=True)
class Importing:
    """The create waits on a background image import (InProgress): Provisioning with its progress, looked
    at again when `wake` completes. Not an error: no backoff, no Event."""

    message: str
    wake: asyncio.Future[None] | None = field(default=None, compare=False)


Planned = Trouble | Fail | Importing  # ends a pass as if an act had raised it (the reconciler's _planned)
End = Result | Planned | Unreachable


@dataclass(frozen=True)
class Step:
    actions: tuple[Act, ...] = ()
    # What the pass ends in once the actions ran; None: re-plan with what they observed.
    end: End | None = None


# --- the planner ------------------------------------------------------------------------------------------

@dataclass
class _Book:
    """A step under construction: its actions and the probe state they leave."""

    o: Observed
    probes: Probes
    actions: list[Act] = field(default_factory=list)

    def watch(self, key: ProbeKey, target: ProbeTarget) -> None:
        probed = self.probes.target(key) is not None
        seed = start_seed(self.o.status, target, own=key == self.o.own, probed=probed)
        self.actions.append(Watch(key, target, seed))
        self.probes = self.probes.watch(key, target, seed)

    def unwatch(self, key: ProbeKey) -> None:
        self.actions.append(Unwatch(key))
        self.probes = self.probes.unwatch(key)

    def say(self, verdict: Verdict, serving: ProbeTarget | None) -> Obj:
        backing = Serving(serving, self.probes.health(self.o.own)) if serving is not None else None
        return compose(self.o.status, verdict, generation=self.o.generation, serving=backing)

    def step(self, end: End | None = None) -> Step:
        return Step(tuple(self.actions), end)


def vouched(o: Observed, target: Ref) -> Instance | None:
    """The target as its healthy probes vouch for it, or None when the provider must be asked.

    Only for a routine pass (queued by the clock alone: a resync, a probe refresh; or by its own probes
    turning healthy; any event, other verdict change, requeue or host coming back asks for a real look).
    A Ready or Running Proxy whose own endpoint (status.ip, the spec's port and check) this process
    probes with a healthy verdict is running at that IP: a stopped, paused, deleted or readdressed VM
    fails its probes and turns the verdict, which re-queues the key (not routine) and brings the provider
    read back. So a settled Proxy costs its host nothing on a resync or a probe refresh; at 1,000 Proxies
    those Gets (four calls and an exec each) had been most of the operator's steady-state load, and the
    pass that turns a Running Proxy Ready once its probes pass costs none either (one Get per Proxy
    created). Anything unsettled still looks: another phase or generation, a replacement, a host last
    seen unreachable, a verdict not healthy, a probe of another endpoint, no probe (a restart: the first
    pass looks before it watches)."""
    st = o.status
    ip = st.get("ip")
    if (not o.routine or st.get("phase") not in (READY, RUNNING) or not ip
            or st.get("observedGeneration") != o.generation or st.get("previousInstance")
            or Ref.from_status(st.get("instance")) != target or o.created
            or (get_condition(st, COND_HOST) or {}).get("status") == "False"):
        return None
    probe = o.probes.by_key.get(o.own)
    if probe is None or probe.health is None or probe.health.healthy is not True:
        return None
    if probe.target != ProbeTarget(ip, o.spec.port, o.spec.health, o.namespace, o.spec.auth_secret):
        return None
    return Instance(name=target.name, zone=target.zone, power_state=PowerState.RUNNING, ip=ip,
                    owner_uid="", created_at=None)


def plan_managed(o: Observed, t: Timings) -> Step:
    current = Ref.from_status(o.status.get("instance"))
    previous = Ref.from_status(o.status.get("previousInstance"))
    if current is not None and current == (o.desired or current) and current not in o.seen:
        settled = vouched(o, current)
        if settled is not None:
            o = replace(o, seen={**o.seen, current: settled})
    b = _Book(o, o.probes)
    if o.desired is None and current is None:
        b.unwatch(o.own)
        b.actions.append(WriteStatus(b.say(Verdict(PENDING, o.waiting or "", "Waiting", previous=previous),
                                           None)))
        return b.step(Result(requeue_after=t.pending_retry))
    target = o.desired or current
    assert target is not None
    if current is not None and current != target:
        return _replace(b, current=current, previous=previous, target=target)
    look = look_first(current=current, target=target, previous=previous, connected=o.target_connected,
                      create_answered=o.quota is not None or o.importing is not None)
    missing = [r for r in (previous, target) if r is not None and r not in o.seen and (r != target or look)]
    if missing:
        return Step(tuple(Look(r, spec_provider=r == target) for r in missing))
    serving = _serving(o, previous)
    if serving is not None:
        b.watch(o.own, serving)
    else:
        b.unwatch(ProbeKey(o.key, replacement=True))
    looked = o.seen.get(target)  # not looked at (look_first): taken as absent, the create decides
    if isinstance(looked, Unanswered | NoProvider):
        if isinstance(looked, Unanswered) and looked.unreachable:
            return b.step(Unreachable(f"zone {target.zone} unreachable: {looked.error}", str(looked.error)))
        if isinstance(looked, Unanswered):
            return b.step(_trouble(looked.error))  # retried like any transient error (outcome.py)
        raise AssertionError("the target is looked at through the spec's provider, which exists")
    return _instance(b, target=target, previous=previous, serving=serving, instance=looked, t=t)


def look_first(*, current: Ref | None, target: Ref, previous: Ref | None, connected: bool,
               create_answered: bool) -> bool:
    """Whether the target is read from its provider before the pass plans for it (not yet read this pass).

    Not when status names no instance (and previousInstance is not the target): the status write naming
    an instance always comes before its create (`_create`: "Record the name first"), so the look would
    find nothing and the plan would be the create, whose provider looks the name up itself and, should an
    instance be there after all (the write naming it was lost), keeps it if it is this Proxy's
    (Provider.create is idempotent; `Instance.existed` then changes its Event) and refuses one that is
    not, as the look would have. A new Proxy, one whose Secret came back, one switched from External:
    one provider read fewer, the one before its create. Not after this pass's create answered "no
    capacity" or "an import runs" either: that answer is the observation (the planner's step 3).
    Whenever status names an instance, even the target (a restart mid-create, a quota or import retry,
    a replacement), it may exist in any state: looked at. And looked at when the provider holds no live
    session to the target's zone (`connected`: none yet, or its host down): a look that finds the host
    down ends the pass with nothing recorded, where the create would first write the name into status
    and leave a delete of the Proxy waiting for the host to answer again."""
    if create_answered:
        return False
    return current is not None or previous == target or not connected


def _serving(o: Observed, previous: Ref | None) -> ProbeTarget | None:
    """The replaced instance keeps serving (probed under the Proxy's key) while it runs with an IP."""
    inst = o.seen.get(previous) if previous is not None else None
    if isinstance(inst, Instance) and inst.power_state is PowerState.RUNNING and inst.ip:
        return ProbeTarget(inst.ip, o.spec.port, o.spec.health, o.namespace, o.spec.auth_secret)
    return None


def _replace(b: _Book, *, current: Ref, previous: Ref | None, target: Ref) -> Step:
    """The inputs changed: retire what plan_retire says, then say so (status then names the target)."""
    o = b.o
    need = current if previous is None else previous
    if need not in o.seen:
        return Step((Look(need),))
    # `current` serves if it runs with an IP, or if its provider could not tell (kept, so it is deleted
    # once the replacement is Ready rather than leaked).
    # An instance whose providers-file entry is gone is kept the same way: as previousInstance, deleted once
    # the replacement is Ready and the entry is back.
    serves = previous is None and (_serving(o, current) is not None or isinstance(o.seen[current],
                                                                                 Unanswered)
                                   or current in o.unserved)
    retire = rules.plan_retire(current=current, previous=previous, target=target, current_serves=serves)
    stuck = [r for r in retire.delete if r in o.unserved]
    if stuck:
        if retire.previous is not None:  # no slot left to keep it in: wait for the entry rather than leak
            message = (f"{_unserved_message(o, stuck[0])}; the replacement of {current.name} by "
                       f"{target.name} waits until the entry is back")
            return b.step(Trouble("ProviderMissing", message, Retry.QUOTA,
                                  Event(WARNING, "ProviderMissing", message)))
        retire = rules.Retire(delete=tuple(r for r in retire.delete if r != stuck[0]), previous=stuck[0])
    if retire.previous is not None and retire.previous in o.unserved:
        b.actions.append(Record(_kept_event(o, retire.previous)))
    b.actions.extend(Delete(ref) for ref in retire.delete)
    b.actions.append(Record(Event(NORMAL, "Replacing", f"provisioning inputs changed: replacing instance "
                                                        f"{current.name} with {target.name}")))
    b.unwatch(ProbeKey(o.key, replacement=True))  # a new replacement starts over
    serving = _serving(o, retire.previous)
    if serving is not None:
        b.watch(o.own, serving)
    else:
        b.unwatch(o.own)
    b.actions.append(WriteStatus(b.say(Verdict(PROVISIONING, f"replacing instance {current.name} with "
                                               f"{target.name}", "Provisioning", instance=target,
                                               previous=retire.previous), serving)))
    return b.step()


def _instance(b: _Book, *, target: Ref, previous: Ref | None, serving: ProbeTarget | None,
              instance: Instance | None, t: Timings) -> Step:
    """The phase table's plan for the target, carried out (see the module docstring, step 4)."""
    o = b.o
    current = Ref.from_status(o.status.get("instance"))
    probe_key = ProbeKey(o.key, replacement=serving is not None)
    if instance is not None and instance.power_state is PowerState.RUNNING and instance.ip:
        b.watch(probe_key, ProbeTarget(instance.ip, o.spec.port, o.spec.health, o.namespace,
                                       o.spec.auth_secret))
    # While the old instance serves, status.ip is its address, not the new one's.
    had_ip = not o.created and current == target and bool(o.status.get("ip")) and serving is None
    plan = rules.plan_instance(target=target, instance=instance, had_ip=had_ip,
                               health=b.probes.health(probe_key),
                               success_threshold=o.spec.health.success_threshold,
                               has_previous=previous is not None, stranded_looks=o.memory.stranded_looks,
                               last_ip=str(o.status.get("ip") or ""))
    if plan.stranded and plan.action is not Action.READDRESS:
        b.actions.append(Remember(stranded_looks=o.memory.stranded_looks + 1))
    elif not plan.stranded and o.memory.stranded_looks:
        b.actions.append(Remember(stranded_looks=0))
    if o.created and plan.action is not Action.NONE:
        plan = Plan(phase=PROVISIONING, message=plan.message, ip=plan.ip, poll=True)
    delay: float | None = None
    if plan.action is Action.CREATE:
        return _create(b, plan, target=target, previous=previous, serving=serving, probe_key=probe_key, t=t)
    if plan.action is Action.START:
        b.unwatch(probe_key)
        starts = o.memory.restarts + 1
        b.actions += [Start(target), Remember(restarts=starts)]
        if rules.restart_announced(starts):
            suffix = f" (started {starts} times since it was last Ready)" if starts > 1 else ""
            b.actions += [Record(Event(e.type_, e.reason, e.message + suffix)) for e in plan.events]
        delay = rules.restart_delay(starts, poll=t.poll, cap=t.restart_backoff_max)
    if plan.action is Action.READDRESS:
        # Counted as a restart: a guest that strands itself again and again is readdressed on the
        # restarts' growing delay, its Event on the 1st, 2nd, 4th... time only.
        b.unwatch(probe_key)
        starts = o.memory.restarts + 1
        b.actions += [Readdress(target), Remember(restarts=starts, stranded_looks=0)]
        if rules.restart_announced(starts):
            suffix = f" ({starts} restarts since it was last Ready)" if starts > 1 else ""
            b.actions += [Record(Event(e.type_, e.reason, e.message + suffix)) for e in plan.events]
        delay = rules.restart_delay(starts, poll=t.poll, cap=t.restart_backoff_max)
    if not plan.probe:
        b.unwatch(probe_key)
    if plan.delete_previous and previous is not None and previous in o.unserved:
        b.actions.append(Record(_kept_event(o, previous)))  # kept in status until its entry is back
    elif plan.delete_previous and previous is not None:
        b.actions += [Delete(previous), Record(Event(NORMAL, "Replaced", f"instance {target.name} is Ready; "
                                                     f"deleted the instance it replaced, {previous.name}"))]
        if probe_key != o.own:
            b.actions.append(HandOver(probe_key, o.own))
            b.probes = b.probes.hand_over(probe_key, o.own)
        previous, serving = None, None
    return _settle(b, plan, target=target, previous=previous, serving=serving, instance=instance,
                   delay=delay, t=t)


def _create(b: _Book, plan: Plan, *, target: Ref, previous: Ref | None, serving: ProbeTarget | None,
            probe_key: ProbeKey, t: Timings) -> Step:
    """Create the target, or (its create found no capacity) fall back per `quota_fallback`."""
    o = b.o
    if o.desired is None:
        b.unwatch(probe_key)
        verdict = Verdict(PENDING, f"instance {target.name} is gone and cannot be recreated until the "
                          "cloud-init Secret is back (spec.cloudInit.secretRef)", "Waiting", instance=target,
                          previous=previous)
        b.actions.append(WriteStatus(b.say(verdict, serving)))
        return b.step(Result(requeue_after=t.pending_retry))
    if o.importing is not None:
        return b.step(Importing(str(o.importing), o.importing.wake))
    if o.quota is not None:
        if (previous is None or previous in o.unserved  # nothing can delete it: no room is made
                or not rules.quota_fallback(previous=previous, target=target)):
            return b.step(_trouble(o.quota))
        # No room for both on this host: give up create-before-delete for this one replacement.
        b.actions += [Delete(previous), Record(Event(
            WARNING, "ReplacingWithoutOverlap", f"no capacity for {target.name} next to {previous.name} "
            f"({o.quota}); deleted {previous.name} first"))]
        b.actions.append(WriteStatus(b.say(Verdict(
            PROVISIONING, f"deleted {previous.name} to make room; creating {target.name}", "Provisioning",
            instance=target), None)))
        b.actions.append(Create(target, None, None, plan.events))
        return b.step()
    b.unwatch(probe_key)
    # Record the name first: from here on, deletion and GC know this instance may exist. A retry after
    # no capacity, or one waiting on an image import, finds it recorded already: status keeps saying why
    # it waits.
    trouble = o.memory.trouble
    waits = (trouble is not None and trouble[0] == "QuotaExceeded") or o.memory.importing
    if not (waits and Ref.from_status(o.status.get("instance")) == target):
        b.actions.append(WriteStatus(b.say(Verdict(PROVISIONING, plan.message, "Provisioning",
                                                   instance=target, previous=previous), serving)))
    b.actions.append(Create(target, previous, serving, plan.events))
    return b.step()


def _settle(b: _Book, plan: Plan, *, target: Ref, previous: Ref | None, serving: ProbeTarget | None,
            instance: Instance | None, delay: float | None, t: Timings) -> Step:
    """The plan's status, and when to look again."""
    o = b.o
    health = b.probes.health(o.own) if plan.probe else None
    endpoint = ProbeTarget(plan.ip, o.spec.port, o.spec.health).endpoint if plan.ip else None
    b.actions.append(WriteStatus(b.say(Verdict(
        plan.phase, plan.message, reason_for(plan.phase, health), ip=plan.ip, endpoint=endpoint,
        instance=target, previous=previous, health=health, probing=plan.probe,
        host_ok=(True, f"zone {target.zone} answered")), serving)))
    if plan.phase == READY:
        b.actions.append(Remember(restarts=0))
    if delay is not None:
        return b.step(Result(requeue_after=delay))
    if plan.poll and instance is not None and instance.power_state is PowerState.RUNNING and not instance.ip:
        waits = o.memory.ip_waits + 1
        b.actions.append(Remember(ip_waits=waits))
        return b.step(Result(requeue_after=rules.ip_wait_delay(waits, poll=t.poll, polls=t.ip_wait_polls,
                                                               cap=t.ip_wait_max)))
    b.actions.append(Remember(ip_waits=0))
    return b.step(Result(requeue_after=t.poll if plan.poll else None))


def plan_external(o: Observed, policies: EgressPolicies) -> Step:
    """An External Proxy: what a Managed spec left behind goes, and only the probes decide (one round)."""
    b = _Book(o, o.probes)
    kept: list[Ref] = []
    for field_ in ("instance", "previousInstance"):
        ref = Ref.from_status(o.status.get(field_))
        if ref is not None and ref in o.unserved:  # nothing can delete it: kept in status, not leaked
            kept.append(ref)
            b.actions.append(Record(_kept_event(o, ref)))
        elif ref is not None:  # switched from Managed: its instances go
            b.actions.append(Delete(ref))
    b.unwatch(ProbeKey(o.key, replacement=True))
    host, port = o.spec.external_host, o.spec.external_port
    assert host is not None and port is not None
    refused = external_refusal(policies, host=host, port=port, auth=bool(o.spec.auth_secret))
    if refused is not None:
        failed = outcome_for(SpecError(refused), deleting=False)  # a verdict on the spec (outcome.py)
        assert isinstance(failed, Fail)
        return b.step(failed)
    target = ProbeTarget(host, port, o.spec.health, o.namespace, o.spec.auth_secret, external=True)
    b.watch(o.own, target)
    verdict = external_verdict(b.probes.health(o.own), host=host, target=target)
    if kept:  # the one left behind is previousInstance (two: the one that was current stays instance)
        verdict = replace(verdict, previous=kept[-1], instance=kept[0] if len(kept) > 1 else None)
    status = compose(o.status, verdict, generation=o.generation)
    remove_condition(status, COND_HOST)  # no host of ours is involved
    b.actions.append(WriteStatus(status))
    return b.step(Result())


def stored_probe(status: Obj, spec: object, *, key: Key, namespace: str, probes: Probes) -> Watch | None:
    """A pass that observed nothing (a retried error, the host did not answer, an import runs) while this
    process is not probing yet (a restart): probe the endpoint status names, which the VM serves without
    its host's help, from the recorded verdict. Without it a stale Ready would stand with no probe."""
    own = ProbeKey(key)
    if probes.health(own) is not None or status.get("phase") not in (RUNNING, READY):
        return None
    try:
        parsed = parse_spec(spec)
    except SpecError:
        return None
    ip = status.get("ip")
    if not ip or parsed.mode == EXTERNAL:
        return None
    target = ProbeTarget(str(ip), parsed.port, parsed.health, namespace, parsed.auth_secret)
    if status.get("endpoint") != target.endpoint:
        return None
    return Watch(own, target, start_seed(status, target, own=True, probed=probes.target(own) is not None))


def _unserved_message(o: Observed, ref: Ref) -> str:
    entry = ref.provider or o.spec.provider
    return (f"instance {ref.name} on {ref.zone} was made by provider {entry!r}, which is not in the "
            f"providers file")


def _kept_event(o: Observed, ref: Ref) -> Event:
    """Said on every pass that would retire `ref` (Events of the same text are counted, not repeated)."""
    return Event(WARNING, "ProviderMissing", f"{_unserved_message(o, ref)}: it is not deleted but kept as "
                 f"status.previousInstance, and deleted once the entry is back")


def _trouble(error: Exception) -> Trouble:
    outcome = outcome_for(error, deleting=False)
    assert isinstance(outcome, Trouble)  # the provider's retryable errors (outcome.py)
    return outcome


Outcome = Looked | QuotaError | InProgress


def learn(o: Observed, act: Act, outcome: Outcome) -> Observed:
    """`o` with what running `act` observed (a look's instance; a create's instance, QuotaError or
    InProgress)."""
    if isinstance(act, Look):
        assert not isinstance(outcome, QuotaError | InProgress)
        return replace(o, seen={**o.seen, act.ref: outcome})
    if isinstance(act, Create):
        if isinstance(outcome, QuotaError):
            return replace(o, quota=outcome, importing=None)
        if isinstance(outcome, InProgress):
            return replace(o, importing=outcome, quota=None)
        assert isinstance(outcome, Instance)
        return replace(o, seen={**o.seen, act.target: outcome}, created=True, quota=None, importing=None)
    return o

