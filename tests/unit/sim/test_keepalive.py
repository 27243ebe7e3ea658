"""The daemon's keepalive (testbed/sim/keepalive.py) as tables: what a timer firing at each time does."""

from __future__ import annotations

import pytest

from testbed.sim.keepalive import Keepalive, Step

W, P, X = Step.WAIT, Step.PING, Step.CLOSE

#: (interval, count, events): an event is ("start", t), ("heard", t) or ("tick", t, step), in time order.
CASES = {
    "never started: never pings": (5.0, 5, [("tick", 100.0, W)]),
    "silent client: count PINGs an interval apart, then closed an interval later": (5.0, 2, [
        ("start", 0.0), ("tick", 4.9, W), ("tick", 5.0, P), ("tick", 9.0, W), ("tick", 10.0, P),
        ("tick", 15.0, X),
    ]),
    "libvirtd's defaults: closed 30 s after the last packet read": (5.0, 5, [
        ("start", 0.0), ("tick", 5.0, P), ("tick", 10.0, P), ("tick", 15.0, P), ("tick", 20.0, P),
        ("tick", 25.0, P), ("tick", 29.9, W), ("tick", 30.0, X),
    ]),
    "a packet read starts the count over": (5.0, 2, [
        ("start", 0.0), ("tick", 5.0, P), ("tick", 10.0, P), ("heard", 12.0), ("tick", 15.0, W),
        ("tick", 17.0, P), ("tick", 22.0, P), ("tick", 27.0, X),
    ]),
    "started long after the last packet: the first PING is due at once": (5.0, 1, [
        ("heard", 0.0), ("start", 60.0), ("tick", 60.0, P), ("tick", 65.0, X),
    ]),
    "started just after a packet: the first PING an interval after that packet": (5.0, 1, [
        ("heard", 1.0), ("start", 2.0), ("tick", 5.9, W), ("tick", 6.0, P),
    ]),
    "count 0: closed after one silent interval, no PING": (5.0, 0, [
        ("start", 0.0), ("tick", 5.0, X),
    ]),
    "interval 0: the daemon never pings (libvirtd's -1)": (0.0, 5, [
        ("start", 0.0), ("tick", 1000.0, W),
    ]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_daemons_keepalive(case: str) -> None:
    interval, count, events = CASES[case]
    ka = Keepalive(interval, count, last_heard=0.0)
    for event in events:
        if event[0] == "start":
            ka.start(event[1])
        elif event[0] == "heard":
            ka.heard(event[1])
        else:
            assert (event, ka.tick(event[1])) == (event, event[2])


def test_the_next_wakeup_is_an_interval_after_the_last_ping_or_packet() -> None:
    ka = Keepalive(5.0, 5, last_heard=0.0)
    assert ka.next_wakeup() is None
    ka.start(1.0)
    assert ka.next_wakeup() == 5.0
    ka.heard(3.0)
    assert ka.next_wakeup() == 8.0
    assert ka.tick(8.0) is Step.PING
    assert ka.next_wakeup() == 13.0
