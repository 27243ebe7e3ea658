"""The network between a client and the simulated daemon (the `rpc_latency_s` knob) as a plain object:
packets go in when the client sends them and come out when they arrive, no I/O.

A stream socket never reorders, so a packet never arrives before one sent earlier, even when the latency
is lowered while some are still on the way: it arrives with them then. The order is kept here, in one
queue, rather than by one loop timer per packet: the loop runs timers due at the same time in no set
order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

P = TypeVar("P")


@dataclass
class Transit(Generic[P]):
    on_the_way: deque[tuple[float, P]] = field(default_factory=deque)  # (arrival time, packet), in order

    def send(self, packet: P, *, now: float, latency: float) -> list[P]:
        """A packet sent at `now`: the packets that arrive at once (this one, when there is no latency and
        nothing ahead of it), the rest kept until `arrived` says they have."""
        if latency <= 0 and not self.on_the_way:
            return [packet]
        arrival = now + latency
        if self.on_the_way:
            arrival = max(arrival, self.on_the_way[-1][0])
        self.on_the_way.append((arrival, packet))
        return []

    def next_arrival(self) -> float | None:
        return self.on_the_way[0][0] if self.on_the_way else None

    def arrived(self, now: float) -> list[P]:
        """The packets that have arrived by `now`, in the order they were sent."""
        out: list[P] = []
        while self.on_the_way and self.on_the_way[0][0] <= now:
            out.append(self.on_the_way.popleft()[1])
        return out
