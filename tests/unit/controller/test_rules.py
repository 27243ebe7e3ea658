"""The replacement rules, the retry schedules, the error table and status composition, as tables: pure
functions, no I/O (plan.py, outcome.py, compose.py, memory.py)."""

from __future__ import annotations

import sys
from collections import Counter
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress_kvm.controller.compose import Serving, Verdict, compose, held, providers_tag
from egress_kvm.controller.memory import Memory
from egress_kvm.controller.outcome import Fail, Retry, Trouble, outcome_for
from egress_kvm.controller.plan import (
    Retire,
    ip_wait_delay,
    plan_retire,
    quota_fallback,
    restart_announced,
    restart_delay,
)
from egress_kvm.controller.proxyspec import HealthCheck, SpecError
from egress_kvm.controller.status import Ref, get_condition
from egress_kvm.controller.verdict import Health, ProbeKey, ProbeTarget, stored_verdict
from egress_kvm.providers.base import HostUnreachable, PermanentError, QuotaError, TransientError

OLD = Ref("proxy-old", "nas1")
NEW = Ref("proxy-new", "nas1")
NEW_ELSEWHERE = Ref("proxy-new", "nas2")
MID = Ref("proxy-mid", "nas1")  # a replacement that never became Ready
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(("current", "previous", "target", "serves", "expected"), [
    # no replacement under way: a serving instance is kept until the new one is Ready
    (OLD, None, NEW, True, Retire(delete=(), previous=OLD)),
    # ...one that never served goes at once
    (OLD, None, NEW, False, Retire(delete=(OLD,), previous=None)),
    # a replacement under way is replaced again: the one in between goes, the serving one stays
    (MID, OLD, NEW, True, Retire(delete=(MID,), previous=OLD)),
    (MID, OLD, NEW, False, Retire(delete=(MID,), previous=OLD)),  # `serves` is not consulted
    # ...back to the instance that serves: nothing left to keep
    (MID, OLD, OLD, True, Retire(delete=(MID,), previous=None)),
])
def test_plan_retire(current: Ref, previous: Ref | None, target: Ref, serves: bool, expected: Retire) -> None:
    assert plan_retire(current=current, previous=previous, target=target, current_serves=serves) == expected


@pytest.mark.parametrize(("previous", "target", "delete_first"), [
    (OLD, NEW, True),  # same host: deleting it makes the room
    (OLD, NEW_ELSEWHERE, False),  # another host: deleting it frees nothing here
    (None, NEW, False),  # nothing to delete
])
def test_quota_fallback(previous: Ref | None, target: Ref, delete_first: bool) -> None:
    assert quota_fallback(previous=previous, target=target) is delete_first


@pytest.mark.parametrize(("starts", "announced"), [(0, False), (1, True), (2, True), (3, False), (4, True),
                                                   (5, False), (7, False), (8, True), (1024, True)])
def test_restart_events_are_announced_on_powers_of_two(starts: int, announced: bool) -> None:
    assert restart_announced(starts) is announced


@pytest.mark.parametrize(("starts", "delay"), [(1, 5.0), (2, 10.0), (3, 20.0), (6, 160.0), (7, 300.0),
                                               (10_000, 300.0)])
def test_restart_delay_doubles_to_its_cap(starts: int, delay: float) -> None:
    assert restart_delay(starts, poll=5.0, cap=300.0) == delay


def test_restart_delay_cap_below_poll_is_the_cap() -> None:
    assert restart_delay(3, poll=5.0, cap=2.0) == 2.0


@pytest.mark.parametrize(("looks", "delay"), [(1, 5.0), (60, 5.0), (61, 10.0), (62, 20.0), (63, 40.0),
                                              (64, 60.0), (10_000, 60.0)])
def test_ip_wait_polls_then_backs_off(looks: int, delay: float) -> None:
    assert ip_wait_delay(looks, poll=5.0, polls=60, cap=60.0) == delay


