"""libvirtd's per-connection request limit (testbed/sim/slots.py) as tables: packets arrive and calls are
answered; each step says which packets are read then, and whether the daemon still reads the socket."""

from __future__ import annotations

import pytest

from testbed.sim.slots import Hold, Slots

C, K = Hold.UNTIL_ANSWERED, Hold.NONE  # a call; a keepalive or stream packet

#: (limit, steps): a step is ("arrive", name, hold), ("answer",) or ("limit", n), with the packets read
#: by it and whether reading goes on after it.
CASES = {
    "calls under the limit are read at once": (3, [
        (("arrive", "c1", C), ["c1"], True),
        (("arrive", "c2", C), ["c2"], True),
        (("arrive", "c3", C), ["c3"], False),
    ]),
    "a call past the limit waits until one is answered": (2, [
        (("arrive", "c1", C), ["c1"], True),
        (("arrive", "c2", C), ["c2"], False),
        (("arrive", "c3", C), [], False),
        (("answer",), ["c3"], False),
        (("answer",), [], True),
    ]),
    "what waits is read in arrival order, calls and PINGs alike": (1, [
        (("arrive", "c1", C), ["c1"], False),
        (("arrive", "ping", K), [], False),
        (("arrive", "c2", C), [], False),
        (("arrive", "ping2", K), [], False),
        (("answer",), ["ping", "c2"], False),
        (("answer",), ["ping2"], True),
    ]),
    "a PING or stream packet read takes no slot": (2, [
        (("arrive", "c1", C), ["c1"], True),
        (("arrive", "ping", K), ["ping"], True),
        (("arrive", "data", K), ["data"], True),
        (("arrive", "c2", C), ["c2"], False),
    ]),
    "one answer reads calls up to the limit again, not past it": (2, [
        (("arrive", "c1", C), ["c1"], True),
        (("arrive", "c2", C), ["c2"], False),
        (("arrive", "c3", C), [], False),
        (("arrive", "c4", C), [], False),
        (("answer",), ["c3"], False),
        (("answer",), ["c4"], False),
    ]),
    "a higher limit set at run time reads what waited": (1, [
        (("arrive", "c1", C), ["c1"], False),
        (("arrive", "c2", C), [], False),
        (("arrive", "c3", C), [], False),
        (("limit", 3), ["c2", "c3"], False),
    ]),
    "a lower limit keeps the calls in service and reads nothing more until under it": (3, [
        (("arrive", "c1", C), ["c1"], True),
        (("arrive", "c2", C), ["c2"], True),
        (("limit", 1), [], False),
        (("arrive", "c3", C), [], False),
        (("answer",), [], False),
        (("answer",), ["c3"], False),
    ]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_request_limit(case: str) -> None:
    limit, steps = CASES[case]
    slots: Slots[str] = Slots(limit)
    for step, read, reading in steps:
        if step[0] == "arrive":
            got = slots.arrive(step[1], step[2])
        elif step[0] == "answer":
            got = slots.answered()
        else:
            got = slots.set_limit(step[1])
        assert (step, got, slots.reading) == (step, read, reading)


@pytest.mark.parametrize("limit", [0, -1])
def test_a_limit_below_one_is_refused(limit: int) -> None:
    with pytest.raises(ValueError, match="must be at least 1"):
        Slots(limit)
    with pytest.raises(ValueError, match="must be at least 1"):
        Slots(1).set_limit(limit)


def test_an_answer_with_no_call_in_service_is_a_bug() -> None:
    slots: Slots[str] = Slots(2)
    slots.arrive("ping", K)
    with pytest.raises(RuntimeError):
        slots.answered()
