"""The bench's reading of /proc/stat: busy, idle and the hypervisor's steal, as shares of the time."""

from __future__ import annotations

import pytest

from testbed.fleet.measure import MachineCpu, machine_cpu

STAT = """cpu  4712562 2948353 633540 4681793 11721 0 75189 489055 0 0
cpu0 2356281 1474176 316770 2340896 5860 0 37594 244527 0 0
intr 1 2 3
"""


@pytest.mark.parametrize(("text", "expected"), [
    (STAT, MachineCpu(busy=4712562 + 2948353 + 633540 + 0 + 75189, idle=4681793 + 11721, steal=489055)),
    ("cpu  10 0 5 80 5\n", MachineCpu(busy=15, idle=85, steal=0)),  # an old kernel: no steal column
    ("cpu0 1 2 3 4 5 6 7 8\n", MachineCpu()),  # no aggregate line
    ("", MachineCpu()),
])
def test_the_aggregate_cpu_line_is_read(text: str, expected: MachineCpu) -> None:
    assert machine_cpu(text) == expected


@pytest.mark.parametrize(("before", "after", "shares"), [
    (MachineCpu(100, 100, 0), MachineCpu(250, 200, 50), (0.5, 50 / 300)),
    (MachineCpu(5, 5, 5), MachineCpu(5, 5, 5), (0.0, 0.0)),  # no time passed
    (MachineCpu(0, 0, 0), MachineCpu(0, 100, 0), (0.0, 0.0)),
])
def test_shares_of_the_time_that_passed(before: MachineCpu, after: MachineCpu,
                                        shares: tuple[float, float]) -> None:
    assert after.minus(before).shares() == pytest.approx(shares)
