"""The reconcile queue: client-go's workqueue guarantees, for one asyncio loop.

- A key is queued at most once however often it is added (dedupe), so a burst of watch events for one
  Proxy costs one reconcile.
- A key being processed is never handed to a second worker; if it is added meanwhile it is marked dirty
  and queued again when the worker calls `done`, so the change that arrived mid-reconcile is not lost.
- Retries are per key: `add_rate_limited` waits base * 2^(n-1) (capped) after the n-th consecutive
  failure; quota failures use their own slower schedule, since capacity rarely frees up in seconds.
  `forget` resets a key's backoff after a success (a retry already scheduled still comes, unless that
  success's follow-up took its timer over).
- `add_after` schedules a delayed add (polling for an IP, waiting for a Secret); a pending timer is only
  ever moved earlier, so a short requeue cannot be postponed by a long one. `advance` adds the key now,
  urgent, in place of its timer (an event said that what it waited for happened): one reconcile instead
  of the event's and the timer's.
- Two lanes: an `urgent` add (work already in flight making progress: a follow-up coming due, a probe
  verdict that changed, a finished import, an event `advance` passes on) is handed out before the plain
  ones, and promotes a key already waiting in the plain lane; a plain add never demotes one
  (`lane_after`). With 1,000 Proxies applied at once a first-come order let every Proxy's boot
  follow-up wait behind all the creates not yet started (none reached Running before the last create,
  38 s in); finishing what is in flight first leaves the total work the same and the latency of each
  Proxy far shorter. A delayed add comes due in the lane of what it stands for (`DUE_LANE`): a
  follow-up (`add_after`: polling for an IP, waiting for a Secret or an import) is urgent, a retry
  after a failure (`add_rate_limited`) is plain, so the retries of a dead host's hundreds of Proxies
  queue first-come with new Proxies, deletes and spec edits instead of ahead of them. What a key's
  timer stands for is set by the latest reconcile's outcome: a failure's retry replaces a pending
  follow-up, a success's follow-up takes over a pending retry (even one due earlier). A retry does
  not demote a key an event already made urgent, waiting or processing. The urgent lane is bounded:
  after `URGENT_BURST` urgent keys in a row while plain work waits, one plain key goes next, so
  urgent work that never runs out (1,000 Proxies' boot polls, flapping verdicts) cannot hold back a
  new Proxy, a delete or a spec edit forever; plain work keeps at least 1/(URGENT_BURST+1) of the
  hand-outs, urgent work at least URGENT_BURST/(URGENT_BURST+1).
- After `shutdown` no key is handed out again; `get` raises `QueueShutDown` so workers exit.
"""

from __future__ import annotations

import asyncio
import enum
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from egress_kvm import metrics
from egress_kvm.backoff import Backoff


class QueueShutDown(Exception):
    """The queue was shut down: the worker that gets this should exit."""


TRANSIENT_BACKOFF = Backoff(base=1.0, cap=300.0)
QUOTA_BACKOFF = Backoff(base=60.0, cap=900.0)
URGENT_BURST = 4  # at most this many urgent keys in a row while a plain one waits (module docstring)


class Lane(enum.IntEnum):
    """Where a wanted key waits; the higher lane is served first (module docstring)."""

    PLAIN = 0
    URGENT = 1


class Due(enum.Enum):
    """What a delayed add stands for, which decides its lane when it comes due (`DUE_LANE`)."""

    FOLLOW_UP = "follow-up"  # `add_after`: a reconcile that succeeded waits for progress (an IP, a Secret)
    RETRY = "retry"  # `add_rate_limited`: a reconcile that failed, tried again after its backoff


# A follow-up is the next step of work in flight; a retry is the same step again after a failure, and the
# failures of a dead host's hundreds of Proxies would otherwise take URGENT_BURST of every URGENT_BURST+1
# hand-outs from new Proxies, deletes and spec edits, for work that mostly fails again.
DUE_LANE: dict[Due, Lane] = {Due.FOLLOW_UP: Lane.URGENT, Due.RETRY: Lane.PLAIN}


def lane_after(current: Lane | None, added: Lane) -> Lane:
    """The lane of a key once `added` comes for it; `current` is its lane if it is already wanted (waiting,
    or dirty while processing), else None. Only ever promoted: a plain add (a watch event, a resync, a
    retry coming due) never moves a key out of the urgent lane a real event put it in."""
    return added if current is None else max(current, added)


