"""Lifecycle events through the provider (issue 9 item 1), over the fake libvirt: the table of what
matters, one subscription per connection, re-registration after a drop, the polling fallback when the
host refuses, and no task left behind. The guest agent's connects and disconnects ride the same
connection (a second registration) and reach the sink as AgentEvents."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest
from fakes import fake_kvm_provider
from fakes.libvirt import FakeHypervisor, FakeHypervisors
from provider_helpers import LogCapture, request

from egress_kvm.metrics import LIBVIRT_EVENTS, LIBVIRT_EVENTS_SUBSCRIBED
from egress_kvm.providers.base import (
    AgentEvent,
    AgentState,
    EventsResumed,
    HostEvent,
    InstanceChange,
    InstanceEvent,
)
from egress_kvm.providers.kvm import events, watch
from egress_kvm.providers.kvm.provider import KvmProvider
from rpc.constants import DomainEventType as E

NAME = "proxy-abc"
P = "kvm-test"  # the fake providers file's entry

# (event, detail) -> the change it reports (None: no reconcile). libvirt's numbers, written out.
TABLE = [
    (E.DEFINED, 0, None),  # our own define
    (E.DEFINED, 1, None),
    (E.UNDEFINED, 0, InstanceChange.UNDEFINED),
    (E.UNDEFINED, 1, InstanceChange.UNDEFINED),  # renamed away
    (E.STARTED, 0, None),  # our own start
    (E.STARTED, 4, None),
    (E.SUSPENDED, 0, InstanceChange.PAUSED),  # virsh suspend
    (E.SUSPENDED, 1, None),  # migration: libvirt's own job
    (E.SUSPENDED, 2, InstanceChange.PAUSED),  # I/O error
    (E.SUSPENDED, 3, InstanceChange.PAUSED),  # watchdog
    (E.SUSPENDED, 4, None),  # restored
    (E.SUSPENDED, 5, None),  # from snapshot
    (E.SUSPENDED, 6, InstanceChange.PAUSED),  # API error
    (E.SUSPENDED, 7, None),  # post-copy
    (E.SUSPENDED, 8, InstanceChange.PAUSED),  # post-copy failed
    (E.RESUMED, 0, None),  # our own resume
    (E.STOPPED, 0, InstanceChange.STOPPED),  # shut down
    (E.STOPPED, 1, InstanceChange.STOPPED),  # virsh destroy
    (E.STOPPED, 2, InstanceChange.STOPPED),  # crashed
    (E.STOPPED, 5, InstanceChange.STOPPED),  # QEMU failed
    (E.SHUTDOWN, 0, None),  # a STOPPED follows
    (E.PMSUSPENDED, 0, InstanceChange.PM_SUSPENDED),
    (E.CRASHED, 0, InstanceChange.CRASHED),
    (42, 0, InstanceChange.OTHER),  # a kind libvirt may add later
]


@pytest.mark.parametrize(("event", "detail", "change"), TABLE)
def test_classify(event: int, detail: int, change: InstanceChange | None) -> None:
    assert events.classify(event, detail) is change


def test_names_are_bounded_and_readable() -> None:
    assert events.event_name(E.STOPPED) == "stopped" and events.event_name(99) == "event-99"
    assert events.detail_name(E.STOPPED, 1) == "destroyed"
    assert events.detail_name(E.SUSPENDED, 2) == "I/O error"
    assert events.detail_name(E.STOPPED, 77) == "detail 77" and events.detail_name(99, 0) == "detail 0"


class Sink:
    def __init__(self) -> None:
        self.got: list[HostEvent] = []
        self.changed = asyncio.Event()

    def __call__(self, ev: HostEvent) -> None:
        self.got.append(ev)
        self.changed.set()

    async def wait(self, n: int) -> list[HostEvent]:
        async with asyncio.timeout(5):
            while len(self.got) < n:
                self.changed.clear()
                await self.changed.wait()
        return self.got


async def until(check, what: str) -> None:  # type: ignore[no-untyped-def]
    """Wait until check() is truthy; the limit is a safety net, not an assertion about speed."""
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def watcher_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(("lifecycle events ", "agent events "))]


@pytest.fixture
async def running():  # type: ignore[no-untyped-def]
    provider, hv = fake_kvm_provider(hosts=["host0", "host1"], cluster_id="c1")
    await provider.create(request())
    yield provider, hv
    await provider.close()


async def test_destroy_suspend_undefine_reach_the_sink_ours_only(running, logs: LogCapture) -> None:  # type: ignore[no-untyped-def]
    provider, hv = running
    h = hv["host0"]
    sink = Sink()
    handle = provider.watch_instances(sink)
    await until(lambda: len(h.listeners) == 1 and len(hv["host1"].listeners) == 1, "both subscribed")
    # One per connection and kind: lifecycle, guest agent lifecycle.
    assert h.calls.count("connect_domain_event_callback_register_any") == 2
    assert LIBVIRT_EVENTS_SUBSCRIBED.labels("host0")._value.get() == 1
    before = LIBVIRT_EVENTS.labels("host0", "stopped")._value.get()

    dom = h.domains[NAME].handle()
    h.domain_suspend(dom)  # virsh suspend
    h.domain_resume(dom)  # not drift: no event to the sink
    h.domain_destroy_flags(h.domains[NAME].handle(), 0)  # virsh destroy
    got = await sink.wait(2)
    assert got == [InstanceEvent(P, "host0", NAME, InstanceChange.PAUSED, "paused"),
                   InstanceEvent(P, "host0", NAME, InstanceChange.STOPPED, "destroyed")]
    assert LIBVIRT_EVENTS.labels("host0", "stopped")._value.get() == before + 1
    assert LIBVIRT_EVENTS.labels("host0", "resumed")._value.get() >= 1  # counted, not delivered
    [line] = [r for r in logs.lines("lifecycle event") if r["change"] == "Stopped"]
    assert (line["host"], line["name"], line["detail"]) == ("host0", NAME, "destroyed")

    # A domain whose name cannot be an instance's is not passed on (no RPC spent on it either).
    h.calls.clear()
    h.domain_define_xml(h.domain_get_xml_desc(h.domains[NAME].handle(), 0).replace(NAME, "Not_Ours", 1))
    h.domain_undefine_flags(h.domains["Not_Ours"].handle(), 0)
    h.domain_undefine_flags(h.domains[NAME].handle(), 0)
    got = await sink.wait(3)
    assert got[2] == InstanceEvent(P, "host0", NAME, InstanceChange.UNDEFINED, "removed")
    assert h.calls == []
    await handle.close()
    assert LIBVIRT_EVENTS_SUBSCRIBED.labels("host0")._value.get() == 0
    assert h.listeners == []  # deregistered


async def test_a_drop_re_registers_on_the_new_connection_and_reports_the_gap(running) -> None:  # type: ignore[no-untyped-def]
    provider, hv = running
    h = hv["host0"]
    sink = Sink()
    provider.watch_instances(sink)
    await until(lambda: len(h.listeners) == 1, "subscribed")
    h.drop_connections()
    got = await sink.wait(1)
    assert got == [EventsResumed(P, "host0")]  # re-dialled, registered again: the gap is reported
    assert h.calls.count("connect_domain_event_callback_register_any") == 4
    assert len(h.listeners) == 1 and len(h.agent_listeners) == 1  # the old ones went with their connection
    h.domain_destroy_flags(h.domains[NAME].handle(), 0)
    got = await sink.wait(2)
    assert got[1].change is InstanceChange.STOPPED  # type: ignore[union-attr]


async def test_a_host_that_refuses_events_is_polled_until_its_next_connection(  # type: ignore[no-untyped-def]
        running, logs: LogCapture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "REFUSED_RECHECK", 0.05)
    provider, hv = running
    h = hv["host0"]
    h.events_refused = True
    sink = Sink()
    provider.watch_instances(sink)
    await until(lambda: logs.lines("lifecycle events refused by the host; drift is found by polling"),
                "the refusal logged")
    [line] = logs.lines("lifecycle events refused by the host; drift is found by polling")
    assert line["host"] == "host0" and "unknown procedure" in line["error"]
    assert LIBVIRT_EVENTS_SUBSCRIBED.labels("host0")._value.get() == 0
    h.domain_destroy_flags(h.domains[NAME].handle(), 0)
    await asyncio.sleep(0.05)
    assert sink.got == []  # nothing: the reconcile's polling (probes, resync) finds the drift
    assert h.calls.count("connect_domain_event_callback_register_any") == 1  # not retried on this connection
    assert (await provider.get(NAME, "host0")) is not None  # the provider works as before

    h.events_refused = False  # e.g. libvirtd upgraded: the next connection registers
    h.drop_connections()
    await until(lambda: len(h.listeners) == 1, "registered on the new connection")
    assert LIBVIRT_EVENTS_SUBSCRIBED.labels("host0")._value.get() == 1


async def test_an_unreachable_host_is_watched_once_it_answers(logs: LogCapture) -> None:
    provider, hv = fake_kvm_provider(hosts=["host0"], cluster_id="c1")
    hv.set_unreachable("host0")
    sink = Sink()
    try:
        provider.watch_instances(sink)
        await until(lambda: logs.lines("libvirt host dial failed"), "a failed dial")
        assert hv["host0"].listeners == []
        hv.set_unreachable("host0", False)
        await until(lambda: len(hv["host0"].listeners) == 1, "subscribed after the host came back")
    finally:
        await provider.close()


async def test_close_leaves_no_task_and_no_registration() -> None:
    provider, hv = fake_kvm_provider(hosts=["host0", "host1"], cluster_id="c1")
    provider.watch_instances(Sink())
    provider.watch_instances(Sink())  # a second watch (e.g. a new leader term): closed too
    await until(lambda: all(len(hv[n].agent_listeners) == 2 for n in ("host0", "host1")), "subscribed")
    assert len(watcher_tasks()) == 8  # per watch and host: the lifecycle watcher and its agent stream
    await provider.close()
    assert watcher_tasks() == []
    assert all(hv[n].listeners == [] and hv[n].agent_listeners == [] for n in ("host0", "host1"))


async def test_the_guest_agent_connecting_and_disconnecting_reach_the_sink_ours_only(  # type: ignore[no-untyped-def]
        running, logs: LogCapture) -> None:
    provider, hv = running
    h = hv["host0"]
    sink = Sink()
    handle = provider.watch_instances(sink)
    await until(lambda: len(h.agent_listeners) == 1, "subscribed")
    h.set_vm_ip(NAME, "10.0.0.5")  # the boot's end: the agent answers with the address
    h.agent_stopped(NAME)
    got = await sink.wait(2)
    assert got == [AgentEvent(P, "host0", NAME, AgentState.CONNECTED),
                   AgentEvent(P, "host0", NAME, AgentState.DISCONNECTED)]
    [line] = [r for r in logs.lines("guest agent event") if r["state"] == "Connected"]
    assert (line["host"], line["name"], line["reason"]) == ("host0", NAME, "channel")
    # Someone else's domain (a name no instance has) is not passed on.
    h.domain_define_xml(h.domain_get_xml_desc(h.domains[NAME].handle(), 0).replace(NAME, "Not_Ours", 1))
    h.domain_create_with_flags(h.domains["Not_Ours"].handle(), 0)
    h.set_vm_ip("Not_Ours", "10.0.0.6")
    h.set_vm_ip(NAME, "10.0.0.5")
    got = await sink.wait(3)
    assert got[2:] == [AgentEvent(P, "host0", NAME, AgentState.CONNECTED)]
    await handle.close()
    assert h.agent_listeners == []


async def test_a_restarted_guest_s_agent_connects_again(running) -> None:  # type: ignore[no-untyped-def]
    """A destroy closes no channel (no agent event), but the next start's guest opens a new one: CONNECTED
    again, as from libvirtd (the model once took the last run's agent for still connected)."""
    provider, hv = running
    h = hv["host0"]
    sink = Sink()
    handle = provider.watch_instances(sink)
    await until(lambda: len(h.agent_listeners) == 1, "subscribed")
    h.set_vm_ip(NAME, "10.0.0.5")
    dom = h.domains[NAME].handle()
    h.domain_destroy_flags(dom, 0)
    h.domain_create_with_flags(dom, 0)
    h.set_vm_ip(NAME, "10.0.0.5")
    got = [e for e in await sink.wait(4) if isinstance(e, AgentEvent)]  # and the destroy's STOPPED
    assert [e.state for e in got] == [AgentState.CONNECTED, AgentState.DISCONNECTED, AgentState.CONNECTED]
    await handle.close()


async def test_lost_agent_events_cost_no_reconcile_of_the_host(running, logs: LogCapture) -> None:  # type: ignore[no-untyped-def]
    """A lost agent event is only a wake missed (its Proxy's IP timer looks anyway): no EventsResumed, which
    would reconcile every Proxy of the host (1,000 at fleet scale); the stream goes on."""
    provider, hv = running
    h = hv["host0"]
    sink = Sink()
    handle = provider.watch_instances(sink)
    await until(lambda: len(h.agent_listeners) == 1, "subscribed")
    h.agent_listeners[0].__self__.lose(3)  # type: ignore[attr-defined]
    await until(lambda: logs.lines("guest agent events lost; their addresses are looked for on the timer"),
                "the loss logged")
    h.set_vm_ip(NAME, "10.0.0.5")
    assert await sink.wait(1) == [AgentEvent(P, "host0", NAME, AgentState.CONNECTED)]
    await handle.close()


async def test_a_host_that_refuses_agent_events_still_delivers_lifecycle_events(  # type: ignore[no-untyped-def]
        running, logs: LogCapture) -> None:
    provider, hv = running
    h = hv["host0"]
    h.agent_events_refused = True
    sink = Sink()
    provider.watch_instances(sink)
    await until(lambda: logs.lines("lifecycle events subscribed"), "lifecycle events subscribed")
    [line] = logs.lines("guest agent events refused by the host; addresses are looked for on the timer")
    assert line["host"] == "host0" and "not supported" in line["error"]
    assert LIBVIRT_EVENTS_SUBSCRIBED.labels("host0")._value.get() == 1
    h.set_vm_ip(NAME, "10.0.0.5")
    h.domain_destroy_flags(h.domains[NAME].handle(), 0)
    assert await sink.wait(1) == [InstanceEvent(P, "host0", NAME, InstanceChange.STOPPED, "destroyed")]


# -- a bad event costs that event only (issue 8: faults at fleet scale) ----------------------------------


def count(host: str, kind: str) -> float:
    return LIBVIRT_EVENTS.labels(host, kind)._value.get()  # type: ignore[no-any-return]


async def watch_host0(running: tuple[KvmProvider, FakeHypervisors], sink: Sink,
                      registered: Callable[[FakeHypervisor], Sequence[object]],
                      ) -> tuple[FakeHypervisor, watch.Watchers]:
    """Watch the instances with `sink`, once host0 holds one registration of the kind `registered` reads
    (its lifecycle `listeners` or its `agent_listeners`): (host0, the watch's handle)."""
    provider, hv = running
    h = hv["host0"]
    handle = provider.watch_instances(sink)
    await until(lambda: len(registered(h)) == 1, "subscribed")
    return h, handle


@pytest.mark.parametrize("logs", ["2"], indirect=True)  # V(2) shown: the repeats are there, below the default
async def test_a_malformed_agent_event_costs_only_itself(running, logs: LogCapture) -> None:  # type: ignore[no-untyped-def]
    """A malformed agent event (rpc's MalformedEvent) used to end the agent stream until the host's next
    re-dial: every later wake was lost. Now it is counted and logged once per connection, and the next
    event reaches the sink on the same registration, with no reconcile of the host."""
    sink = Sink()
    h, handle = await watch_host0(running, sink, lambda host: host.agent_listeners)
    before = count("host0", "agent-malformed")
    sub = h.agent_listeners[0].__self__
    sub.malformed()
    sub.malformed()  # a host that sends many: the log says so once
    h.set_vm_ip(NAME, "10.0.0.5")
    assert await sink.wait(1) == [AgentEvent(P, "host0", NAME, AgentState.CONNECTED)]
    assert count("host0", "agent-malformed") == before + 2
    msg = "malformed guest agent event dropped; its address is looked for on the timer"
    assert [r["level"] for r in logs.lines(msg)] == ["warn", "Level(-2)"]
    assert logs.lines(msg)[0]["host"] == "host0" and "malformed event" in logs.lines(msg)[0]["error"]
    assert h.calls.count("connect_domain_event_callback_register_any") == 2  # no re-registration
    assert [cb.__self__ for cb in h.agent_listeners] == [sub]
    await handle.close()
    assert not any(isinstance(e, EventsResumed) for e in sink.got)


async def test_a_malformed_lifecycle_event_reconciles_the_host_and_the_stream_goes_on(  # type: ignore[no-untyped-def]
        running, logs: LogCapture) -> None:
    """What a malformed lifecycle event said is unknown (as a lost one's): the host's Proxies are reconciled
    once (EventsResumed), on the same registration; the next event arrives as usual."""
    sink = Sink()
    h, handle = await watch_host0(running, sink, lambda host: host.listeners)
    before = count("host0", "malformed")
    h.listeners[0].__self__.malformed()
    h.domain_destroy_flags(h.domains[NAME].handle(), 0)
    assert await sink.wait(2) == [EventsResumed(P, "host0"),
                                  InstanceEvent(P, "host0", NAME, InstanceChange.STOPPED, "destroyed")]
    assert count("host0", "malformed") == before + 1
    [line] = logs.lines("malformed lifecycle event dropped; reconciling the host's Proxies")
    assert line["level"] == "warn"
    assert h.calls.count("connect_domain_event_callback_register_any") == 2  # no re-registration
    assert logs.lines("lifecycle events stream ended; re-registering on the next connection") == []
    await handle.close()


class FlakySink(Sink):
    """A sink with a bug that bites once per listed kind of event."""

    def __init__(self, *fail: type) -> None:
        super().__init__()
        self.fail = list(fail)

    def __call__(self, ev: HostEvent) -> None:
        if type(ev) in self.fail:
            self.fail.remove(type(ev))
            raise RuntimeError(f"sink bug on {type(ev).__name__}")
        super().__call__(ev)


async def test_a_sink_that_raises_once_loses_that_event_only(running, logs: LogCapture) -> None:  # type: ignore[no-untyped-def]
    """An exception from the sink used to end the agent stream for the connection, and on the lifecycle
    stream to tear the subscription down (a backoff, a re-registration, EventsResumed: a reconcile of every
    Proxy of the host). Now that event is dropped, counted and logged, and the next one arrives."""
    sink = FlakySink(AgentEvent, InstanceEvent)
    h, handle = await watch_host0(running, sink, lambda host: host.agent_listeners)
    before = (count("host0", "rejected"), count("host0", "agent-rejected"))
    h.set_vm_ip(NAME, "10.0.0.5")  # raises in the sink
    h.agent_stopped(NAME)
    dom = h.domains[NAME].handle()
    h.domain_suspend(dom)  # raises in the sink
    h.domain_destroy_flags(dom, 0)
    got = await sink.wait(2)
    assert sorted(map(repr, got)) == sorted(map(repr, [
        AgentEvent(P, "host0", NAME, AgentState.DISCONNECTED),
        InstanceEvent(P, "host0", NAME, InstanceChange.STOPPED, "destroyed")]))
    assert (count("host0", "rejected"), count("host0", "agent-rejected")) == (before[0] + 1, before[1] + 1)
    lines = logs.lines("event delivery failed; the event is dropped")
    assert sorted((r["level"], r["event"]) for r in lines) == [("error", "agent-rejected"),
                                                                ("error", "rejected")]
    assert {r["error"] for r in lines} == {"sink bug on AgentEvent", "sink bug on InstanceEvent"}
    assert h.calls.count("connect_domain_event_callback_register_any") == 2  # no re-registration
    assert not any(isinstance(e, EventsResumed) for e in sink.got)
    assert len(watcher_tasks()) == 4  # both streams of both hosts still followed
    await handle.close()
