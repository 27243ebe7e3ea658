"""The reconcile queue's guarantees: dedupe, one worker per key, dirty re-run, per-key backoff, the two lanes
(which one a delayed add comes due in), shutdown."""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress_kvm.controller.queue import (
    DUE_LANE,
    URGENT_BURST,
    Backoff,
    Due,
    Lane,
    QueueShutDown,
    WorkQueue,
    lane_after,
)

from .conftest import eventually


async def test_adds_of_a_queued_key_are_deduplicated() -> None:
    q = WorkQueue()
    for _ in range(5):
        q.add(("ns", "a"))
    q.add(("ns", "b"))
    assert len(q) == 2
    assert await q.get() == ("ns", "a")
    assert await q.get() == ("ns", "b")
    assert len(q) == 0


async def test_a_key_being_processed_is_not_handed_out_again_but_rerun_after_done() -> None:
    q = WorkQueue()
    q.add("k")
    key = await q.get()
    q.add("k")  # changed while being processed
    q.add("k")
    assert len(q) == 0  # not available to a second worker
    second = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    assert not second.done()
    q.done(key)
    assert await asyncio.wait_for(second, 1) == "k"  # re-run once, after
    q.done("k")
    assert len(q) == 0


async def test_never_two_workers_on_one_key_under_load() -> None:
    q = WorkQueue()
    active: set[str] = set()
    overlaps = 0
    runs: dict[str, int] = {}

    async def worker() -> None:
        nonlocal overlaps
        while True:
            try:
                key = await q.get()
            except QueueShutDown:
                return
            if key in active:
                overlaps += 1
            active.add(key)
            runs[key] = runs.get(key, 0) + 1
            await asyncio.sleep(0.001)
            active.discard(key)
            q.done(key)

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    for i in range(300):
        q.add(f"k{i % 5}")
        if i % 7 == 0:
            await asyncio.sleep(0)
    await eventually(lambda: len(q) == 0 and not q.processing())
    q.shutdown()
    await asyncio.gather(*workers)
    assert overlaps == 0
    assert set(runs) == {f"k{i}" for i in range(5)}
    assert sum(runs.values()) < 300  # deduplicated