K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keyed by `K` (the controller's: a Proxy's `Key`)."""

    def __init__(self, *, name: str = "proxy", transient: Backoff = TRANSIENT_BACKOFF,
                 quota: Backoff = QUOTA_BACKOFF, on_due: Callable[[K], None] | None = None) -> None:
        """`on_due(key)`: called when a delayed add (`add_after`, a backoff retry) comes due, before the add
        (the controller: such an add asks for a real look, see planner.vouched)."""
        self.name = name
        self._on_due = on_due
        self._transient = transient
        self._quota = quota
        # The plain lane, in order; an OrderedDict so that promoting a key out of it costs O(1), not a
        # scan of every key waiting (1,000 on a ramp).
        self._queue: OrderedDict[K, None] = OrderedDict()
        self._urgent: deque[K] = deque()  # served first (module docstring)
        self._urgent_keys: set[K] = set()  # dirty keys whose pending add is urgent
        self._urgent_streak = 0  # urgent keys handed out in a row while a plain one waited
        self._dirty: set[K] = set()  # wanted: queued, or to be queued once processing ends
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._quota_failures: dict[K, int] = {}
        self._timers: dict[K, tuple[float, asyncio.TimerHandle, Due]] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._shutting_down = False
        self._metrics = metrics.QueueMetrics(name)

    # --- adding ---------------------------------------------------------------------------------------

    def add(self, key: K, *, urgent: bool = False) -> None:
        """`urgent`: work in flight making progress (module docstring); it promotes a waiting key."""
        self._add(key, Lane.URGENT if urgent else Lane.PLAIN)

    def add_after(self, key: K, delay: float) -> None:
        """A follow-up: add `key` after `delay`, urgent when it comes due. A delay <= 0 is a plain add now
        (the reconciler's start-over after a spec change, whose own watch event queues it plain too)."""
        if delay <= 0:
            self.add(key)
            return
        self._schedule(key, delay, Due.FOLLOW_UP)

    def advance(self, key: K) -> None:
        """Add `key` now, urgent, cancelling its pending delayed add (a follow-up or a retry): an event
        said that what it waited for happened, which is progress; the reconcile that follows schedules
        its own next look (or a retry), so the timer has nothing left to do."""
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()
        self.add(key, urgent=True)

    def add_rate_limited(self, key: K, *, quota: bool = False) -> float:
        """Re-add after this key's backoff, due in the plain lane (`DUE_LANE`); returns the delay chosen."""
        counts, backoff = (self._quota_failures, self._quota) if quota else (self._failures, self._transient)
        counts[key] = counts.get(key, 0) + 1
        delay = backoff.delay(counts[key])
        self._metrics.retried()
        # The backoff is the schedule now: a delayed add left by an earlier result (a background import's
        # progress poll) asked for the reconcile that just failed, and firing it would count a second
        # failure at once (a quota retry after 10 s at 120 s, not after 60 s; seen by the fault campaign).
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()
        self._schedule(key, delay, Due.RETRY)
        return delay

    def forget(self, key: K) -> None:
        """Reset the key's backoff (after a successful reconcile). A retry already scheduled still comes, in
        the plain lane, unless the success's follow-up (`add_after`) took its timer over."""
        self._failures.pop(key, None)
        self._quota_failures.pop(key, None)

    def wanted(self, key: K) -> bool:
        """Queued, or to be queued again once its reconcile in flight ends."""
        return key in self._dirty

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0) + self._quota_failures.get(key, 0)

    def drop(self, key: K) -> None:
        """Forget everything about a key (its object is gone): backoff, pending delayed add."""
        self.forget(key)
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()

    # --- taking -----------------------------------------------------------------------------------------

    async def get(self) -> K:
        """The next key, marked as processing until `done(key)`."""
        while True:
            if self._shutting_down:
                raise QueueShutDown
            if self._urgent or self._queue:
                key = self._next()
                self._dirty.discard(key)
                self._urgent_keys.discard(key)
                self._processing.add(key)
                self._metrics.taken(key)
                self._changed()
                return key
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # we consumed a wake-up meant for a key: pass it on
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                raise

    def done(self, key: K) -> None:
        self._processing.discard(key)
        self._metrics.done(key)
        if key in self._dirty and not self._shutting_down:
            self._push(key, urgent=key in self._urgent_keys)
            self._changed()
            self._wake_one()

    # --- state ------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._urgent) + len(self._queue)

    def processing(self) -> frozenset[K]:
        return frozenset(self._processing)

    def pending_delayed(self) -> frozenset[K]:
        return frozenset(self._timers)

    def shutdown(self) -> None:
        """Hand out no more keys; wake every waiting worker so it sees QueueShutDown."""
        self._shutting_down = True
        for _, handle, _ in self._timers.values():
            handle.cancel()
        self._timers.clear()
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)

    # --- internals --------------------------------------------------------------------------------------

    def _add(self, key: K, lane: Lane) -> None:
        if self._shutting_down:
            return
        wanted = key in self._dirty
        current = (Lane.URGENT if key in self._urgent_keys else Lane.PLAIN) if wanted else None
        new = lane_after(current, lane)
        if new is Lane.URGENT:
            self._urgent_keys.add(key)
        if wanted:
            if current is Lane.PLAIN and new is Lane.URGENT and key not in self._processing:
                del self._queue[key]  # waiting in the plain lane: move it up
                self._urgent.append(key)
            return
        self._dirty.add(key)
        self._metrics.added(key)
        if key in self._processing:
            return  # `done` queues it again, in its lane
        self._push(key, urgent=new is Lane.URGENT)
        self._changed()
        self._wake_one()

    def _schedule(self, key: K, delay: float, due: Due) -> None:
        """One timer per key, only ever moved earlier; it stands for the latest call's `due` (the latest
        reconcile's outcome, module docstring), also when it keeps an earlier time."""
        if self._shutting_down:
            return
        loop = asyncio.get_running_loop()
        at = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None and pending[0] <= at:
            self._timers[key] = (pending[0], pending[1], due)  # an earlier add is already scheduled
            return
        if pending is not None:
            pending[1].cancel()
        self._timers[key] = (at, loop.call_at(at, self._fire, key), due)

    def _next(self) -> K:
        """The urgent lane first, but never more than URGENT_BURST in a row past a waiting plain key."""
        if self._urgent and (not self._queue or self._urgent_streak < URGENT_BURST):
            self._urgent_streak = self._urgent_streak + 1 if self._queue else 0
            return self._urgent.popleft()
        self._urgent_streak = 0
        return self._queue.popitem(last=False)[0]

    def _push(self, key: K, *, urgent: bool) -> None:
        if urgent:
            self._urgent.append(key)
        else:
            self._queue[key] = None

    def _fire(self, key: K) -> None:
        pending = self._timers.pop(key, None)
        if pending is None:
            return  # not reached: a timer is cancelled whenever its entry is replaced or removed
        if self._on_due is not None:
            self._on_due(key)
        self._add(key, DUE_LANE[pending[2]])

    def _wake_one(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def _changed(self) -> None:
        self._metrics.depth(len(self))
