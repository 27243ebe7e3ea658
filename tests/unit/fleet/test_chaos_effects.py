"""`chaos.missing` as a table: a chaos run fails when a fault it planned shows no effect (a host kill that
stopped no guest, an operator that was not SIGKILLed, injected failures never answered, ...)."""

from __future__ import annotations

import pytest

from testbed.fleet.chaos import ChaosPlan, Effects, missing

HOSTS = ["h0", "h1", "h2"]
PLAN = ChaosPlan(kill_hosts=1, operator_kills=(15.0,), fill_pool_at=3.0)


def took_effect(**changes: object) -> Effects:
    e = Effects(guests_stopped={"h2": 3}, seen_dead=["h2"], seen_revived=["h2"], operator_exits=[-9],
                pool_available_after_fill=0, injected_failures=12, deleted=10)
    for k, v in changes.items():
        setattr(e, k, v)
    return e


CASES = [
    ("every fault took effect", took_effect(), []),
    ("the kill stopped no guest", took_effect(guests_stopped={"h2": 0}), ["kill h2: stopped no guest"]),
    ("the killed host never said it was dead", took_effect(seen_dead=[]), ["kill h2: not seen dead"]),
    ("the host was not revived", took_effect(seen_revived=[]), ["revive h2: not seen alive"]),
    ("the operator had already exited (not our SIGKILL)", took_effect(operator_exits=[1]),
     ["operator SIGKILLs: 1 planned, exits seen [1]"]),
    ("no operator kill happened", took_effect(operator_exits=[]),
     ["operator SIGKILLs: 1 planned, exits seen []"]),
    ("the pool was not filled", took_effect(pool_available_after_fill=4096),
     ["fill h1: 4096 bytes still available"]),
    ("no transient failure answered", took_effect(injected_failures=0),
     ["transient failures: none answered"]),
    ("no delete mid-flight", took_effect(deleted=0), ["mid-flight deletes: none"]),
    ("nothing happened at all", Effects(), ["kill h2: stopped no guest", "kill h2: not seen dead",
                                            "revive h2: not seen alive",
                                            "operator SIGKILLs: 1 planned, exits seen []",
                                            "fill h1: None bytes still available",
                                            "transient failures: none answered", "mid-flight deletes: none"]),
]


@pytest.mark.parametrize(("case", "effects", "want"), CASES, ids=[c[0] for c in CASES])
def test_missing(case: str, effects: Effects, want: list[str]) -> None:
    assert missing(PLAN, HOSTS, effects) == want


def test_a_plan_without_faults_misses_nothing() -> None:
    calm = ChaosPlan(fail_rate=0.0, kill_hosts=0, operator_kills=(), fill_pool_at=None, delete_share=0.0)
    assert missing(calm, HOSTS, Effects()) == []