@pytest.mark.parametrize(("error", "deleting", "expected"), [
    (SpecError("spec.port: bad"), False, Fail("spec.port: bad", "InvalidSpec")),
    (PermanentError("no such image"), False, Fail("no such image", "ProviderRejected")),
    (QuotaError("no memory"), False, Trouble("QuotaExceeded", "out of capacity: no memory", Retry.QUOTA)),
    (QuotaError("no memory"), True, Trouble("QuotaExceeded", "out of capacity: no memory", Retry.QUOTA)),
    (HostUnreachable("h down"), False, Trouble("HostUnreachable", "retrying: h down", Retry.TRANSIENT,
                                               unreachable=True)),
    (TransientError("libvirt busy"), True, Trouble("TransientError", "retrying: libvirt busy",
                                                   Retry.TRANSIENT)),
    (KeyError("status"), False, None),  # a bug is not the provider's: re-raised, retried as an error
])
def test_outcome_table(error: Exception, deleting: bool, expected: Fail | Trouble | None) -> None:
    got = outcome_for(error, deleting=deleting)
    if isinstance(expected, Trouble):
        assert isinstance(got, Trouble)
        assert (got.reason, got.message, got.retry, got.unreachable) == \
            (expected.reason, expected.message, expected.retry, expected.unreachable)
        assert (got.event is not None) is (expected.retry is Retry.QUOTA)  # Warnings for quota only
    else:
        assert got == expected


def test_a_permanent_error_while_deleting_blocks_slowly_and_says_how_to_unblock() -> None:
    got = outcome_for(PermanentError("host gone"), deleting=True)
    assert isinstance(got, Trouble) and got.retry is Retry.QUOTA and got.reason == "DeleteBlocked"
    assert "remove the finalizer" in got.message and got.event is not None and got.event.type_ == "Warning"


CHECK = HealthCheck(success_threshold=2)
SERVING = ProbeTarget("10.0.0.1", 3128, CHECK)
HEALTHY = Health(healthy=True, message="GET ok", last_probe=NOW, successes=2)


@pytest.mark.parametrize(("phase", "serving_health", "shown_phase", "shown_ip"), [
    ("Provisioning", HEALTHY, "Ready", "10.0.0.1"),  # the old instance serves, healthy: stays Ready
    ("Running", Health(healthy=False, message="refused"), "Running", "10.0.0.1"),
    ("Ready", None, "Running", "10.0.0.1"),  # no verdict on the serving one yet
    ("Pending", HEALTHY, "Pending", None),  # not about the instance in progress: said as it is
])
def test_compose_shows_the_serving_instance_while_replacing(phase: str, serving_health: Health | None,
                                                            shown_phase: str, shown_ip: str | None) -> None:
    v = Verdict(phase, "creating instance proxy-new", "Provisioning", instance=NEW, previous=OLD)
    status = compose({}, v, generation=3, serving=Serving(SERVING, serving_health))
    assert (status["phase"], status.get("ip")) == (shown_phase, shown_ip)
    assert status["observedGeneration"] == 3
    assert status["instance"] == {"name": "proxy-new", "zone": "nas1"}
    assert status["previousInstance"] == {"name": "proxy-old", "zone": "nas1"}
    if shown_ip:
        assert status["message"].startswith("serving from proxy-old")


def test_compose_without_a_previous_instance_ignores_serving() -> None:
    v = Verdict("Provisioning", "creating", "Provisioning", instance=NEW)
    status = compose({}, v, generation=1, serving=Serving(SERVING, HEALTHY))
    assert status["phase"] == "Provisioning" and "ip" not in status


@pytest.mark.parametrize(("old_phase", "health", "phase"), [
    ("Ready", HEALTHY, "Ready"),
    ("Ready", Health(healthy=False, message="refused"), "Running"),  # Ready stays == Healthy
    ("Provisioning", HEALTHY, "Provisioning"),  # nothing observed: the phase stays
    ("Running", None, "Running"),
])
def test_held_keeps_the_phase_but_follows_the_probes(old_phase: str, health: Health | None,
                                                     phase: str) -> None:
    status = held({"phase": old_phase, "message": "old"}, message="retrying: x", reason="TransientError",
                  generation=2, health=health, unreachable=None)
    assert (status["phase"], status["message"]) == (phase, "retrying: x")
    assert get_condition(status, "HostReachable") is None


