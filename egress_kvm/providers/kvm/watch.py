"""Lifecycle events of one host, for as long as the provider watches: one subscription per connection.

A `HostWatcher` is one task per host. It takes the host's shared session (dialling it if needed, on the
host's own backoff), registers for lifecycle events of all domains on that connection
(CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY, one registration), and hands each event that matters
(events.py's table) to the sink as an `InstanceEvent`. On the same connection it registers for the
guest agent's lifecycle too (event id 18) and hands each connect or disconnect to the sink as an
`AgentEvent`: the controller looks for a booting guest's address when its agent comes up rather than on
its next timer. A host that refuses that second registration still delivers lifecycle events (logged
once per connection); the controller's timer finds the addresses, as it always can.

A bad event costs that event only. One whose body did not decode (rpc raises MalformedEvent in its place
and the stream goes on; only broken framing ends a connection) is counted (`malformed`,
`agent-malformed`) and, on the lifecycle stream, answered with `EventsResumed` as a lost one is (what it
said is unknown); a lost agent event is only a missed wake. One whose delivery raised (an odd event, a
sink's bug) is counted (`rejected`, `agent-rejected`) and dropped. Each kind is logged once per
connection, the rest at V(2), so a host that sends many floods no log. Neither stream ends, nor is
anything re-registered, for one.

Registrations belong to a connection, so when the link drops (or the host's session is re-dialled for
any reason) the stream ends with ConnectionLost and the watcher registers again on the next session;
events of the gap are unknown, so the sink then hears `EventsResumed` and the controller reconciles that
host's Proxies once.

A host that refuses the registration (an old or restricted daemon: a LibvirtError) is watched by
polling only (the prober, its refresh and the resync, as before) until its next re-dial, when the
registration is tried again; the `egress_kvm_libvirt_events_subscribed` gauge shows which hosts are in
that state. Which domains are ours is not decided here (no RPC per event): names that cannot be an
instance's are dropped, and the controller maps the rest to Proxies by the instances their status
records, which only this cluster's Proxies have.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable
from typing import TypeVar

from egress_kvm.backoff import Backoff
from egress_kvm.log import Logger
from egress_kvm.metrics import LIBVIRT_EVENTS, LIBVIRT_EVENTS_SUBSCRIBED
from egress_kvm.providers.base import (
    AgentEvent,
    AgentState,
    EventSink,
    EventsResumed,
    HostEvent,
    InstanceEvent,
    TransientError,
)
from rpc.agentevent import AgentLifecycleEvent
from rpc.constants import AgentLifecycleReason, AgentLifecycleState
from rpc.errors import EventsLost, LibvirtError, MalformedEvent
from rpc.types import LifecycleEvent

from . import events, naming
from .hosts import LINK_ERRORS, Host
from .libvirt_api import AgentLifecycleStream
from .session import Session

#: Floor and cap of the wait between subscription attempts that fail on a session that was just dialled.
RETRY_INITIAL = 0.5
RETRY_MAX = 30.0
#: How often a watcher whose connection refused events looks whether the host has a new connection.
REFUSED_RECHECK = 5.0

_Ev = TypeVar("_Ev", LifecycleEvent, AgentLifecycleEvent)


class BadEvent(enum.Enum):
    """An event that cost only itself, by stream and why: its `egress_kvm_libvirt_events_total` label."""

    MALFORMED = "malformed"  # its body did not decode (rpc's MalformedEvent)
    REJECTED = "rejected"  # delivering it raised (an odd event, or the sink)
    AGENT_MALFORMED = "agent-malformed"
    AGENT_REJECTED = "agent-rejected"


class HostWatcher:
    def __init__(self, host: Host, *, provider: str, sink: EventSink, log: Logger) -> None:
        self.host = host
        self.provider = provider
        self._sink = sink
        self._log = log.with_values(host=host.name)
        self._backoff = Backoff(RETRY_INITIAL, RETRY_MAX)
        self._task: asyncio.Task[None] | None = None
        self.subscriptions = 0  # registrations made (one per connection): the tests read it
        self.refused: str | None = None  # why the current session delivers no events (None: it does)
        self.agent_refused: str | None = None  # why it delivers no agent events (None: it does)
        self._told: set[BadEvent] = set()  # kinds of bad event logged on the current connection

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"lifecycle events {self.provider}/{self.host.name}")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        LIBVIRT_EVENTS_SUBSCRIBED.labels(self.host.name).set(0)

    async def _run(self) -> None:
        refused_on: Session | None = None  # the connection that refused the registration
        while True:
            try:
                session = await self.host.session()
            except TransientError:  # unreachable: the host's own backoff says when to dial again
                await asyncio.sleep(max(self.host.retry_in(), RETRY_INITIAL))
                continue
            if session is refused_on:  # polling only, until the host's session is a new one
                await asyncio.sleep(REFUSED_RECHECK)
                continue
            try:
                await self._follow(session)
            except asyncio.CancelledError:
                raise
            except LibvirtError as exc:
                refused_on = session
                self.refused = f"{exc.message} (libvirt {exc.code_name})"
                LIBVIRT_EVENTS_SUBSCRIBED.labels(self.host.name).set(0)
                self._log.info("lifecycle events refused by the host; drift is found by polling",
                               error=self.refused)
                continue
            except LINK_ERRORS as exc:
                self._log.v(1).info("lifecycle events stream ended; re-registering on the next connection",
                                    reason=str(exc) or type(exc).__name__)
            except Exception as exc:  # a bug here must not end the watch: log it, and try again later
                self._log.error(exc, "lifecycle events watcher failed; retrying")
            LIBVIRT_EVENTS_SUBSCRIBED.labels(self.host.name).set(0)
            await asyncio.sleep(self._backoff.next())

    async def _follow(self, session: Session) -> None:
        async with contextlib.AsyncExitStack() as stack:
            stream = await stack.enter_async_context(session.libvirt.lifecycle_events())
            agents = await self._agent_events(stack, session)
            self.subscriptions += 1
            self._told = set()
            self.refused = None
            self._backoff.reset()
            LIBVIRT_EVENTS_SUBSCRIBED.labels(self.host.name).set(1)
            self._log.v(1).info("lifecycle events subscribed", subscription=self.subscriptions,
                                agentEvents=agents is not None)
            if self.subscriptions > 1:  # what happened between the two connections went unreported
                self._send(EventsResumed(provider=self.provider, zone=self.host.name), BadEvent.REJECTED)
            if agents is not None:
                task = asyncio.get_running_loop().create_task(
                    self._follow_agents(agents), name=f"agent events {self.provider}/{self.host.name}")
                stack.push_async_callback(_cancel, task)
            while True:
                try:
                    async for ev in stream:
                        self._guarded(self._deliver, ev, BadEvent.REJECTED)
                    return  # the subscription was closed under us: register again
                except MalformedEvent as exc:  # one event unread: as if lost, without ending the stream
                    self._bad(BadEvent.MALFORMED,
                              "malformed lifecycle event dropped; reconciling the host's Proxies", exc)
                    self._send(EventsResumed(provider=self.provider, zone=self.host.name), BadEvent.REJECTED)
                except EventsLost as exc:
                    self._log.info("lifecycle events lost; reconciling the host's Proxies", error=str(exc))
                    self._send(EventsResumed(provider=self.provider, zone=self.host.name), BadEvent.REJECTED)

    async def _agent_events(self, stack: contextlib.AsyncExitStack, session: Session
                            ) -> AgentLifecycleStream | None:
        """The agent lifecycle registration on this connection, or None where the host refuses it."""
        try:
            sub: AgentLifecycleStream = await stack.enter_async_context(
                session.libvirt.agent_lifecycle_events())
        except LibvirtError as exc:
            self.agent_refused = f"{exc.message} (libvirt {exc.code_name})"
            self._log.info("guest agent events refused by the host; addresses are looked for on the timer",
                           error=self.agent_refused)
            return None
        self.agent_refused = None
        return sub

    async def _follow_agents(self, stream: AgentLifecycleStream) -> None:
        """Agent events until the stream ends; the lifecycle stream beside it sees the same link errors,
        and re-registers both. A bad event (malformed, or one the sink raised on) costs that event only."""
        while True:
            try:
                async for ev in stream:
                    self._guarded(self._deliver_agent, ev, BadEvent.AGENT_REJECTED)
                return
            except MalformedEvent as exc:  # a wake missed, as a lost one: the timer looks anyway
                self._bad(BadEvent.AGENT_MALFORMED,
                          "malformed guest agent event dropped; its address is looked for on the timer", exc)
            except EventsLost as exc:  # only wakes were lost: each Proxy's IP timer looks anyway, so no
                # EventsResumed (a reconcile of every Proxy of the host, for a hint)
                self._log.info("guest agent events lost; their addresses are looked for on the timer",
                               error=str(exc))
            except LINK_ERRORS:
                return
            except Exception as exc:  # a bug in the stream itself must not end the lifecycle watch beside it
                self._log.error(exc, "guest agent events failed; the timer finds addresses")
                return

    def _guarded(self, deliver: Callable[[_Ev], None], ev: _Ev, kind: BadEvent) -> None:
        """One event to the sink; if that raises (an odd event, a sink's bug), the event is dropped and the
        stream goes on with the next."""
        try:
            deliver(ev)
        except Exception as exc:
            self._bad(kind, "event delivery failed; the event is dropped", exc)

    def _send(self, event: HostEvent, kind: BadEvent) -> None:
        try:
            self._sink(event)
        except Exception as exc:
            self._bad(kind, "event delivery failed; the event is dropped", exc)

    def _bad(self, kind: BadEvent, msg: str, exc: Exception) -> None:
        """Count a bad event; log the first of each kind on a connection (a warning for what the host sent,
        an error for what raised in our code), the rest at V(2) only: a host that sends many must not
        flood the log, and the counter has them all."""
        LIBVIRT_EVENTS.labels(self.host.name, kind.value).inc()
        if kind in self._told:
            self._log.v(2).info(msg, event=kind.value, error=str(exc) or type(exc).__name__)
            return
        self._told.add(kind)
        if isinstance(exc, MalformedEvent):
            self._log.warning(msg, event=kind.value, error=str(exc))
        else:
            self._log.error(exc, msg, event=kind.value)

    def _deliver_agent(self, ev: AgentLifecycleEvent) -> None:
        state = AGENT_STATES.get(ev.state)
        name = ev.dom.name
        LIBVIRT_EVENTS.labels(self.host.name, "agent-" + (state.value.lower() if state else "other")).inc()
        if state is None or not _instance_like(name):
            self._log.v(2).info("guest agent event ignored", name=name, state=int(ev.state),
                                reason=int(ev.reason))
            return
        self._log.v(1).info("guest agent event", name=name, state=state.value, reason=_reason(ev))
        self._sink(AgentEvent(provider=self.provider, zone=self.host.name, name=name, state=state))

    def _deliver(self, ev: LifecycleEvent) -> None:
        LIBVIRT_EVENTS.labels(self.host.name, events.event_name(ev.event)).inc()
        change = events.classify(ev.event, ev.detail)
        name = ev.dom.name
        detail = events.detail_name(ev.event, ev.detail)
        if change is None or not _instance_like(name):
            self._log.v(2).info("lifecycle event ignored", name=name, event=events.event_name(ev.event),
                                detail=detail)
            return
        self._log.v(1).info("lifecycle event", name=name, event=events.event_name(ev.event), detail=detail,
                            change=change.value)
        self._sink(InstanceEvent(provider=self.provider, zone=self.host.name, name=name, change=change,
                                 detail=detail))


#: libvirt's agent states, as the provider reports them (a later libvirt's value: ignored)
AGENT_STATES: dict[int, AgentState] = {AgentLifecycleState.CONNECTED: AgentState.CONNECTED,
                                       AgentLifecycleState.DISCONNECTED: AgentState.DISCONNECTED}


def _reason(ev: AgentLifecycleEvent) -> str:
    r = ev.reason
    return r.name.lower() if isinstance(r, AgentLifecycleReason) else f"reason {r}"


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


def _instance_like(name: str) -> bool:
    try:
        naming.check_instance_name(name)
    except ValueError:
        return False
    return True


class Watchers:
    """Every host's watcher of one provider: the handle `KvmProvider.watch_instances` returns."""

    def __init__(self, watchers: list[HostWatcher]) -> None:
        self.watchers = watchers

    def start(self) -> None:
        for w in self.watchers:
            w.start()

    async def close(self) -> None:
        await asyncio.gather(*(w.close() for w in self.watchers))
