"""The Managed planner as tables: what was observed in, the actions, the status and how the pass ends out
(planner.plan_managed). No I/O: each row is one round; the reconciler's rounds are the rows chained."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from egress_kvm.controller.memory import KeyState
from egress_kvm.controller.outcome import Fail, Result, Retry, Trouble
from egress_kvm.controller.plan import create_events
from egress_kvm.controller.planner import (
    Act,
    Create,
    Delete,
    HandOver,
    Importing,
    Look,
    Looked,
    NoProvider,
    Observed,
    Probe,
    Probes,
    Record,
    Remember,
    Start,
    Step,
    Timings,
    Unanswered,
    Unreachable,
    Unwatch,
    Watch,
    WriteStatus,
    learn,
    look_first,
    plan_external,
    plan_managed,
    stored_probe,
)
from egress_kvm.controller.proxyspec import HealthCheck, ProxySpec
from egress_kvm.controller.status import Ref
from egress_kvm.controller.verdict import Health, ProbeKey, ProbeTarget
from egress_kvm.policy.policies import EgressPolicies
from egress_kvm.providers.base import (
    HostUnreachable,
    InProgress,
    Instance,
    Placement,
    PowerState,
    QuotaError,
    TransientError,
)
from tests.fakes import LOOPBACK_EGRESS

KEY = ("ns", "px")
OWN, REPL = ProbeKey(KEY), ProbeKey(KEY, replacement=True)
SPEC = ProxySpec(mode="Managed", provider="kvm", placement=Placement(zone="nas1", machine_type="small",
                                                                     image="debian", region=""),
                 port=3128, health=HealthCheck(success_threshold=2))
OLD, NEW, NEW2 = Ref("proxy-old", "nas1"), Ref("proxy-new", "nas1"), Ref("proxy-new", "nas2")
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
T = Timings(poll=5.0, pending_retry=30.0, restart_backoff_max=300.0, ip_wait_polls=2, ip_wait_max=60.0)
U_REPL, U_OWN = ("Unwatch", "ns/px (replacement)"), ("Unwatch", "ns/px")
HEALTHY = Health(healthy=True, message="GET ok", last_probe=NOW, successes=2)


def vm(ref: Ref, state: PowerState = PowerState.RUNNING, ip: str | None = "10.0.0.1") -> Instance:
    return Instance(name=ref.name, zone=ref.zone, power_state=state, ip=ip, owner_uid="u", created_at=NOW)


def probe(ip: str, health: Health | None = HEALTHY) -> Probe:
    return Probe(ProbeTarget(ip, 3128, SPEC.health, "ns"), health)


def observed(*, instance: Ref | None = None, previous: Ref | None = None, desired: Ref | None = NEW,
             ip: str | None = None, seen: dict[Ref, Looked] | None = None,
             probes: dict[ProbeKey, Probe] | None = None, **kw: Any) -> Observed:
    status: dict[str, Any] = {"phase": "Running" if ip else "Provisioning"}
    if instance is not None:
        status["instance"] = instance.to_dict()
    if previous is not None:
        status["previousInstance"] = previous.to_dict()
    if ip:
        status["ip"] = ip
    return Observed(key=KEY, spec=SPEC, status=status, generation=2, desired=desired, namespace="ns",
                    seen=seen or {}, probes=Probes(probes or {}), **kw)


def brief(act: Act) -> tuple[Any, ...]:
    """An action as a table cell."""
    match act:
        case Look(ref=ref):
            return ("Look", ref.name)
        case Create(target=target, previous=previous):
            return ("Create", target.name, previous.name if previous else None)
        case Start(target=target):
            return ("Start", target.name)
        case Delete(ref=ref):
            return ("Delete", ref.name)
        case Watch(key=key, target=target):
            return ("Watch", str(key), target.host)
        case Unwatch(key=key):
            return ("Unwatch", str(key))
        case HandOver(source=source, dest=dest):
            return ("HandOver", str(source), str(dest))
        case Record(event=event):
            return ("Record", event.reason)
        case WriteStatus(status=s):
            return ("Status", s["phase"], s.get("ip"), (s.get("instance") or {}).get("name"),
                    (s.get("previousInstance") or {}).get("name"))
        case Remember(restarts=restarts, ip_waits=ip_waits):
            return ("Remember", restarts, ip_waits)
    raise AssertionError(act)


def table(step: Step) -> list[tuple[Any, ...]]:
    return [brief(a) for a in step.actions]


ROWS: list[tuple[str, Observed, list[tuple[Any, ...]], object]] = [
    ("waiting for the Secret, nothing made yet: Pending",
     observed(desired=None, waiting="waiting for Secret ns/s"),
     [U_OWN, ("Status", "Pending", None, None, None)], Result(requeue_after=30.0)),
    ("first round: look at the target",
     observed(instance=NEW), [("Look", "proxy-new")], None),
    ("steady state: running, IP, healthy: Ready",
     observed(instance=NEW, ip="10.0.0.1", seen={NEW: vm(NEW)}, probes={OWN: probe("10.0.0.1")}),
     [U_REPL, ("Watch", "ns/px", "10.0.0.1"),
      ("Status", "Ready", "10.0.0.1", "proxy-new", None), ("Remember", 0, None), ("Remember", None, 0)],
     Result()),
    ("a new IP starts the probes over: Running",
     observed(instance=NEW, ip="10.0.0.1", seen={NEW: vm(NEW, ip="10.0.0.9")},
              probes={OWN: probe("10.0.0.1")}),
     [U_REPL, ("Watch", "ns/px", "10.0.0.9"),
      ("Status", "Running", "10.0.0.9", "proxy-new", None), ("Remember", None, 0)], Result()),
    ("a new Proxy (status names no instance), its host's session live: no look, record the name, create",
     observed(target_connected=True),
     [U_REPL, U_OWN,
      ("Status", "Provisioning", None, "proxy-new", None), ("Create", "proxy-new", None)], None),
    ("a new Proxy, no live session to its host (none yet, or the host down): looked at first",
     observed(), [("Look", "proxy-new")], None),
    ("status names only a previous instance (kept from a Managed spec, entry gone): only it is looked at",
     observed(previous=OLD, unserved=frozenset({OLD}), target_connected=True), [("Look", "proxy-old")], None),
    ("this pass's create found no capacity: its answer is the observation, no look",
     observed(instance=NEW, quota=QuotaError("no memory")),
     [U_REPL], Trouble("QuotaExceeded", "out of capacity: no memory", Retry.QUOTA)),
    ("this pass's create waits on an import: its answer is the observation, no look",
     observed(instance=NEW, importing=InProgress("waiting for image debian: 10%")),
     [U_REPL], Importing("waiting for image debian: 10%")),
    ("none yet: record the name, then create",
     observed(seen={NEW: None}),
     [U_REPL, U_OWN,
      ("Status", "Provisioning", None, "proxy-new", None), ("Create", "proxy-new", None)], None),
    ("a retry after no capacity does not rewrite 'creating'",
     observed(instance=NEW, seen={NEW: None}, memory=KeyState(trouble=("QuotaExceeded", "out of capacity"))),
     [U_REPL, U_OWN, ("Create", "proxy-new", None)], None),
    ("created, no IP yet: Provisioning, poll",
     observed(instance=NEW, seen={NEW: vm(NEW, ip=None)}, created=True),
     [U_REPL, U_OWN,
      ("Status", "Provisioning", None, "proxy-new", None), ("Remember", None, 1)], Result(requeue_after=5.0)),
    ("no IP for longer than ip_wait_polls: backs off",
     observed(instance=NEW, seen={NEW: vm(NEW, ip=None)}, memory=KeyState(ip_waits=2)),
     [U_REPL, U_OWN, ("Status", "Provisioning", None, "proxy-new", None), ("Remember", None, 3)],
     Result(requeue_after=10.0)),
    ("no capacity next to the serving one on its host: delete it first, create again",
     observed(instance=NEW, previous=OLD, seen={NEW: None, OLD: vm(OLD)}, quota=QuotaError("no memory")),
     [("Watch", "ns/px", "10.0.0.1"), ("Delete", "proxy-old"), ("Record", "ReplacingWithoutOverlap"),
      ("Status", "Provisioning", None, "proxy-new", None), ("Create", "proxy-new", None)], None),
    ("the create waits on a background image import: Provisioning with its progress, no backoff",
     observed(instance=NEW, seen={NEW: None}, importing=InProgress("waiting for image debian: 10%")),
     [U_REPL], Importing("waiting for image debian: 10%")),
    ("a retry while the image imports does not rewrite 'creating'",
     observed(instance=NEW, seen={NEW: None}, memory=KeyState(importing=True)),
     [U_REPL, U_OWN, ("Create", "proxy-new", None)], None),
    ("no capacity on another host: keep the serving one, back off slowly",
     observed(instance=NEW2, previous=OLD, desired=NEW2, seen={NEW2: None, OLD: vm(OLD)},
              quota=QuotaError("no memory")),
     [("Watch", "ns/px", "10.0.0.1")], Trouble("QuotaExceeded", "out of capacity: no memory", Retry.QUOTA)),
    ("no capacity and nothing to delete",
     observed(instance=NEW, seen={NEW: None}, quota=QuotaError("no memory")),
     [U_REPL], Trouble("QuotaExceeded", "out of capacity: no memory", Retry.QUOTA)),
    ("inputs changed: look at the current instance first",
     observed(instance=OLD, ip="10.0.0.1"), [("Look", "proxy-old")], None),
    ("inputs changed, the current one serves: it stays as previous",
     observed(instance=OLD, ip="10.0.0.1", seen={OLD: vm(OLD)}, probes={OWN: probe("10.0.0.1")}),
     [("Record", "Replacing"), U_REPL, ("Watch", "ns/px", "10.0.0.1"),
      ("Status", "Ready", "10.0.0.1", "proxy-new", "proxy-old")], None),
    ("inputs changed, the current one cannot be told: kept (deleted once the new one is Ready)",
     observed(instance=OLD, seen={OLD: Unanswered(TransientError("busy"))}),
     [("Record", "Replacing"), U_REPL, U_OWN,
      ("Status", "Provisioning", None, "proxy-new", "proxy-old")], None),
    ("inputs changed, the current one never worked: deleted at once",
     observed(instance=OLD, seen={OLD: vm(OLD, PowerState.STOPPED, ip=None)}),
     [("Delete", "proxy-old"), ("Record", "Replacing"), U_REPL,
      U_OWN, ("Status", "Provisioning", None, "proxy-new", None)], None),
    ("changed again mid-replacement: the one in between goes, the serving one stays",
     observed(instance=Ref("proxy-mid", "nas1"), previous=OLD, seen={OLD: vm(OLD)},
              probes={OWN: probe("10.0.0.1")}),
     [("Delete", "proxy-mid"), ("Record", "Replacing"), U_REPL,
      ("Watch", "ns/px", "10.0.0.1"), ("Status", "Ready", "10.0.0.1", "proxy-new", "proxy-old")], None),
    ("the replacement is probed under its own key while the old one serves",
     observed(instance=NEW, previous=OLD, seen={OLD: vm(OLD), NEW: vm(NEW, ip="10.0.0.2")},
              probes={OWN: probe("10.0.0.1")}),
     [("Watch", "ns/px", "10.0.0.1"), ("Watch", "ns/px (replacement)", "10.0.0.2"),
      ("Status", "Ready", "10.0.0.1", "proxy-new", "proxy-old"), ("Remember", None, 0)], Result()),
    ("the replacement is Ready: the old one goes, its probes take over the Proxy's key",
     observed(instance=NEW, previous=OLD, seen={OLD: vm(OLD), NEW: vm(NEW, ip="10.0.0.2")},
              probes={OWN: probe("10.0.0.1"), REPL: probe("10.0.0.2")}),
     [("Watch", "ns/px", "10.0.0.1"), ("Watch", "ns/px (replacement)", "10.0.0.2"), ("Delete", "proxy-old"),
      ("Record", "Replaced"), ("HandOver", "ns/px (replacement)", "ns/px"),
      ("Status", "Ready", "10.0.0.2", "proxy-new", None), ("Remember", 0, None), ("Remember", None, 0)],
     Result()),
    # An instance whose providers-file entry is gone (the ConfigMap reset) cannot be deleted: dropping it
    # from status would leak its VM, so it is kept as previousInstance until the entry is back.
    ("inputs changed, the current one's entry is gone: kept as previous, not deleted",
     observed(instance=OLD, seen={OLD: NoProvider()}, unserved=frozenset({OLD})),
     [("Record", "ProviderMissing"), ("Record", "Replacing"), U_REPL, U_OWN,
      ("Status", "Provisioning", None, "proxy-new", "proxy-old")], None),
    ("back to the serving one mid-replacement, the one in between has no entry: it becomes previous",
     observed(instance=Ref("proxy-mid", "nas1"), previous=NEW, seen={NEW: vm(NEW)},
              unserved=frozenset({Ref("proxy-mid", "nas1")})),
     [("Record", "ProviderMissing"), ("Record", "Replacing"), U_REPL, U_OWN,
      ("Status", "Provisioning", None, "proxy-new", "proxy-mid")], None),
    ("changed again mid-replacement, the one in between has no entry and the old one serves: waits",
     observed(instance=Ref("proxy-mid", "nas1"), previous=OLD, seen={OLD: vm(OLD)},
              unserved=frozenset({Ref("proxy-mid", "nas1")})),
     [], Trouble("ProviderMissing", "instance proxy-mid on nas1 was made by provider 'kvm', which is not "
                 "in the providers file; the replacement of proxy-mid by proxy-new waits until the entry is "
                 "back", Retry.QUOTA)),
    ("the replacement is Ready, the old one's entry is gone: kept as previous, not deleted",
     observed(instance=NEW, previous=OLD, seen={OLD: NoProvider(), NEW: vm(NEW, ip="10.0.0.2")},
              probes={OWN: probe("10.0.0.2")}, unserved=frozenset({OLD})),
     [U_REPL, ("Watch", "ns/px", "10.0.0.2"), ("Record", "ProviderMissing"),
      ("Status", "Ready", "10.0.0.2", "proxy-new", "proxy-old"), ("Remember", 0, None),
      ("Remember", None, 0)], Result()),
    ("no capacity next to one whose entry is gone: nothing is deleted to make room",
     observed(instance=NEW, previous=OLD, seen={NEW: None, OLD: NoProvider()}, quota=QuotaError("no memory"),
              unserved=frozenset({OLD})),
     [U_REPL], Trouble("QuotaExceeded", "out of capacity: no memory", Retry.QUOTA)),
    ("stopped: started, the 2nd start in a row is told",
     observed(instance=NEW, ip="10.0.0.1", seen={NEW: vm(NEW, PowerState.STOPPED)},
              memory=KeyState(restarts=1)),
     [U_REPL, U_OWN, ("Start", "proxy-new"), ("Remember", 2, None),
      ("Record", "Restarted"), U_OWN, ("Status", "Running", "10.0.0.1", "proxy-new", None)],
     Result(requeue_after=10.0)),
    ("stopped: the 3rd start in a row is not told",
     observed(instance=NEW, ip="10.0.0.1", seen={NEW: vm(NEW, PowerState.STOPPED)},
              memory=KeyState(restarts=2)),
     [U_REPL, U_OWN, ("Start", "proxy-new"), ("Remember", 3, None),
      U_OWN, ("Status", "Running", "10.0.0.1", "proxy-new", None)], Result(requeue_after=20.0)),
    ("vanished after it had an IP: recreated with a Warning",
     observed(instance=NEW, ip="10.0.0.1", seen={NEW: None}),
     [U_REPL, U_OWN,
      ("Status", "Provisioning", None, "proxy-new", None), ("Create", "proxy-new", None)], None),
    ("gone while the Secret is missing: Pending, never created blind",
     observed(instance=NEW, desired=None, waiting="no Secret", seen={NEW: None}),
     [U_REPL, U_OWN, ("Status", "Pending", None, "proxy-new", None)],
     Result(requeue_after=30.0)),
    ("the target's host did not answer: held, never recreated",
     observed(instance=NEW, seen={NEW: Unanswered(HostUnreachable("no route"), unreachable=True)}),
     [U_REPL], Unreachable("zone nas1 unreachable: no route", "no route")),
    ("the target's host answered with a transient error: retried",
     observed(instance=NEW, seen={NEW: Unanswered(TransientError("busy"))}),
     [U_REPL], Trouble("TransientError", "retrying: busy", Retry.TRANSIENT)),
]


@pytest.mark.parametrize(("observed_", "actions", "end"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_plan_managed(observed_: Observed, actions: list[tuple[Any, ...]], end: object) -> None:
    step = plan_managed(observed_, T)
    assert table(step) == actions
    if isinstance(end, Trouble):
        assert isinstance(step.end, Trouble)
        assert (step.end.reason, step.end.message, step.end.retry) == (end.reason, end.message, end.retry)
    else:
        assert step.end == end


def test_the_created_instances_events_ride_on_its_create() -> None:
    fresh = plan_managed(observed(seen={NEW: None}), T)
    recreated = plan_managed(observed(instance=NEW, ip="10.0.0.1", seen={NEW: None}), T)
    def events(step: Step) -> list[tuple[str, str]]:
        return [(e.type_, e.reason) for e in next(a for a in step.actions if isinstance(a, Create)).events]

    assert events(fresh) == [("Normal", "Created")]
    assert events(recreated) == [("Warning", "Recreated")]


@pytest.mark.parametrize(("current", "previous", "connected", "create_answered", "look"), [
    (None, None, True, False, False),  # a new Proxy, one whose Secret came back, one switched from External
    (None, None, False, False, True),  # ...but no live session to its host: a dead host records nothing
    (None, OLD, True, False, False),  # previousInstance kept (its entry gone): only it is looked at
    (None, OLD, False, False, True),
    (None, NEW, True, False, True),  # previousInstance is the target itself: status names it, it may exist
    (NEW, None, True, False, True),  # status names it: a restart mid-create, a quota or import retry
    (NEW, OLD, True, False, True),  # a replacement, after the status write naming the target
    (OLD, None, True, False, True),  # (a replacement before that write: _replace looks at the current first)
    (NEW, None, True, True, False),  # this pass's create answered (no capacity, an import runs)
    (None, None, True, True, False),
    (None, None, False, True, False),  # (answered: the host answered, the answer is the observation)
])
def test_look_first(current: Ref | None, previous: Ref | None, connected: bool, create_answered: bool,
                    look: bool) -> None:
    assert look_first(current=current, target=NEW, previous=previous, connected=connected,
                      create_answered=create_answered) is look


def chain(o: Observed, world: dict[Ref, Instance | QuotaError | None]) -> tuple[list[tuple[Any, ...]], Any]:
    """The rounds of one pass, the provider answering from `world` (a create returns what is there, marked
    `existed`, as Provider.create does, or makes it)."""
    from egress_kvm.controller.planner import MAX_ROUNDS
    done: list[tuple[Any, ...]] = []
    for _ in range(MAX_ROUNDS):
        step = plan_managed(o, T)
        for act in step.actions:
            done.append(brief(act))
            outcome: Any = None
            if isinstance(act, Look):
                outcome = world[act.ref]
            elif isinstance(act, Create):
                there = world.get(act.target)
                outcome = (there if isinstance(there, QuotaError) else replace(there, existed=True)
                           if there is not None else vm(act.target, ip=None))
                if isinstance(outcome, Instance):
                    done.append(("Events", *(e.reason for e in create_events(
                        act.events, target=act.target, existed=outcome.existed))))
            elif isinstance(act, WriteStatus):
                o = replace(o, status=act.status)
            o = learn(o, act, outcome)
        if step.end is not None:
            return done, step.end
    raise AssertionError(f"no end in {MAX_ROUNDS} rounds: {done}")


def test_a_new_proxys_pass_creates_without_a_look() -> None:
    done, end = chain(observed(target_connected=True), {})
    assert not [a for a in done if a[0] == "Look"]
    assert done[:4] == [U_REPL, U_OWN, ("Status", "Provisioning", None, "proxy-new", None),
                        ("Create", "proxy-new", None)]
    assert ("Events", "Created") in done and end == Result(requeue_after=5.0)


def test_a_create_that_finds_its_instance_after_a_lost_status_write_says_found_not_created() -> None:
    """Status names nothing, yet the instance is there (the write naming it was lost): the create keeps it
    (the provider checked it is this Proxy's) and the Event says so; status then names it."""
    done, end = chain(observed(target_connected=True), {NEW: vm(NEW, PowerState.RUNNING, ip=None)})
    assert ("Events", "Found") in done and ("Events", "Created") not in done
    assert done[-2] == ("Status", "Provisioning", None, "proxy-new", None)
    assert end == Result(requeue_after=5.0)


def test_a_new_proxys_create_without_capacity_ends_in_quota_without_a_look() -> None:
    done, end = chain(observed(target_connected=True), {NEW: QuotaError("no memory")})
    assert not [a for a in done if a[0] == "Look"]
    assert isinstance(end, Trouble) and end.reason == "QuotaExceeded"


def test_a_new_proxys_pass_with_its_host_down_records_nothing() -> None:
    """No live session to the host: the look goes first, and the host not answering ends the pass before
    any status write names an instance (a delete of the Proxy then need not wait for the host)."""
    down = Unanswered(HostUnreachable("no route"), unreachable=True)
    done, end = chain(observed(target_connected=False), {NEW: down})
    assert done == [("Look", "proxy-new"), U_REPL]
    assert end == Unreachable("zone nas1 unreachable: no route", "no route")


def test_a_fresh_probe_of_the_own_key_starts_from_the_recorded_verdict() -> None:
    """A restart (nothing probed) keeps a recorded Ready for the same endpoint: no flap."""
    status = {"phase": "Ready", "healthy": True, "endpoint": "http://10.0.0.1:3128", "ip": "10.0.0.1",
              "instance": NEW.to_dict()}
    step = plan_managed(replace(observed(seen={NEW: vm(NEW)}), status=status), T)
    watch = next(a for a in step.actions if isinstance(a, Watch))
    assert watch.seed is not None and watch.seed.healthy
    assert brief(next(a for a in step.actions if isinstance(a, WriteStatus)))[1] == "Ready"


def test_learn_feeds_a_look_and_a_create_back() -> None:
    o = observed(instance=NEW)
    o = learn(o, Look(NEW), None)
    assert o.seen == {NEW: None}
    create = Create(NEW, None, None, ())
    assert learn(o, create, QuotaError("full")).quota is not None
    assert learn(o, create, InProgress("importing")).importing is not None
    made = learn(o, create, vm(NEW))
    assert (made.created, made.quota, made.seen[NEW]) == (True, None, vm(NEW))


def test_a_replacement_settles_in_bounded_rounds() -> None:
    """The rounds chained, with the world answering as a provider would: a serving old instance, the new one
    created and healthy; the pass ends within MAX_ROUNDS and the old one goes only after that."""
    from egress_kvm.controller.planner import MAX_ROUNDS
    o = observed(instance=OLD, ip="10.0.0.1", probes={OWN: probe("10.0.0.1")})
    world: dict[Ref, Instance | None] = {OLD: vm(OLD), NEW: None}
    done: list[tuple[Any, ...]] = []
    for _ in range(MAX_ROUNDS):
        step = plan_managed(o, T)
        for act in step.actions:
            done.append(brief(act))
            outcome: Any = None
            if isinstance(act, Look):
                outcome = world[act.ref]
            elif isinstance(act, Create):
                outcome = world[NEW] = vm(NEW, ip="10.0.0.2")
            elif isinstance(act, WriteStatus):
                o = replace(o, status=act.status)
            o = learn(o, act, outcome)
        if step.end is not None:
            break
    assert step.end == Result()
    assert ("Create", "proxy-new", "proxy-old") in done and ("Delete", "proxy-old") not in done
    assert done[-2:] == [("Status", "Ready", "10.0.0.1", "proxy-new", "proxy-old"), ("Remember", None, 0)]


EXTERNAL = replace(SPEC, mode="External", external_host="127.0.0.1", external_port=3128)


@pytest.mark.parametrize(("policies", "actions", "failed"), [
    # the default policy refuses loopback: a verdict on the spec, after what Managed left behind went
    (EgressPolicies.from_config(), [("Delete", "proxy-old"), U_REPL], True),
    (EgressPolicies.from_config(LOOPBACK_EGRESS),
     [("Delete", "proxy-old"), U_REPL, ("Watch", "ns/px", "127.0.0.1"),
      ("Status", "Running", "127.0.0.1", None, None)], False),
])
def test_plan_external(policies: EgressPolicies, actions: list[tuple[Any, ...]], failed: bool) -> None:
    o = replace(observed(instance=OLD, desired=None), spec=EXTERNAL)
    step = plan_external(o, policies)
    assert table(step) == actions
    if failed:
        assert isinstance(step.end, Fail) and step.end.message.startswith("spec.external.address")
        assert step.end.reason == "InvalidExternalAddress"
    else:
        assert step.end == Result()


@pytest.mark.parametrize(("instance", "previous", "unserved", "actions"), [
    # switched to External while the instance's entry is gone: kept as previousInstance, not leaked
    (OLD, None, {OLD}, [("Record", "ProviderMissing"), U_REPL, ("Watch", "ns/px", "127.0.0.1"),
                        ("Status", "Running", "127.0.0.1", None, "proxy-old")]),
    # kept there on the next pass; one that can be deleted still is
    (NEW, OLD, {OLD}, [("Delete", "proxy-new"), ("Record", "ProviderMissing"), U_REPL,
                       ("Watch", "ns/px", "127.0.0.1"),
                       ("Status", "Running", "127.0.0.1", None, "proxy-old")]),
    # both without an entry: both kept, the one that was current stays instance
    (NEW, OLD, {NEW, OLD}, [("Record", "ProviderMissing"), ("Record", "ProviderMissing"), U_REPL,
                            ("Watch", "ns/px", "127.0.0.1"),
                            ("Status", "Running", "127.0.0.1", "proxy-new", "proxy-old")]),
])
def test_plan_external_keeps_what_nothing_can_delete(instance: Ref, previous: Ref | None, unserved: set[Ref],
                                                     actions: list[tuple[Any, ...]]) -> None:
    o = replace(observed(instance=instance, previous=previous, desired=None), spec=EXTERNAL,
                unserved=frozenset(unserved))
    step = plan_external(o, EgressPolicies.from_config(LOOPBACK_EGRESS))
    assert table(step) == actions
    assert step.end == Result()


READY_STATUS = {"phase": "Ready", "healthy": True, "ip": "10.0.0.1", "endpoint": "http://10.0.0.1:3128"}
SPEC_OBJ = {"provider": "kvm", "port": 3128, "placement": {"zone": "nas1", "machineType": "small",
                                                           "image": "debian"}}


@pytest.mark.parametrize(("status", "probes", "watched"), [
    (READY_STATUS, {}, True),  # a restart while the host is down: the recorded Ready is probed, seeded
    (READY_STATUS, {OWN: probe("10.0.0.1")}, False),  # already probing
    ({**READY_STATUS, "phase": "Provisioning"}, {}, False),  # nothing served yet
    ({**READY_STATUS, "endpoint": "http://10.0.0.2:3128"}, {}, False),  # status names another endpoint
])
def test_a_pass_that_observed_nothing_probes_the_stored_endpoint(status: dict[str, Any],
                                                                  probes: dict[ProbeKey, Probe],
                                                                  watched: bool) -> None:
    got = stored_probe(status, SPEC_OBJ, key=KEY, namespace="ns", probes=Probes(probes))
    if watched:
        assert got is not None and got.key == OWN and got.target.endpoint == "http://10.0.0.1:3128"
        assert got.seed is not None and got.seed.healthy
    else:
        assert got is None
