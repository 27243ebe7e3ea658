"""Events are written in the background (kube/recorder.py): record_event never waits for the server,
Events about one object keep their order, a slow object holds up only its own shard, a full queue drops
(and counts), and close() drains, then cancels, leaving no task.

The server is a real HTTP server on loopback that stores what is POSTed and can hold the answer for the
Events of chosen objects: the API emulator answers at once, and these cases are about a server that
does not. Aggregation (count PATCH, 404 -> new series) is proven on the emulator in
test_kube_on_emulator.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from egress_kvm.kube.api import KubeApiClient
from egress_kvm.kube.recorder import EVENT_MESSAGE_MAX, SENDERS, EventQueue, PendingEvent, shard_of
from egress_kvm.metrics import REGISTRY
from egress_kvm.operator.flags import Options
from egress_kvm.operator.process import Operator

pytestmark = pytest.mark.timeout(30)


@dataclass
class EventsServer:
    """POST /api/v1/namespaces/{ns}/events: stored in arrival order; an Event whose involved object's
    name is in `held` waits until `release` is set."""

    received: list[tuple[str, str]] = field(default_factory=list)  # (object name, reason), as answered
    arrived: list[str] = field(default_factory=list)  # object names, as the requests came in
    held: set[str] = field(default_factory=set)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def handle(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        name = body["involvedObject"]["name"]
        async with self.changed:
            self.arrived.append(name)
            self.changed.notify_all()
        if name in self.held:
            await self.release.wait()
        async with self.changed:
            self.received.append((name, body["reason"]))
            self.changed.notify_all()
        return web.json_response(body, status=201)

    async def until(self, pred: Any) -> None:
        async with self.changed:
            await self.changed.wait_for(pred)


@contextlib.asynccontextmanager
async def events_server() -> AsyncIterator[tuple[EventsServer, ApiClient]]:
    server = EventsServer()
    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/events", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with ApiClient(Configuration(host=f"http://127.0.0.1:{port}")) as client:
            yield server, client
    finally:
        server.release.set()
        await runner.cleanup()


@contextlib.asynccontextmanager
async def one_sender_holding_p() -> AsyncIterator[tuple[EventsServer, KubeApiClient, float]]:
    """A client with one Event sender, against a server that holds the writes of Proxy "p" until
    `release`: (the server, the client, the backlog gauge before any Event)."""
    async with events_server() as (server, client):
        kube = KubeApiClient(client, event_senders=1)
        server.held.add("p")
        yield server, kube, queued()


def proxy(name: str) -> dict[str, Any]:
    return {"apiVersion": "egressproxies.io/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "1"}}


def names_in_distinct_shards(count: int, shards: int = SENDERS) -> list[str]:
    """Proxy names whose Events go to `count` different senders (shard_of is a pure function)."""
    picked: dict[int, str] = {}
    for i in range(1000):
        picked.setdefault(shard_of(f"uid-p{i}", shards), f"p{i}")
        if len(picked) == count:
            return list(picked.values())
    raise AssertionError("shard_of does not spread")


def dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("egress_kvm_kube_events_dropped_total", {"reason": reason}) or 0.0


def queued() -> float:
    """The backlog gauge: Events accepted and not yet written (process-wide, so tests compare to before)."""
    return REGISTRY.get_sample_value("egress_kvm_kube_events_queued") or 0.0


def senders_left() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("event sender") and not t.done()]


# --- pure parts ---------------------------------------------------------------------------------------

def test_shard_of_is_the_same_in_another_process() -> None:
    # crc32, so a restarted process (or another replica) shards the same way; the salted hash() would not.
    keys = [f"uid-{i}" for i in range(64)] + ["default/p", ""]
    code = ("import json, sys; from egress_kvm.kube.recorder import shard_of; "
            "print(json.dumps([shard_of(k, 8) for k in json.loads(sys.argv[1])]))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(keys)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True, timeout=30)
    assert json.loads(done.stdout) == [shard_of(k, 8) for k in keys]
    assert all(shard_of(k, 1) == 0 for k in keys)


def test_shard_of_spreads_a_fleet_over_every_sender() -> None:
    counts = [0] * SENDERS
    for i in range(1000):
        counts[shard_of(f"uid-{i}", SENDERS)] += 1
    assert min(counts) > 1000 / SENDERS / 2


@pytest.mark.parametrize(("message", "sent"), [
    ("short", "short"),
    ("x" * EVENT_MESSAGE_MAX, "x" * EVENT_MESSAGE_MAX),
    ("x" * (EVENT_MESSAGE_MAX + 1), "x" * (EVENT_MESSAGE_MAX - 3) + "..."),
])
def test_a_pending_event_caps_the_message(message: str, sent: str) -> None:
    assert PendingEvent.about(proxy("p"), type_="Normal", reason="R", message=message).message == sent


def test_a_pending_event_keys_an_object_without_uid_by_namespace_and_name() -> None:
    ev = PendingEvent.about({"metadata": {"name": "p"}}, type_="Normal", reason="R", message="m", at=5.0)
    assert (ev.object_key, ev.namespace, ev.kind, ev.api_version, ev.at) == (
        "default/p", "default", "Proxy", "egressproxies.io/v1alpha1", 5.0)
    assert ev.series_key == ("default/p", "Normal", "R", "m")


def test_an_event_queue_needs_a_sender_and_room_for_each() -> None:
    async def send(_ev: PendingEvent) -> None:
        return None

    with pytest.raises(ValueError, match="senders=0"):
        EventQueue(send, senders=0)
    with pytest.raises(ValueError, match="capacity=2"):
        EventQueue(send, senders=4, capacity=2)


# --- against a server ---------------------------------------------------------------------------------

async def test_record_event_returns_while_the_server_holds_the_write() -> None:
    async with events_server() as (server, client):
        kube = KubeApiClient(client)
        server.held.add("p")
        await kube.record_event(proxy("p"), type_="Normal", reason="Created", message="m")
        await kube.record_event(proxy("p"), type_="Normal", reason="Running", message="m")
        await server.until(lambda: server.arrived == ["p"])  # the first write is at the server, unanswered
        assert server.received == []
        server.release.set()
        await kube.flush_events()
        assert server.received == [("p", "Created"), ("p", "Running")]
        await kube.close()
    assert senders_left() == []


async def test_the_backlog_gauge_counts_events_until_their_write_ends() -> None:
    """Up with each accepted Event, down as each write ends (answered or failed), so an operator sees a
    backlog build (here: a server holding one object's writes) before the queue fills and drops."""
    async with one_sender_holding_p() as (server, kube, backlog):
        for reason in ("A", "B", "C"):
            await kube.record_event(proxy("p"), type_="Normal", reason=reason, message="m")
            assert queued() == backlog + ord(reason) - ord("A") + 1
        await server.until(lambda: server.arrived == ["p"])
        assert queued() == backlog + 3  # A is at the server, unanswered: not written yet
        server.release.set()
        await server.until(lambda: len(server.received) >= 1)
        await kube.flush_events()
        assert server.received == [("p", "A"), ("p", "B"), ("p", "C")] and queued() == backlog
        await kube.close()


async def test_a_failed_write_leaves_the_backlog() -> None:
    """A write that raises is logged, not retried: it is no longer queued."""
    failing = asyncio.Event()

    async def send(_ev: PendingEvent) -> None:
        await failing.wait()
        raise RuntimeError("the API server said no")

    events = EventQueue(send, senders=1)
    backlog = queued()
    assert events.submit(PendingEvent.about(proxy("p"), type_="Normal", reason="R", message="m"))
    assert queued() == backlog + 1
    failing.set()
    await events.flush()
    assert queued() == backlog
    await events.close()
    assert senders_left() == []


async def test_each_objects_events_keep_their_order_under_concurrency() -> None:
    async with events_server() as (server, client):
        kube = KubeApiClient(client)
        names = [f"p{i}" for i in range(24)]
        reasons = ["Created", "Running", "Ready", "Restarted", "Ready2"]

        async def reconcile(name: str) -> None:  # interleaved passes, as the workers make them
            for reason in reasons:
                await kube.record_event(proxy(name), type_="Normal", reason=reason, message=reason)
                await asyncio.sleep(0)

        await asyncio.gather(*(reconcile(n) for n in names))
        await kube.flush_events()
        for name in names:
            assert [r for n, r in server.received if n == name] == reasons, name
        assert len(server.received) == len(names) * len(reasons)
        await kube.close()


async def test_a_held_object_does_not_hold_up_an_object_of_another_shard() -> None:
    async with events_server() as (server, client):
        kube = KubeApiClient(client)
        slow, other = names_in_distinct_shards(2)
        server.held.add(slow)
        await kube.record_event(proxy(slow), type_="Normal", reason="Created", message="m")
        await server.until(lambda: slow in server.arrived)
        await kube.record_event(proxy(other), type_="Normal", reason="Created", message="m")
        await kube.record_event(proxy(other), type_="Normal", reason="Running", message="m")
        await server.until(lambda: len(server.received) == 2)
        assert server.received == [(other, "Created"), (other, "Running")]
        # The held object's next Event waits behind its first: its order is kept.
        await kube.record_event(proxy(slow), type_="Normal", reason="Running", message="m")
        server.release.set()
        await kube.flush_events()
        assert [r for n, r in server.received if n == slow] == ["Created", "Running"]
        await kube.close()


async def test_a_full_queue_drops_counts_and_never_raises() -> None:
    async with events_server() as (server, client):
        kube = KubeApiClient(client, event_senders=1, event_capacity=2)
        server.held.add("p")
        before, backlog = dropped("queue_full"), queued()
        # No await between these: the sender has not taken any yet, so two fit and two are dropped.
        for reason in ("A", "B", "C", "D"):
            await kube.record_event(proxy("p"), type_="Normal", reason=reason, message="m")
        assert dropped("queue_full") == before + 2
        assert queued() == backlog + 2  # a dropped Event is never in the backlog
        server.release.set()
        await kube.flush_events()
        assert server.received == [("p", "A"), ("p", "B")]
        assert queued() == backlog
        await kube.close()


async def test_close_drains_what_is_queued_and_leaves_no_task() -> None:
    async with events_server() as (server, client):
        kube = KubeApiClient(client)
        backlog = queued()
        for name in ("a", "b", "c"):
            await kube.record_event(proxy(name), type_="Normal", reason="Created", message="m")
        assert len(senders_left()) == SENDERS and queued() == backlog + 3
        await kube.close()
        assert sorted(server.received) == [("a", "Created"), ("b", "Created"), ("c", "Created")]
        assert senders_left() == [] and queued() == backlog
        # Closed: a late Event is dropped and counted, no sender starts again.
        before = dropped("stopped")
        await kube.record_event(proxy("a"), type_="Normal", reason="Late", message="m")
        assert dropped("stopped") == before + 1 and senders_left() == []


async def test_close_gives_up_on_a_held_server_after_its_bound_and_cancels() -> None:
    async with one_sender_holding_p() as (server, kube, backlog):
        for reason in ("A", "B", "C"):
            await kube.record_event(proxy("p"), type_="Normal", reason=reason, message="m")
        await server.until(lambda: server.arrived == ["p"])
        assert queued() == backlog + 3  # one being written (held), two waiting behind it
        before = dropped("stopped")
        await kube.close(timeout=0.1)
        assert senders_left() == []
        assert dropped("stopped") == before + 3  # one cut off mid-write, two never sent
        assert queued() == backlog
        assert server.received == []
        await kube.close()  # idempotent


async def test_a_kube_client_that_recorded_nothing_starts_no_task() -> None:
    async with events_server() as (_server, client):
        kube = KubeApiClient(client)
        assert senders_left() == []
        await kube.close()
        assert senders_left() == []


async def test_a_close_cancelled_while_draining_still_stops_the_senders() -> None:
    async with events_server() as (server, client):
        kube = KubeApiClient(client, event_senders=1)
        server.held.add("p")
        backlog = queued()
        for reason in ("A", "B"):
            await kube.record_event(proxy("p"), type_="Normal", reason=reason, message="m")
        await server.until(lambda: server.arrived == ["p"])
        before = dropped("stopped")
        closing = asyncio.create_task(kube.close(timeout=60))
        await asyncio.sleep(0)  # closing is now waiting for the held write
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert senders_left() == []
        # The write cut off and the Event behind it: dropped, and out of the backlog.
        assert dropped("stopped") == before + 2 and queued() == backlog


async def test_a_close_cancelled_while_its_senders_stop_still_counts_what_was_queued() -> None:
    """Cancelled after it has cancelled the senders, while one of them takes its time to stop (its write
    being cut off): the Event still queued behind it is counted as dropped and leaves the backlog all the
    same, not left in the gauge for good."""
    stopping, let_stop = asyncio.Event(), asyncio.Event()

    async def send(_ev: PendingEvent) -> None:
        try:
            await asyncio.Event().wait()  # a write the server never answers
        except asyncio.CancelledError:
            stopping.set()
            await let_stop.wait()  # cut off, but slow to wind down
            raise

    events = EventQueue(send, senders=1)
    backlog, before = queued(), dropped("stopped")
    for reason in ("A", "B"):
        assert events.submit(PendingEvent.about(proxy("p"), type_="Normal", reason=reason, message="m"))
    await asyncio.sleep(0)  # the sender has taken A: B waits behind it
    closing = asyncio.create_task(events.close(timeout=0))
    await stopping.wait()  # close has cancelled the sender and waits for it to end
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert senders_left() == []
    assert dropped("stopped") == before + 2 and queued() == backlog


# --- the operator's shutdown --------------------------------------------------------------------------

@pytest.mark.parametrize(("lost", "written"), [
    (False, [("p", "A"), ("p", "B")]),  # SIGTERM: the queue is written (within its bound), then no sender
    (True, []),  # lost lease: a successor may be writing about the same Proxies; stop at once, drop the rest
])
async def test_the_operators_shutdown_stops_the_senders_draining_only_when_it_still_leads(
        lost: bool, written: list[tuple[str, str]], tmp_path: Any) -> None:
    async with events_server() as (server, client):
        op = Operator(Options(providers_config=str(tmp_path / "unused.yaml")))
        op.kube = KubeApiClient(client, event_senders=1)
        # No await that yields between these and the shutdown: both Events are still queued when it starts.
        backlog = queued()
        for reason in ("A", "B"):
            await op.kube.record_event(proxy("p"), type_="Normal", reason=reason, message="m")
        before = dropped("stopped")
        await op._shutdown(lost=lost)
        assert senders_left() == []
        assert server.received == written
        assert dropped("stopped") == before + 2 - len(written)
        assert queued() == backlog


def test_the_drop_counter_and_the_backlog_gauge_show_zero_in_a_fresh_process() -> None:
    # A series that appears only with the first drop makes `rate(...) > 0` alerts blind until then.
    code = ("from egress_kvm.metrics import REGISTRY; print([REGISTRY.get_sample_value("
            "'egress_kvm_kube_events_dropped_total', {'reason': r}) for r in ('queue_full', 'stopped')], "
            "REGISTRY.get_sample_value('egress_kvm_kube_events_queued'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=30)
    assert done.stdout.strip() == "[0.0, 0.0] 0.0"