async def test_transient_backoff_grows_per_key_and_forget_resets() -> None:
    q = WorkQueue(transient=Backoff(base=1.0, cap=8.0), quota=Backoff(base=30.0, cap=600.0))
    delays = [q.add_rate_limited("a") for _ in range(6)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert q.add_rate_limited("b") == 1.0  # per key
    q.forget("a")
    assert q.add_rate_limited("a") == 1.0
    q.shutdown()


async def test_quota_backoff_is_slower_and_separate() -> None:
    q = WorkQueue(transient=Backoff(base=1.0, cap=300.0), quota=Backoff(base=30.0, cap=600.0))
    assert q.add_rate_limited("a", quota=True) == 30.0
    assert q.add_rate_limited("a", quota=True) == 60.0
    assert q.add_rate_limited("a") == 1.0
    assert q.failures("a") == 3
    q.shutdown()


async def test_rate_limited_key_comes_back_after_its_delay() -> None:
    q = WorkQueue(transient=Backoff(base=0.02, cap=1.0))
    q.add_rate_limited("a")
    assert len(q) == 0
    assert await asyncio.wait_for(q.get(), 2) == "a"


async def test_add_after_keeps_the_earliest_schedule() -> None:
    q = WorkQueue()
    q.add_after("a", 30.0)
    q.add_after("a", 0.02)  # moved earlier
    q.add_after("a", 60.0)  # cannot postpone it
    assert await asyncio.wait_for(q.get(), 2) == "a"
    q.done("a")
    assert "a" not in q.pending_delayed()


async def test_drop_cancels_a_delayed_add() -> None:
    q = WorkQueue()
    q.add_after("a", 0.02)
    q.drop("a")
    await asyncio.sleep(0.05)
    assert len(q) == 0


async def test_advance_adds_now_in_the_urgent_lane_and_cancels_the_delayed_add() -> None:
    q = WorkQueue()
    q.add("plain")
    q.add_after("a", 3600.0)
    q.advance("a")
    assert "a" not in q.pending_delayed()
    assert await q.get() == "a"  # urgent: before the plain key queued first
    q.done("a")
    q.advance("b")  # nothing pending: just added
    assert await q.get() == "b"


async def test_shutdown_wakes_waiting_workers_and_refuses_new_keys() -> None:
    q = WorkQueue()
    waiting = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    q.add_after("later", 0.01)
    q.shutdown()
    for t in waiting:
        with pytest.raises(QueueShutDown):
            await asyncio.wait_for(t, 1)
    q.add("x")
    assert len(q) == 0
    with pytest.raises(QueueShutDown):
        await q.get()


async def test_a_cancelled_getter_passes_its_wakeup_on() -> None:
    q = WorkQueue()
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.add("k")  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    assert await asyncio.wait_for(second, 1) == "k"


def test_backoff_never_overflows() -> None:
    assert Backoff(base=1.0, cap=300.0).delay(10_000) == 300.0
    assert Backoff(base=1.0, cap=300.0).delay(0) == 0.0


async def test_urgent_adds_are_served_before_plain_ones_and_promote_a_waiting_key() -> None:
    q = WorkQueue()
    for k in ("new1", "new2", "new3"):
        q.add(k)
    q.add("followup", urgent=True)
    q.add("new2", urgent=True)  # already waiting in the plain lane: moved up, not queued twice
    q.add("new2")  # a plain add does not demote it
    assert len(q) == 4
    assert [await q.get() for _ in range(4)] == ["followup", "new2", "new1", "new3"]


async def test_an_urgent_add_during_processing_requeues_the_key_urgently() -> None:
    q = WorkQueue()
    q.add("k")
    key = await q.get()
    q.add("plain")
    q.add("k", urgent=True)  # its verdict changed mid-reconcile
    q.done(key)
    assert [await q.get(), await q.get()] == ["k", "plain"]


async def test_a_delayed_add_comes_due_ahead_of_the_backlog() -> None:
    """A Proxy's boot follow-up (add_after) must not wait behind 1,000 creates applied at once."""
    q = WorkQueue()
    q.add_after("booted", 0.01)
    for i in range(1000):
        q.add(f"create-{i}")
    await asyncio.sleep(0.05)
    assert await q.get() == "booted"
    assert await q.get() == "create-0"


async def test_a_steady_stream_of_urgent_keys_cannot_starve_the_plain_lane() -> None:
    """Urgent work that never runs out (1,000 Proxies' boot polls, flapping verdicts) must still let plain
    work through (a new Proxy, a delete, a spec edit): at most URGENT_BURST urgent keys in a row while a
    plain one waits."""
    q: WorkQueue[str] = WorkQueue()
    q.add("delete-me")
    served = []
    for i in range(3 * (URGENT_BURST + 1)):
        q.add(f"poll-{i}", urgent=True)  # a new urgent key comes in before every hand-out
        key = await q.get()
        served.append(key)
        q.done(key)
        if key == "delete-me":
            break
    assert served[-1] == "delete-me", served
    assert len(served) == URGENT_BURST + 1, served


async def test_the_burst_counts_only_while_plain_work_waits() -> None:
    """Urgent keys served with the plain lane empty do not use up the burst: a plain key added later still
    waits behind up to URGENT_BURST urgent ones, not fewer (the latency benefit stays whole)."""
    q: WorkQueue[str] = WorkQueue()
    for i in range(2 * URGENT_BURST):
        q.add(f"u{i}", urgent=True)
    for _ in range(URGENT_BURST):
        q.done(await q.get())
    q.add("plain")
    got = [await q.get() for _ in range(URGENT_BURST + 1)]
    assert got == [f"u{i}" for i in range(URGENT_BURST, 2 * URGENT_BURST)] + ["plain"]


# --- which lane a delayed add comes due in ------------------------------------------------------------------

@pytest.mark.parametrize(("due", "lane"), [
    (Due.FOLLOW_UP, Lane.URGENT),  # a boot poll, a wait for a Secret or an import: work in flight
    (Due.RETRY, Lane.PLAIN),  # a failed reconcile again: first-come with new work, not ahead of it
])
def test_the_lane_a_delayed_add_comes_due_in(due: Due, lane: Lane) -> None:
    assert DUE_LANE[due] is lane


@pytest.mark.parametrize(("current", "added", "lane"), [
    (None, Lane.PLAIN, Lane.PLAIN),
    (None, Lane.URGENT, Lane.URGENT),
    (Lane.PLAIN, Lane.PLAIN, Lane.PLAIN),
    (Lane.PLAIN, Lane.URGENT, Lane.URGENT),  # promoted
    (Lane.URGENT, Lane.PLAIN, Lane.URGENT),  # never demoted (a retry coming due for a changed verdict)
    (Lane.URGENT, Lane.URGENT, Lane.URGENT),
])
def test_a_wanted_key_is_only_ever_promoted(current: Lane | None, added: Lane, lane: Lane) -> None:
    assert lane_after(current, added) is lane


class Op(enum.Enum):
    """One step of a lane scenario, as the controller calls the queue."""

    ADD = "add"  # a watch event, a resync
    URGENT = "urgent"  # a changed verdict, a finished import
    RETRY = "retry"  # a reconcile failed: add_rate_limited (due in 0.01 s)
    QUOTA_RETRY = "quota retry"  # no capacity: add_rate_limited(quota=True), due in a minute
    FOLLOW = "follow"  # a reconcile waits for progress: add_after 0.01 s
    FOLLOW_LATER = "follow later"  # add_after an hour
    ADVANCE = "advance"  # an event said what the key waited for happened
    FORGET = "forget"  # a reconcile succeeded
    TAKE = "take"  # a worker gets the key (it must be next) and keeps it processing
    DONE = "done"
    DUE = "due"  # let the 0.01 s timers fire


LANE_SCENARIOS = [
    # (what it shows, steps, the hand-out order of what is left queued)
    ("a retry comes due behind plain work queued before it",
     [(Op.ADD, "new"), (Op.RETRY, "k"), (Op.DUE, "")], ["new", "k"]),
    ("a dead host's retries take no urgent hand-outs from a new Proxy",
     [(Op.ADD, "new"), *[(Op.RETRY, f"dead{i}") for i in range(URGENT_BURST + 1)], (Op.DUE, "")],
     ["new", *[f"dead{i}" for i in range(URGENT_BURST + 1)]]),
    ("a follow-up comes due ahead of plain work",
     [(Op.ADD, "new"), (Op.FOLLOW, "k"), (Op.DUE, "")], ["k", "new"]),
    ("a retry coming due leaves a key an event made urgent urgent",
     [(Op.ADD, "new"), (Op.URGENT, "k"), (Op.RETRY, "k"), (Op.DUE, "")], ["k", "new"]),
    ("an event promotes a key its retry queued",
     [(Op.ADD, "new"), (Op.RETRY, "k"), (Op.DUE, ""), (Op.URGENT, "k")], ["k", "new"]),
    ("a failure's retry replaces a pending follow-up",
     [(Op.ADD, "new"), (Op.FOLLOW_LATER, "k"), (Op.RETRY, "k"), (Op.DUE, "")], ["new", "k"]),
    ("a success's follow-up takes over a retry due earlier",
     [(Op.ADD, "new"), (Op.RETRY, "k"), (Op.FOLLOW_LATER, "k"), (Op.DUE, "")], ["k", "new"]),
    ("a success's follow-up due before a pending retry replaces it: one add, urgent, no retry left",
     [(Op.ADD, "new"), (Op.QUOTA_RETRY, "k"), (Op.FOLLOW, "k"), (Op.DUE, "")], ["k", "new"]),
    ("advance over a pending retry is urgent and cancels it",
     [(Op.ADD, "new"), (Op.RETRY, "k"), (Op.ADVANCE, "k"), (Op.DUE, "")], ["k", "new"]),
    ("a retry due while the key is processing re-queues it plain",
     [(Op.ADD, "k"), (Op.TAKE, "k"), (Op.ADD, "new"), (Op.RETRY, "k"), (Op.DUE, ""), (Op.DONE, "k")],
     ["new", "k"]),
    ("... and urgent if an event came meanwhile",
     [(Op.ADD, "k"), (Op.TAKE, "k"), (Op.ADD, "new"), (Op.RETRY, "k"), (Op.DUE, ""), (Op.URGENT, "k"),
      (Op.DONE, "k")], ["k", "new"]),
    ("a follow-up due while the key is processing re-queues it urgent",
     [(Op.ADD, "k"), (Op.TAKE, "k"), (Op.ADD, "new"), (Op.FOLLOW, "k"), (Op.DUE, ""), (Op.DONE, "k")],
     ["k", "new"]),
    ("a success's forget leaves a retry already scheduled plain",
     [(Op.RETRY, "k"), (Op.FORGET, "k"), (Op.ADD, "new"), (Op.DUE, "")], ["new", "k"]),
]


@pytest.mark.parametrize(("steps", "order"), [pytest.param(steps, order, id=what)
                                               for what, steps, order in LANE_SCENARIOS])
async def test_a_delayed_add_comes_due_in_the_lane_of_what_it_stands_for(
        steps: list[tuple[Op, str]], order: list[str]) -> None:
    """A follow-up of work in flight is urgent, a retry after a failure is plain (DUE_LANE), and a retry
    never demotes a key a real event made urgent."""
    q: WorkQueue[str] = WorkQueue(transient=Backoff(base=0.01, cap=0.01))
    for op, key in steps:
        if op is Op.ADD:
            q.add(key)
        elif op is Op.URGENT:
            q.add(key, urgent=True)
        elif op is Op.RETRY:
            q.add_rate_limited(key)
        elif op is Op.QUOTA_RETRY:
            q.add_rate_limited(key, quota=True)
        elif op is Op.FOLLOW:
            q.add_after(key, 0.01)
        elif op is Op.FOLLOW_LATER:
            q.add_after(key, 3600.0)
        elif op is Op.ADVANCE:
            q.advance(key)
        elif op is Op.FORGET:
            q.forget(key)
        elif op is Op.TAKE:
            assert await q.get() == key
        elif op is Op.DONE:
            q.done(key)
        else:
            await asyncio.sleep(0.05)  # the loop runs the 0.01 s timers, scheduled earlier, first
    served = []
    while len(q):
        key = await q.get()
        served.append(key)
        q.done(key)
    assert served == order
    assert not q.pending_delayed()  # every delayed add came due once (or was cancelled): nothing more
    q.shutdown()


async def test_shutdown_cancels_retries_and_follow_ups_alike() -> None:
    q: WorkQueue[str] = WorkQueue(transient=Backoff(base=0.01, cap=0.01))
    q.add_rate_limited("retry")
    q.add_after("follow", 0.01)
    q.shutdown()
    assert not q.pending_delayed()
    await asyncio.sleep(0.05)
    assert len(q) == 0
    with pytest.raises(QueueShutDown):
        await q.get()


# --- the order, against a model of the lanes --------------------------------------------------------------

class LaneModel:
    """The queue's hand-out order written the plain way (two lists, as before the plain lane became an
    OrderedDict): the queue must hand out exactly what this does after any sequence of operations."""

    def __init__(self) -> None:
        self.plain: list[str] = []
        self.urgent: list[str] = []
        self.dirty: set[str] = set()
        self.urgent_keys: set[str] = set()
        self.processing: set[str] = set()
        self.streak = 0
        self.shut = False

    def add(self, key: str, urgent: bool) -> None:
        if self.shut:
            return
        if key in self.dirty:
            if urgent and key not in self.urgent_keys:
                self.urgent_keys.add(key)
                if key not in self.processing:
                    self.plain.remove(key)
                    self.urgent.append(key)
            return
        self.dirty.add(key)
        if urgent:
            self.urgent_keys.add(key)
        if key not in self.processing:
            (self.urgent if urgent else self.plain).append(key)

    def get(self) -> str:
        if self.urgent and (not self.plain or self.streak < URGENT_BURST):
            self.streak = self.streak + 1 if self.plain else 0
            key = self.urgent.pop(0)
        else:
            self.streak = 0
            key = self.plain.pop(0)
        self.dirty.discard(key)
        self.urgent_keys.discard(key)
        self.processing.add(key)
        return key

    def done(self, key: str) -> None:
        self.processing.discard(key)
        if key in self.dirty and not self.shut:
            (self.urgent if key in self.urgent_keys else self.plain).append(key)


QUEUE_OPS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["add", "urgent", "forget", "drop"]), st.sampled_from("abcdef")),
    st.tuples(st.sampled_from(["get", "done"]), st.integers(0, 5)),
    st.just(("shutdown", 0)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(QUEUE_OPS)
def test_the_hand_out_order_is_the_models_after_any_sequence(ops: list[tuple[str, Any]]) -> None:
    """FIFO per lane, dedupe, promotion of a waiting key, a dirty key re-queued in its lane by `done`,
    the urgent burst rule and shutdown, over random interleavings (`forget`/`drop` move nothing)."""

    async def run() -> None:
        q: WorkQueue[str] = WorkQueue()
        m = LaneModel()
        for op, arg in ops:
            if op in ("add", "urgent"):
                q.add(arg, urgent=op == "urgent")
                m.add(arg, op == "urgent")
            elif op == "forget":
                q.forget(arg)
            elif op == "drop":
                q.drop(arg)
            elif op == "shutdown":
                q.shutdown()
                m.shut = True
            elif op == "done":
                if m.processing:
                    key = sorted(m.processing)[arg % len(m.processing)]
                    q.done(key)
                    m.done(key)
            elif m.shut:
                with pytest.raises(QueueShutDown):
                    await q.get()
            elif m.plain or m.urgent:
                assert await q.get() == m.get()
            assert len(q) == len(m.plain) + len(m.urgent)
            assert q.processing() == m.processing
            assert all(q.wanted(k) == (k in m.dirty) for k in "abcdef")

    asyncio.run(run())