def test_held_unreachable_sets_the_host_condition() -> None:
    status = held({"phase": "Ready"}, message="m", reason="HostUnreachable", generation=2, health=None,
                  unreachable="no route")
    cond = get_condition(status, "HostReachable")
    assert cond is not None and (cond["status"], cond["message"]) == ("False", "no route")


def test_stored_verdict_seeds_only_a_ready_healthy_status_of_the_same_endpoint() -> None:
    ready = {"phase": "Ready", "healthy": True, "endpoint": SERVING.endpoint,
             "lastProbeTime": "2026-01-02T03:04:05Z"}
    seed = stored_verdict(ready, SERVING)
    assert seed is not None and seed.healthy and seed.last_probe == NOW and seed.successes == 2
    assert stored_verdict({**ready, "endpoint": "http://10.0.0.2:3128"}, SERVING) is None
    assert stored_verdict({**ready, "phase": "Running"}, SERVING) is None


def test_providers_tag_is_short_and_not_the_digest() -> None:
    assert len(providers_tag("abc")) == 16 and providers_tag("abc") != providers_tag("abd")
    assert "abc" not in providers_tag("abc")


def test_memory_forgets_a_key_whole() -> None:
    m = Memory()
    m[("ns", "a")].restarts = 3
    m.set_phase(("ns", "a"), "Ready")
    m.set_phase(("ns", "b"), "Failed")
    m[("ns", "b")].failed = (1, "h")
    assert m.phase_counts() == {"Ready": 1, "Failed": 1}
    m.forget(("ns", "a"))
    assert ("ns", "a") not in m and m.peek(("ns", "a")).restarts == 0 and ("ns", "a") not in m
    assert m.phase(("ns", "a")) is None and m.phase_counts() == {"Failed": 1}
    m.forget_failed()
    assert m.peek(("ns", "b")).failed is None
    assert m.phase(("ns", "b")) == "Failed" and m.phase_counts() == {"Failed": 1}  # still Failed in status
    with pytest.raises(AttributeError):
        m[("ns", "b")].phase = "Ready"  # type: ignore[attr-defined]  # only set_phase moves the counts


PHASE_OPS = st.lists(st.tuples(st.sampled_from(["set", "forget", "forget_failed", "touch", "fail"]),
                               st.sampled_from([("ns", str(i)) for i in range(4)]),
                               st.sampled_from(["Pending", "Provisioning", "Running", "Ready", "Failed"])),
                     max_size=40)


@settings(max_examples=200, deadline=None)
@given(PHASE_OPS)
def test_phase_counts_are_the_recount_after_every_change(ops: list[tuple[str, tuple[str, str], str]]) -> None:
    """Kept as phases change (memory.py), the counts equal a recount over the keys after each step: a
    phase moving, written twice, a key forgotten (deleted, ProxyGone) or forgotten twice, a Failed
    verdict remembered and forgotten (a providers change), a state made without a phase."""
    m = Memory()
    phases: dict[tuple[str, str], str] = {}
    for op, key, phase in ops:
        if op == "set":
            m.set_phase(key, phase)
            phases[key] = phase
        elif op == "forget":
            m.forget(key)
            phases.pop(key, None)
        elif op == "forget_failed":
            m.forget_failed()
        elif op == "touch":
            m[key].restarts += 1
        else:
            m[key].failed = (1, "h")
        assert m.phase_counts() == Counter(phases.values())
        assert all(m.phase(k) == phases.get(k) for k in {k for _, k, _ in ops})


def test_probe_keys_of_a_proxy_and_its_replacement_differ() -> None:
    assert ProbeKey(("ns", "a")) != ProbeKey(("ns", "a"), replacement=True)
    assert str(ProbeKey(("ns", "a"), replacement=True)) == "ns/a (replacement)"


def test_the_pure_modules_import_no_io() -> None:
    """planner, plan, compose, outcome, verdict, memory decide; they must not pull in an HTTP client."""
    import subprocess
    code = ("import sys; import egress_kvm.controller.planner, egress_kvm.controller.plan, "
            "egress_kvm.controller.compose, "
            "egress_kvm.controller.outcome, egress_kvm.controller.verdict, egress_kvm.controller.memory; "
            "bad = [m for m in ('aiohttp', 'asyncssh', 'kubernetes_asyncio') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
