"""Domain event subscriptions: registration, a bounded per-subscription queue, deregistration.

Two kinds, one registration each (CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY with their event id):
lifecycle events (DOMAIN_EVENT_CALLBACK_LIFECYCLE messages) and the guest agent's lifecycle
(DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE, agentevent.py). The connection pushes each message into the
queue of the subscription whose callback id it carries (the protocol decides which ids are live), and
never waits: a consumer that falls behind loses the newest events and is told so (EventsLost), rather
than stalling replies to calls on the same connection. An event whose body does not decode costs that
event only: the iterator raises MalformedEvent in its place and goes on with the next.
"""

from __future__ import annotations

import asyncio
import collections
from typing import ClassVar, Generic, Protocol, TypeVar

from .agentevent import AgentLifecycleEvent
from .constants import DomainEventID
from .errors import ConnectionLost, EventsLost, MalformedEvent
from .types import Domain, LifecycleEvent

E = TypeVar("E", LifecycleEvent, AgentLifecycleEvent)


class EventHost(Protocol):
    """What a subscription needs from a connection (Connection implements it)."""

    async def subscribe(
        self, sub: Subscription[LifecycleEvent] | Subscription[AgentLifecycleEvent], dom: Domain | None, *,
        timeout: float | None
    ) -> int: ...

    async def unsubscribe(self, callback_id: int, *, timeout: float | None) -> None: ...


class Subscription(Generic[E]):
    """Events of one kind (`event_id`) for one domain (or all): `async with client.lifecycle_events() as
    events:` (or `agent_lifecycle_events()`).

    Registration (CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY) happens on entry, deregistration on exit.
    Events wait in this subscription's own bounded queue; if the consumer falls behind and it fills,
    newer events are dropped and the iterator raises EventsLost once after the ones it kept. A malformed
    event (well framed, its body undecodable) is raised as MalformedEvent in its place, once; iterating
    again goes on with the events after it. Once the connection closes, the events queued before come
    out, then ConnectionLost.
    """

    event_id: ClassVar[DomainEventID]
    what: ClassVar[str]  # for messages

    def __init__(self, conn: EventHost, dom: Domain | None, *, timeout: float | None, max_queue: int) -> None:
        self._conn = conn
        self.dom = dom
        self._timeout = timeout
        self._max = max_queue
        self._queue: collections.deque[E | MalformedEvent] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: ConnectionLost | None = None
        self.callback_id: int | None = None
        self.dropped = 0
        self._unreported_drops = 0
        self._active = False
        self._closed = False

    async def __aenter__(self) -> Subscription[E]:
        if self._active:
            raise RuntimeError("this subscription is already registered")
        # The connection routes events to us from the moment the reply is read, before any later packet
        # is handled, so no event can slip past; a registration abandoned after its reply is undone there.
        self.callback_id = await self._conn.subscribe(self, self.dom, timeout=self._timeout)

        self._active = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if not self._active:
            return
        self._active = False
        cb = self.callback_id
        if cb is not None:
            await self._conn.unsubscribe(cb, timeout=self._timeout)
        self._closed = True
        self._wake()

    def __aiter__(self) -> Subscription[E]:
        return self

    async def __anext__(self) -> E:
        while True:
            if self._queue:
                item = self._queue.popleft()
                if isinstance(item, MalformedEvent):
                    raise item
                return item
            if self._unreported_drops:
                n, self._unreported_drops = self._unreported_drops, 0
                raise EventsLost(f"{n} {self.what}s dropped: the consumer fell {self._max} events behind")
            if self._closed:
                raise StopAsyncIteration
            if self._error is not None:
                raise ConnectionLost(str(self._error))
            if not self._active:
                raise RuntimeError("use the subscription inside `async with` (it registers on entry)")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _malformed(self, exc: MalformedEvent) -> None:
        """An event of ours that did not decode: reported in its place, bounded like the events."""
        self._push(exc)

    def _push(self, event: E | MalformedEvent) -> None:
        if len(self._queue) >= self._max:
            self.dropped += 1
            self._unreported_drops += 1
        else:
            self._queue.append(event)
        self._wake()

    def _fail(self, exc: ConnectionLost) -> None:
        """The connection closed with this subscription open: iterating raises ConnectionLost from now on."""
        if self._error is None:
            self._error = exc
        self._wake()


class LifecycleSubscription(Subscription[LifecycleEvent]):
    """Domain lifecycle events (VIR_DOMAIN_EVENT_ID_LIFECYCLE): started, stopped, suspended, ..."""

    event_id = DomainEventID.LIFECYCLE
    what = "lifecycle event"


class AgentLifecycleSubscription(Subscription[AgentLifecycleEvent]):
    """The guest agent's channel opening and closing (VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE)."""

    event_id = DomainEventID.AGENT_LIFECYCLE
    what = "agent lifecycle event"
