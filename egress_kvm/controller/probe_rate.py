"""A global cap on health probes per second, shared by every Proxy's probe loop.

One probe task per Proxy, each on its own interval (down to 1 s), made the probe load grow with the
number of Proxies without bound: 5,000 Proxies at 1 s would be 5,000 connections a second. Every probe
first takes a slot from this limiter, spaced 1/rate apart, so the load is at most `rate` probes a second
and, past that, each Proxy is probed less often than its interval asks (fairly: slots go in order).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

DEFAULT_PROBES_PER_SECOND = 200.0


class ProbeRate:
    def __init__(self, rate: float = DEFAULT_PROBES_PER_SECOND, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        if rate <= 0:
            raise ValueError(f"probe rate {rate} must be positive")
        self._spacing = 1.0 / rate
        self._clock = clock
        self._sleep = sleep
        self._next = 0.0

    async def acquire(self) -> None:
        """Wait for this probe's slot (slots are handed out in call order, `1/rate` apart)."""
        now = self._clock()
        slot = max(now, self._next)
        self._next = slot + self._spacing
        if slot > now:
            await self._sleep(slot - now)
