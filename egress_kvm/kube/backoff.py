"""Reconnect delays: exponential with full jitter, reset by success.

Many operator replicas (and every other client) reconnect after the same API server restart; jitter
spreads them out, and the cap keeps a long outage from growing the delay past what a user would wait
for the operator to notice the server is back.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, *, base: float = 0.5, cap: float = 30.0, factor: float = 2.0,
                 jitter: float = 0.5, rng: random.Random | None = None) -> None:
        if base <= 0 or cap < base or factor < 1 or not 0 <= jitter <= 1:
            raise ValueError(f"bad backoff parameters: base={base} cap={cap} factor={factor} jitter={jitter}")
        self.base = base
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self._rng = rng or random.Random()
        self.failures = 0

    def next(self) -> float:
        """The delay before the next attempt; each call counts one more consecutive failure."""
        raw = min(self.cap, self.base * self.factor ** min(self.failures, 64))
        self.failures += 1
        # Keep at least (1 - jitter) of the raw delay so a burst of failures still slows down.
        return raw * (1 - self.jitter) + raw * self.jitter * self._rng.random()

    def reset(self) -> None:
        self.failures = 0
