"""libvirtd's per-connection request limit (`max_client_requests`) as a plain object: packets in, packets
to serve out, no I/O.

What libvirtd does (src/rpc/virnetserverclient.c: virNetServerClientNewInternal, DispatchRead,
DispatchWrite, CalculateHandleMode; src/remote/remote_daemon_stream.c): a client connection has at most
one receive buffer, and the buffer counts as a request. Once a packet is read into it, a new buffer is
made only while the requests (calls in service plus that buffer) stay under the limit; without a buffer
the socket is not polled for reading at all. So at most `limit` calls are in service, and whatever the
client sends next (calls, keepalive PINGs and PONGs, stream packets) waits unread in the socket, in its
order, until a reply is written and a buffer is made again.

A call's request ends when its reply is written; a stream-opening call's too (the stream lives on
without a request of its own). A keepalive packet gives its request back as soon as it is read (its
PONG is not counted). A stream packet from the client is a request until the stream has taken it (its
data written into the volume, or the finish or abort answered): in the simulator that is at once, so it
takes no slot here. Events and stream data the daemon sends are never counted.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

P = TypeVar("P")


class Hold(enum.Enum):
    """How long a packet, once read, keeps its request."""

    UNTIL_ANSWERED = "until answered"  # a call: until its reply is written
    NONE = "none"  # keepalive, a stream packet the simulator handles at once: given back when read


@dataclass
class Slots(Generic[P]):
    """One connection's intake: `arrive` a packet, `answered` a call; each returns the packets read now,
    in arrival order, for the caller to serve."""

    limit: int
    in_service: int = 0
    unread: deque[tuple[P, Hold]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        _check(self.limit)

    @property
    def reading(self) -> bool:
        """Whether the daemon polls the socket for more (it has a receive buffer)."""
        return self.in_service < self.limit

    def arrive(self, packet: P, hold: Hold) -> list[P]:
        self.unread.append((packet, hold))
        return self._read()

    def answered(self) -> list[P]:
        """A call's reply was written: its request ends, and reading resumes if it had stopped."""
        if self.in_service <= 0:
            raise RuntimeError("a reply with no call in service")
        self.in_service -= 1
        return self._read()

    def set_limit(self, limit: int) -> list[P]:
        """A new limit (a knob set at run time); calls already in service stay."""
        _check(limit)
        self.limit = limit
        return self._read()

    def _read(self) -> list[P]:
        out: list[P] = []
        while self.unread and self.reading:
            packet, hold = self.unread.popleft()
            if hold is Hold.UNTIL_ANSWERED:
                self.in_service += 1
            out.append(packet)
        return out


def _check(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"max_client_requests {limit}: must be at least 1 (libvirtd has no value for "
                         "unlimited; a large number serves as one)")
