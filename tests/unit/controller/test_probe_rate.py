"""The global probe rate limit (issue 13 item 6): slots 1/rate apart, in call order, whatever the number
of Proxies asking (a table over a fake clock: no timing in the assertion)."""

from __future__ import annotations

import asyncio

import pytest

from egress_kvm.controller.probe_rate import ProbeRate


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, d: float) -> None:
        self.slept.append(round(d, 6))


async def test_a_burst_of_probes_is_spaced_at_the_rate() -> None:
    t = FakeTime()
    rate = ProbeRate(10.0, clock=t.clock, sleep=t.sleep)
    await asyncio.gather(*(rate.acquire() for _ in range(5)))
    assert t.slept == [0.1, 0.2, 0.3, 0.4]  # the first goes at once, each next one 1/10 s later


async def test_idle_time_is_not_saved_up_as_a_burst() -> None:
    t = FakeTime()
    rate = ProbeRate(2.0, clock=t.clock, sleep=t.sleep)
    await rate.acquire()
    t.now += 60.0  # a minute without probes
    await rate.acquire()
    await rate.acquire()
    assert t.slept == [0.5]


def test_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        ProbeRate(0)
