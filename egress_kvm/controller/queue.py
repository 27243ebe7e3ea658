"""The reconcile queue: client-go's workqueue guarantees, for one asyncio loop.

- A key is queued at most once however often it is added (dedupe), so a burst of watch events for one
  Proxy costs one reconcile.
- A key being processed is never handed to a second worker; if it is added meanwhile it is marked dirty
  and queued again when the worker calls `done`, so the change that arrived mid-reconcile is not lost.
- Retries are per key: `add_rate_limited` waits base * 2^(n-1) (capped) after the n-th consecutive
  failure; quota failures use their own slower schedule, since capacity rarely frees up in seconds.
  `forget` resets a key after a success.
- `add_after` schedules a delayed add (polling for an IP, waiting for a Secret); a pending timer is only
  ever moved earlier, so a short requeue cannot be postponed by a long one. `advance` makes it due now
  (an event said that what it waited for happened): one reconcile instead of the event's and the timer's.
- Two lanes: an `urgent` add (work already in flight: a delayed add coming due, a probe verdict that
  changed) is handed out before the plain ones, and promotes a key already waiting in the plain lane.
  With 1,000 Proxies applied at once a first-come order let every Proxy's boot follow-up wait behind all
  the creates not yet started (none reached Running before the last create, 38 s in); finishing what
  is in flight first leaves the total work the same and the latency of each Proxy far shorter. The
  lane is bounded: after `URGENT_BURST` urgent keys in a row while plain work waits, one plain key goes
  next, so urgent work that never runs out (1,000 Proxies' boot polls, flapping verdicts, a dead host's
  retries) cannot hold back a new Proxy, a delete or a spec edit forever; plain work keeps at least
  1/(URGENT_BURST+1) of the hand-outs, urgent work at least URGENT_BURST/(URGENT_BURST+1).
- After `shutdown` no key is handed out again; `get` raises `QueueShutDown` so workers exit.
"""

from __future__ import annotations

import asyncio
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
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._shutting_down = False
        self._metrics = metrics.QueueMetrics(name)

    # --- adding ---------------------------------------------------------------------------------------

    def add(self, key: K, *, urgent: bool = False) -> None:
        if self._shutting_down:
            return
        if key in self._dirty:
            if urgent and key not in self._urgent_keys:
                self._urgent_keys.add(key)
                if key not in self._processing:  # waiting in the plain lane: move it up
                    del self._queue[key]
                    self._urgent.append(key)
            return
        self._dirty.add(key)
        self._metrics.added(key)
        if urgent:
            self._urgent_keys.add(key)
        if key in self._processing:
            return  # `done` queues it again
        self._push(key, urgent=urgent)
        self._changed()
        self._wake_one()

    def add_after(self, key: K, delay: float) -> None:
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= due:
                return  # an earlier add is already scheduled
            pending[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def advance(self, key: K) -> None:
        """Add `key` now as its pending delayed add would (urgent), cancelling that add: the reconcile
        that follows schedules its own next look (or a retry), so the timer has nothing left to do."""
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()
        self.add(key, urgent=True)

    def add_rate_limited(self, key: K, *, quota: bool = False) -> float:
        """Re-add after this key's backoff; returns the delay chosen."""
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
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset the key's backoff (after a successful reconcile)."""
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
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)

    # --- internals --------------------------------------------------------------------------------------

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
        self._timers.pop(key, None)
        if self._on_due is not None:
            self._on_due(key)
        self.add(key, urgent=True)  # a follow-up of work in flight

    def _wake_one(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def _changed(self) -> None:
        self._metrics.depth(len(self))
