"""Every row of the phase table (plan.plan_instance) and the transition Events."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from egress_kvm.controller.health import Health
from egress_kvm.controller.plan import STRANDED_LOOKS, Action, plan_instance, transition_events
from egress_kvm.controller.status import Ref
from egress_kvm.providers.base import Instance, PowerState

T = Ref("proxy-abc", "nas1")
NOW = datetime.now(UTC)


def inst(state: PowerState = PowerState.RUNNING, ip: str | None = "10.231.1.100",
         message: str = "", stranded: tuple[str, ...] = ()) -> Instance:
    return Instance(name="proxy-abc", zone="nas1", power_state=state, ip=ip, owner_uid="u", created_at=NOW,
                    message=message, stranded=stranded)


def plan(instance: Instance | None, *, had_ip: bool = False, health: Health | None = None,
         previous: bool = False, stranded_looks: int = 0, last_ip: str = "10.231.1.100"):
    return plan_instance(target=T, instance=instance, had_ip=had_ip, health=health, success_threshold=2,
                         has_previous=previous, stranded_looks=stranded_looks, last_ip=last_ip)


def test_none_never_seen_creates() -> None:
    p = plan(None)
    assert (p.phase, p.action) == ("Provisioning", Action.CREATE)
    assert [e.reason for e in p.events] == ["Created"]


def test_none_after_it_had_an_ip_recreates_with_a_warning() -> None:
    p = plan(None, had_ip=True)
    assert (p.phase, p.action) == ("Provisioning", Action.CREATE)
    assert [(e.type_, e.reason) for e in p.events] == [("Warning", "Recreated")]


@pytest.mark.parametrize("state", [PowerState.STOPPED, PowerState.CRASHED, PowerState.PAUSED])
def test_not_running_is_started(state: PowerState) -> None:
    p = plan(inst(state, message="disk full"))
    assert (p.phase, p.action, p.poll) == ("Running", Action.START, True)
    assert p.events[0].message == f"instance proxy-abc was {state.value} (disk full); started it"
    assert plan(inst(state, ip=None)).phase == "Provisioning"


def test_starting_polls() -> None:
    p = plan(inst(PowerState.PENDING))
    assert (p.phase, p.action, p.poll) == ("Provisioning", Action.NONE, True)


@pytest.mark.parametrize(("looks_before", "action"), [
    (0, Action.NONE),  # once is not enough: a guest just resumed answers its host again within a second
    (STRANDED_LOOKS - 2, Action.NONE),
    (STRANDED_LOOKS - 1, Action.READDRESS),  # the n-th look in a row
    (STRANDED_LOOKS + 5, Action.READDRESS),
])
def test_stranded_is_readdressed_after_a_few_looks(looks_before: int, action: Action) -> None:
    p = plan(inst(ip=None, stranded=("10.231.1.199",)), had_ip=True, stranded_looks=looks_before)
    assert (p.phase, p.action, p.poll, p.probe, p.ip, p.stranded) == (
        "Provisioning", action, True, False, None, True)
    assert "reports address 10.231.1.199, which its host cannot reach" in p.message
    reasons = [(e.type_, e.reason) for e in p.events]
    assert reasons == ([("Warning", "Readdressed")] if action is Action.READDRESS else [])


@pytest.mark.parametrize(("had_ip", "claims", "unanswered", "looks_before", "counts"), [
    (False, ("10.231.1.199",), False, 0, False),  # a first boot the host has not seen yet: waiting
    (True, ("10.231.1.199",), False, 0, True),  # it had an address: the guest moved
    (True, ("10.231.1.100", "10.231.1.199"), False, 0, False),  # still holds the old one: reachable
    (True, ("10.231.1.100",), False, 0, False),  # same address, the host's entry aged out: no move
    (True, ("10.231.1.100",), True, 0, True),  # same address, but the host tried it: no answer
    (False, ("10.231.1.199",), True, 0, True),  # the host tried every reported address, no answer
    (False, ("10.231.1.199",), False, 1, True),  # stranded at the last look (status.ip gone): counting
])
def test_what_counts_as_stranded(had_ip: bool, claims: tuple[str, ...], unanswered: bool, looks_before: int,
                                 counts: bool) -> None:
    """status.ip is 10.231.1.100 when `had_ip`."""
    i = Instance(name="proxy-abc", zone="nas1", power_state=PowerState.RUNNING, ip=None, owner_uid="u",
                 created_at=NOW, stranded=claims, unanswered=unanswered)
    p = plan(i, had_ip=had_ip, stranded_looks=looks_before)
    assert p.stranded is counts and p.action is Action.NONE
    assert ("waiting for the IP address" in p.message) is not counts


def test_a_guest_claiming_many_addresses_gets_a_short_message() -> None:
    claims = tuple(f"10.231.2.{i}" for i in range(1, 201))
    p = plan(inst(ip=None, stranded=claims), had_ip=True, stranded_looks=STRANDED_LOOKS)
    assert "reports address 10.231.2.1, 10.231.2.2, 10.231.2.3 and 197 more, which" in p.message
    assert "10.231.2.4," not in p.message and all("10.231.2.4," not in e.message for e in p.events)
    assert len(p.events[0].message) < 300


@pytest.mark.parametrize(("health", "phase", "poll"), [
    (Health(healthy=None, message="", successes=1, failures=0), "Running", True),
    (Health(healthy=False, message="timed out", successes=0, failures=3), "Running", True),
    (Health(healthy=True, message="HTTP 200", successes=2, failures=0), "Ready", False),
])
def test_stranded_beside_the_hosts_address_is_polled_not_readdressed(health: Health, phase: str,
                                                                    poll: bool) -> None:
    """The host still maps an address (the old one, until its next attempt fails): the instance is
    probed there, and polled while not healthy, since nothing else says when the host gives up on it."""
    p = plan(inst(stranded=("10.231.1.199",)), health=health, stranded_looks=STRANDED_LOOKS)
    assert (p.phase, p.action, p.ip, p.poll) == (phase, Action.NONE, "10.231.1.100", poll)
    assert plan(inst(), health=health).poll is False


def test_no_ip_polls() -> None:
    p = plan(inst(ip=None))
    assert (p.phase, p.poll, p.probe) == ("Provisioning", True, False)
    assert "waiting for the IP address" in p.message


def test_ip_but_probes_inconclusive_is_running() -> None:
    p = plan(inst(), health=Health(healthy=None, successes=1, last_probe=NOW, message="HTTP 200"))
    assert (p.phase, p.probe, p.ip) == ("Running", True, "10.231.1.100")
    assert "1/2 successes" in p.message


def test_unhealthy_is_running() -> None:
    p = plan(inst(), health=Health(healthy=False, failures=3, last_probe=NOW, message="refused"))
    assert p.phase == "Running" and p.message == "unhealthy: refused"


def test_healthy_is_ready_and_retires_the_previous_instance() -> None:
    h = Health(healthy=True, successes=2, last_probe=NOW, message="HTTP 200")
    assert plan(inst(), health=h).delete_previous is False
    p = plan(inst(), health=h, previous=True)
    assert (p.phase, p.delete_previous) == ("Ready", True)


def test_transition_events_fire_once_per_transition() -> None:
    assert transition_events(old_phase="Ready", new_phase="Ready", message="", endpoint="e", ip="i") == []
    assert [e.reason for e in transition_events(old_phase="Running", new_phase="Ready", message="",
                                                endpoint="http://i:1", ip="i")] == ["Ready"]
    assert [e.reason for e in transition_events(old_phase="Ready", new_phase="Running", message="x",
                                                endpoint="e", ip="i")] == ["Unhealthy"]
    assert [e.type_ for e in transition_events(old_phase=None, new_phase="Failed", message="spec.x: bad",
                                               endpoint=None, ip=None)] == ["Warning"]
