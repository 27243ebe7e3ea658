"""The one exponential backoff: base * factor^(n-1) after the n-th consecutive failure, capped, jittered.

Every retry schedule in the operator is one of these: the reconcile queue's per-key retries (no jitter:
a key's own history decides), reconnects to the API server and re-dials of a libvirt host (jitter
spreads many clients reconnecting after the same outage), a guest that keeps stopping, a guest that
never gets an IP. `delay(n)` is pure; `next()`/`reset()` count failures for a caller that keeps one.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, base: float, cap: float, *, factor: float = 2.0, jitter: float = 0.0,
                 rng: random.Random | None = None) -> None:
        if base <= 0 or cap < base or factor < 1 or not 0 <= jitter <= 1:
            raise ValueError(f"bad backoff parameters: base={base} cap={cap} factor={factor} jitter={jitter}")
        self.base = base
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self._rng = rng or random.Random()
        self.failures = 0

    def delay(self, failures: int) -> float:
        """The delay after `failures` consecutive failures (0 for none)."""
        if failures <= 0:
            return 0.0
        # Bound the exponent so a key failing for days does not overflow a float.
        raw = min(self.cap, self.base * self.factor ** min(failures - 1, 62))
        if not self.jitter:
            return raw
        # Keep at least (1 - jitter) of the raw delay so a burst of failures still slows down.
        return raw * (1 - self.jitter) + raw * self.jitter * self._rng.random()

    def next(self) -> float:
        """The delay before the next attempt; each call counts one more consecutive failure."""
        self.failures += 1
        return self.delay(self.failures)

    def reset(self) -> None:
        self.failures = 0

    def __repr__(self) -> str:
        return f"Backoff(base={self.base}, cap={self.cap}, factor={self.factor}, jitter={self.jitter})"
