"""planner.vouched as a table: when a routine pass (a resync, a probe refresh, its probes turning healthy)
may trust a Ready or Running Proxy's healthy probes instead of reading its VM, and every case that must
still look."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from egress_kvm.controller.planner import Look, Observed, Probe, Probes, WriteStatus, plan_managed, vouched
from egress_kvm.controller.status import Ref
from egress_kvm.controller.verdict import Health, ProbeTarget
from egress_kvm.providers.base import PowerState

from .test_planner import HEALTHY, KEY, NEW, OLD, OWN, SPEC, T

IP = "10.0.0.1"


def settled(**status: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"phase": "Ready", "observedGeneration": 2, "ip": IP, "instance": NEW.to_dict()}
    return {k: v for k, v in {**base, **status}.items() if v is not None}


def obs(status: dict[str, Any], *, probe: Probe | None = None, routine: bool = True, **kw: Any) -> Observed:
    probes = {OWN: probe or Probe(ProbeTarget(IP, 3128, SPEC.health, "ns"), HEALTHY)}
    return Observed(key=KEY, spec=SPEC, status=status, generation=2, desired=NEW, namespace="ns",
                    probes=Probes(probes), routine=routine, **kw)


OWN_TARGET = ProbeTarget(IP, 3128, SPEC.health, "ns")
UNHEALTHY = Health(healthy=False, message="refused", failures=3)
UNKNOWN = Health()
OTHER_IP = Probe(ProbeTarget("10.0.0.9", 3128, SPEC.health, "ns"), HEALTHY)
OTHER_PORT = Probe(ProbeTarget(IP, 8080, SPEC.health, "ns"), HEALTHY)
UNREACHABLE = [{"type": "HostReachable", "status": "False", "reason": "HostUnreachable", "message": "x"}]
REACHABLE = [{"type": "HostReachable", "status": "True", "reason": "Reachable", "message": ""}]

CASES = [
    ("settled, routine, healthy probe of its endpoint", obs(settled()), True),
    ("not routine (an event, a requeue, an enqueue)", obs(settled(), routine=False), False),
    ("Running (its probes just turned healthy)", obs(settled(phase="Running")), True),
    ("Provisioning", obs(settled(phase="Provisioning")), False),
    ("Pending", obs(settled(phase="Pending")), False),
    ("status of an older generation", obs(settled(observedGeneration=1)), False),
    ("no ip in status", obs(settled(ip=None)), False),
    ("a replacement in flight", obs(settled(previousInstance=OLD.to_dict())), False),
    ("status names another instance", obs(settled(instance=OLD.to_dict())), False),
    ("this pass created it", obs(settled(), created=True), False),
    ("host last seen unreachable", obs(settled(conditions=UNREACHABLE)), False),
    ("host reachable condition", obs(settled(conditions=REACHABLE)), True),
    ("verdict unhealthy", obs(settled(), probe=Probe(OWN_TARGET, UNHEALTHY)), False),
    ("verdict not reached yet", obs(settled(), probe=Probe(OWN_TARGET, UNKNOWN)), False),
    ("probing another address", obs(settled(), probe=OTHER_IP), False),
    ("probing another port", obs(settled(), probe=OTHER_PORT), False),
]


@pytest.mark.parametrize(("case", "o", "trusted"), CASES, ids=[c[0] for c in CASES])
def test_vouched(case: str, o: Observed, trusted: bool) -> None:
    got = vouched(o, NEW)
    if trusted:
        assert got is not None and got.power_state is PowerState.RUNNING and got.ip == IP
        assert (got.name, got.zone) == (NEW.name, NEW.zone)
    else:
        assert got is None


def test_no_probe_at_all_looks() -> None:
    o = replace(obs(settled()), probes=Probes({}))
    assert vouched(o, NEW) is None


def test_a_vouched_pass_plans_no_look_and_the_same_pass_not_routine_looks() -> None:
    o = obs(settled(healthy=True, endpoint=f"http://{IP}:3128"))
    step = plan_managed(o, T)
    assert not any(isinstance(a, Look) for a in step.actions)
    looked = plan_managed(replace(o, routine=False), T)
    assert [a for a in looked.actions if isinstance(a, Look)] == [Look(NEW, spec_provider=True)]


def test_a_desired_instance_that_differs_is_never_vouched_for() -> None:
    o = replace(obs(settled()), desired=Ref("proxy-other", "nas1"))
    assert any(isinstance(a, Look) for a in plan_managed(o, T).actions)


def test_the_pass_after_its_probes_turn_healthy_says_ready_without_a_look() -> None:
    o = obs(settled(phase="Running", message="waiting for health probes"))
    step = plan_managed(o, T)
    assert not any(isinstance(a, Look) for a in step.actions)
    written = [a.status for a in step.actions if isinstance(a, WriteStatus)]
    assert [s["phase"] for s in written] == ["Ready"] and written[0]["ip"] == IP
