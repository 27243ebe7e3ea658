"""The daemon's own keepalive on one connection, as libvirtd runs it (src/rpc/virkeepalive.c), with no I/O.

libvirtd starts it when the client asks CONNECT_SUPPORTS_FEATURE about the keepalive program (a client
that never asks is never pinged). Every packet it reads from the client is a sign of life
(virKeepAliveCheckMessage): the count starts over. After `interval` s with nothing read it sends a PING,
then another each `interval` s, `count` in all; when one more interval passes with still nothing read it
closes the connection ("connection closed due to keepalive timeout"): about interval x (count + 1) s
after the last packet read (libvirtd.conf: keepalive_interval 5, keepalive_count 5, so 30 s).

A PONG is a sign of life only once read. While all of a connection's requests are in service the daemon
reads nothing (slots.py), so a client that answers every PING is still closed this way if no call ends
for that long: the "keep-alive timeouts" libvirtd.conf warns of under `max_client_requests`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Step(enum.Enum):
    WAIT = "wait"  # nothing due yet (something was read meanwhile)
    PING = "ping"
    CLOSE = "close"


@dataclass
class Keepalive:
    interval: float  # <= 0: the daemon never pings (libvirtd's keepalive_interval = -1)
    count: int
    last_heard: float
    running: bool = False
    interval_start: float = 0.0
    pings_left: int = 0

    def heard(self, now: float) -> None:
        """A packet was read from the client."""
        self.last_heard = self.interval_start = now
        self.pings_left = self.count

    def start(self, now: float) -> None:
        """The client asked about keepalive: the first PING comes `interval` s after it was last heard."""
        if self.running or self.interval <= 0:
            return
        self.running = True
        self.pings_left = self.count
        self.interval_start = max(self.last_heard, now - self.interval)

    def next_wakeup(self) -> float | None:
        return self.interval_start + self.interval if self.running else None

    def tick(self, now: float) -> Step:
        if not self.running or now < self.interval_start + self.interval:
            return Step.WAIT
        if self.pings_left == 0:
            self.running = False
            return Step.CLOSE
        self.pings_left -= 1
        self.interval_start = now
        return Step.PING
