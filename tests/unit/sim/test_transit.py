"""The network's latency (testbed/sim/transit.py) as a table: packets sent at a time with a latency, and
which of them have arrived when."""

from __future__ import annotations

import pytest

from testbed.sim.transit import Transit

#: steps: ("send", packet, now, latency) or ("arrived", now), each with the packets it gives out.
CASES = {
    "no latency: a packet arrives as it is sent": [
        (("send", "a", 0.0, 0.0), ["a"]),
        (("send", "b", 0.1, 0.0), ["b"]),
    ],
    "latency: a packet arrives that much later, not before": [
        (("send", "a", 0.0, 0.5), []),
        (("arrived", 0.4), []),
        (("arrived", 0.5), ["a"]),
        (("arrived", 9.0), []),
    ],
    "the latency lowered: later packets wait behind the one on the way, in the order sent": [
        (("send", "a", 0.0, 0.5), []),
        (("send", "b", 0.1, 0.0), []),
        (("send", "c", 0.1, 0.1), []),
        (("send", "d", 0.2, 0.0), []),
        (("arrived", 0.5), ["a", "b", "c", "d"]),
        (("send", "e", 0.6, 0.0), ["e"]),  # nothing on the way any more: at once
    ],
    "the latency raised: a later packet arrives later": [
        (("send", "a", 0.0, 0.1), []),
        (("send", "b", 0.0, 0.5), []),
        (("arrived", 0.2), ["a"]),
        (("arrived", 0.5), ["b"]),
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_packets_arrive_late_and_in_the_order_sent(case: str) -> None:
    transit: Transit[str] = Transit()
    for step, out in CASES[case]:
        if step[0] == "send":
            got = transit.send(step[1], now=step[2], latency=step[3])
        else:
            got = transit.arrived(step[1])
        assert (step, got) == (step, out)


def test_the_next_arrival_is_the_first_packet_on_the_way() -> None:
    transit: Transit[str] = Transit()
    assert transit.next_arrival() is None
    transit.send("a", now=1.0, latency=0.5)
    transit.send("b", now=1.2, latency=0.5)
    assert transit.next_arrival() == 1.5
    transit.arrived(1.5)
    assert transit.next_arrival() == 1.7
