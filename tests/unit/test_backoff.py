"""Backoff: grows exponentially to a cap, keeps a floor under jitter, and resets on success."""

from __future__ import annotations

import random

import pytest

from egress_kvm.backoff import Backoff


def test_without_jitter_doubles_to_the_cap_and_resets() -> None:
    b = Backoff(base=0.5, cap=4, jitter=0)
    assert [b.next() for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]
    b.reset()
    assert b.next() == 0.5


def test_jitter_stays_between_the_floor_and_the_raw_delay() -> None:
    b = Backoff(base=1, cap=8, jitter=0.5, rng=random.Random(7))
    for raw in (1, 2, 4, 8, 8, 8):
        d = b.next()
        assert raw * 0.5 <= d <= raw


def test_many_failures_do_not_overflow() -> None:
    b = Backoff(base=1, cap=30, jitter=0)
    for _ in range(5000):
        d = b.next()
    assert d == 30


def test_delay_is_pure_and_zero_without_failures() -> None:
    b = Backoff(1.0, 300.0)
    assert [b.delay(n) for n in (0, 1, 2, 3, 10_000)] == [0.0, 1.0, 2.0, 4.0, 300.0]
    assert b.failures == 0


@pytest.mark.parametrize("kw", [dict(base=0, cap=1), dict(base=2, cap=1), dict(base=1, cap=2, factor=0.5),
                                dict(base=1, cap=2, jitter=2)])
def test_bad_parameters_are_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        Backoff(**kw)
