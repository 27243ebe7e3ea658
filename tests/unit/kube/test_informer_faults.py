"""ProxyInformer against a scripted server: 410 (both forms), silence, broken streams, huge lines, bugs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from egress_kvm.backoff import Backoff
from egress_kvm.kube.informer import ProxyInformer

from .kube_scripted_api import ScriptedApi, WatchStream, proxy, status_plan

pytestmark = pytest.mark.timeout(30)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.changed = asyncio.Event()

    def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append((kind, obj["metadata"]["name"], obj["metadata"].get("resourceVersion", "")))
        self.changed.set()

    async def wait_for(self, pred: Callable[[], bool], within: float = 10) -> None:
        async with asyncio.timeout(within):
            while not pred():
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def informer_on(api: ScriptedApi,
                      **kw: Any) -> AsyncIterator[tuple[ProxyInformer, Recorder, asyncio.Task]]:
    rec = Recorder()
    async with api.running(), ApiClient(Configuration(host=api.url)) as client:
        kw.setdefault("backoff", Backoff(base=0.05, cap=0.2, jitter=0))
        inf = ProxyInformer(client, namespace=None, on_event=rec, **kw)
        task = asyncio.create_task(inf.run())
        try:
            yield inf, rec, task
        finally:
            inf.stop()
            await asyncio.wait_for(task, 5)
            assert inf.healthy()


async def until(pred: Callable[[], bool], within: float = 10) -> None:
    """Poll a condition on state the test cannot subscribe to (the scripted server's counters)."""
    async with asyncio.timeout(within):
        while True:
            if pred():
                return
            await asyncio.sleep(0.01)


async def test_list_then_watch_events_update_the_cache_in_order() -> None:
    async def plan(s: WatchStream) -> None:
        await s.send("ADDED", proxy("b", 101))
        await s.send("MODIFIED", proxy("a", 102, port=8080))
        await s.send("DELETED", proxy("b", 103))
        await asyncio.sleep(3600)

    api = ScriptedApi(items=[proxy("a", 90)], plans=[plan])
    async with informer_on(api) as (inf, rec, _):
        await rec.wait_for(lambda: len(rec.events) == 4)
        assert rec.events == [("ADDED", "a", "90"), ("ADDED", "b", "101"), ("MODIFIED", "a", "102"),
                              ("DELETED", "b", "103")]
        assert inf.has_synced()
        assert inf.keys() == [("default", "a")]
        assert inf.get(("default", "a"))["spec"]["port"] == 8080
        assert inf.resource_version == "103"
        q = api.watch_queries[0]
        assert q["resourceVersion"] == "100" and q["allowWatchBookmarks"] == "true"


@pytest.mark.parametrize("form", ["event", "http"])
async def test_410_relists_and_delivers_only_what_changed(form: str) -> None:
    async def first(s: WatchStream) -> None:
        await s.send("ADDED", proxy("c", 101))
        await s.gone()

    plans = [first] if form == "event" else [status_plan(410)]
    # While the informer is away: a changed, b deleted, c (seen on the watch) unchanged, d added.
    api = ScriptedApi(items=[proxy("a", 90), proxy("b", 91)], plans=plans,
                      later_lists=[([proxy("a", 150, port=1), proxy("c", 101), proxy("d", 151)], 160)])
    async with informer_on(api) as (inf, rec, _):
        await until(lambda: api.lists >= 2 and len(api.watch_queries) >= 2)
        await rec.wait_for(lambda: ("ADDED", "d", "151") in rec.events)
        initial = [("ADDED", "a", "90"), ("ADDED", "b", "91")]
        during = [("ADDED", "c", "101")] if form == "event" else []
        relist = sorted([("MODIFIED", "a", "150"), ("DELETED", "b", "91"), ("ADDED", "d", "151")]
                        + ([] if form == "event" else [("ADDED", "c", "101")]))
        assert rec.events[:2] == initial
        assert rec.events[2:2 + len(during)] == during
        assert sorted(rec.events[2 + len(during):]) == relist  # nothing twice, nothing lost
        assert sorted(inf.keys()) == [("default", "a"), ("default", "c"), ("default", "d")]
        assert api.watch_queries[-1]["resourceVersion"] == "160"


async def test_a_silent_stream_is_dropped_and_watched_again_from_the_last_version() -> None:
    async def silent_after_one(s: WatchStream) -> None:
        await s.send("ADDED", proxy("x", 120))
        await asyncio.sleep(3600)  # open, alive at TCP level, says nothing

    async def second(s: WatchStream) -> None:
        await s.send("MODIFIED", proxy("x", 130))
        await asyncio.sleep(3600)

    api = ScriptedApi(plans=[silent_after_one, second])
    async with informer_on(api, stall_timeout=0.5) as (_inf, rec, _):
        await rec.wait_for(lambda: ("MODIFIED", "x", "130") in rec.events)
        assert [q["resourceVersion"] for q in api.watch_queries[:2]] == ["100", "120"]
        assert api.lists == 1  # a reconnect is not a relist


@pytest.mark.parametrize("ends", ["goes silent", "is closed"])
async def test_the_cache_is_current_only_while_a_stream_is_open_and_heard_from(ends: str) -> None:
    """A routine reconcile trusts the cache only when current() (controller/cached.py): once the stream
    is dropped as silent or closed, and the reconnect is refused (the informer backing off), the cache
    no longer follows the server, though the process stays healthy."""

    async def one_event(s: WatchStream) -> None:
        await s.send("ADDED", proxy("x", 120))
        if ends == "goes silent":
            await asyncio.sleep(3600)  # open, alive at TCP level, says nothing

    api = ScriptedApi(plans=[one_event, status_plan(500)])
    async with informer_on(api, stall_timeout=2.0,
                           backoff=Backoff(base=3600, cap=3600, jitter=0)) as (inf, rec, _):
        await rec.wait_for(lambda: ("ADDED", "x", "120") in rec.events)
        assert inf.current()
        await until(lambda: len(api.watch_queries) == 2)  # the first stream is over; this one is refused
        assert not inf.current() and inf.healthy() and inf.has_synced()
        assert inf.get(("default", "x")) is not None  # still cached, just not trusted as current


async def test_bookmarks_move_the_resume_point_and_keep_the_stream_alive() -> None:
    async def bookmarks(s: WatchStream) -> None:
        for rv in (110, 120, 130, 140, 150, 160):
            await asyncio.sleep(0.25)
            await s.bookmark(rv)
        # then end the stream as a server does at timeoutSeconds

    api = ScriptedApi(plans=[bookmarks])
    async with informer_on(api, stall_timeout=1.0) as (_inf, rec, _):
        await until(lambda: len(api.watch_queries) >= 2)
        # 1.5 s of stream with a bookmark every 0.25 s never hit the 1 s stall limit: one stream, then
        # a new one from the last bookmark.
        assert [q["resourceVersion"] for q in api.watch_queries[:2]] == ["100", "160"]
        assert rec.events == []


async def test_a_line_of_megabytes_written_in_pieces_arrives_whole() -> None:
    big = proxy("big", 101)
    big["metadata"]["annotations"] = {"blob": "y" * (3 * 1024 * 1024)}

    async def plan(s: WatchStream) -> None:
        import json

        data = json.dumps({"type": "ADDED", "object": big}).encode() + b"\n"
        for i in range(0, len(data), 100_000):
            await s.send_raw(data[i:i + 100_000])
        await s.send("ADDED", proxy("small", 102))
        await asyncio.sleep(3600)

    api = ScriptedApi(plans=[plan])
    async with informer_on(api) as (inf, rec, _):
        await rec.wait_for(lambda: len(rec.events) == 2)
        assert [e[1] for e in rec.events] == ["big", "small"]
        assert len(inf.get(("default", "big"))["metadata"]["annotations"]["blob"]) == 3 * 1024 * 1024


async def test_broken_streams_and_server_errors_are_retried_with_backoff() -> None:
    async def cut_mid_line(s: WatchStream) -> None:
        await s.send_raw(b'{"type":"ADDED","object":{"metadata":')
        s.response.force_close()
        raise ConnectionResetError

    async def good(s: WatchStream) -> None:
        await s.send("ADDED", proxy("ok", 105))
        await asyncio.sleep(3600)

    api = ScriptedApi(items=[], plans=[cut_mid_line, status_plan(500), good], list_status=[503])
    async with informer_on(api) as (inf, rec, _):
        await rec.wait_for(lambda: ("ADDED", "ok", "105") in rec.events)
        assert api.lists == 2  # the 503 list was retried
        assert len(api.watch_queries) == 3
        assert inf.healthy()
        assert rec.events == [("ADDED", "ok", "105")]  # the half line never became an event


async def test_a_handler_that_raises_does_not_stop_the_watch() -> None:
    seen: list[str] = []

    def handler(kind: str, obj: dict[str, Any]) -> None:
        seen.append(obj["metadata"]["name"])
        if obj["metadata"]["name"] == "bad":
            raise RuntimeError("controller bug")

    async def plan(s: WatchStream) -> None:
        await s.send("ADDED", proxy("bad", 101))
        await s.send("ADDED", proxy("good", 102))
        await asyncio.sleep(3600)

    api = ScriptedApi(plans=[plan])
    async with api.running(), ApiClient(Configuration(host=api.url)) as client:
        inf = ProxyInformer(client, namespace=None, on_event=handler)
        task = asyncio.create_task(inf.run())
        await until(lambda: seen == ["bad", "good"])
        assert inf.healthy() and sorted(inf.keys()) == [("default", "bad"), ("default", "good")]
        inf.stop()
        await asyncio.wait_for(task, 5)


async def test_an_unexpected_failure_ends_run_and_turns_health_off() -> None:
    api = ScriptedApi(items=[{"metadata": {"namespace": "default"}}])  # no name: key_of fails (a bug)
    async with api.running(), ApiClient(Configuration(host=api.url)) as client:
        inf = ProxyInformer(client, namespace=None, on_event=lambda k, o: None)
        assert inf.healthy()
        with pytest.raises(KeyError):
            await asyncio.wait_for(inf.run(), 5)
        assert not inf.healthy()


async def test_namespace_scope_uses_the_namespaced_path() -> None:
    async def plan(s: WatchStream) -> None:
        await s.send("ADDED", proxy("n", 101, namespace="team-a"))
        await asyncio.sleep(3600)

    api = ScriptedApi(plans=[plan])
    async with api.running(), ApiClient(Configuration(host=api.url)) as client:
        rec = Recorder()
        inf = ProxyInformer(client, namespace="team-a", on_event=rec)
        task = asyncio.create_task(inf.run())
        await rec.wait_for(lambda: len(rec.events) == 1)
        assert inf.keys() == [("team-a", "n")]
        inf.stop()
        await asyncio.wait_for(task, 5)


async def test_a_first_410_relists_at_once_but_a_410_loop_backs_off() -> None:
    class Counting(Backoff):
        calls = 0

        def next(self) -> float:
            Counting.calls += 1
            return super().next()

    # Every watch is refused with 410, even from the version the fresh list just returned.
    api = ScriptedApi(plans=[status_plan(410) for _ in range(4)])
    async with informer_on(api, backoff=Counting(base=0.01, cap=0.05, jitter=0)) as (inf, _rec, _):
        await until(lambda: len(api.watch_queries) >= 4)
        # First 410: relist immediately (no backoff); each later one in a row: backoff.
        assert api.lists >= 4
        assert Counting.calls >= 2
        assert Counting.calls <= len(api.watch_queries) - 1
        assert inf.healthy()
