"""The watch stream: replay from a resourceVersion, then live events, bookmarks and the 410 answer.

A watch from a version older than the store's compacted horizon is answered, as the real server
answers it, with HTTP 200 and one ERROR event whose object is a Status with code 410 (reason Expired),
then the end of the stream. Clients must relist. Without a resourceVersion (or "0") the stream starts
with a synthetic ADDED per existing object. Selectors turn a MODIFIED that enters or leaves the
selection into ADDED or DELETED, as the real watch cache does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from testbed.emulator import errors, tables
from testbed.emulator.api import Api
from testbed.emulator.resources import ResourceType
from testbed.emulator.store import Event, clone

Obj = dict[str, Any]
DEFAULT_TIMEOUT = 1800.0
POLL = 1.0  # how often an idle watch checks for a gone client or the deadline
_RENDERED_MAX = 512


class _Rendered:
    """The encoded line of a recent event, per (event, watch type, resource type): every watcher of a
    type is sent the same bytes, so an event is encoded once, not once per watcher (the fleet has two
    watches on Proxies). Bounded: watchers far behind encode again. Keyed by the event and type objects
    themselves (identity), so one cache serves any number of emulators in a process."""

    def __init__(self) -> None:
        self._lines: OrderedDict[tuple[int, str, int], tuple[Event, ResourceType, bytes]] = OrderedDict()

    def get(self, ev: Event, kind: str, rt: ResourceType) -> bytes | None:
        hit = self._lines.get((id(ev), kind, id(rt)))
        return hit[2] if hit is not None and hit[0] is ev and hit[1] is rt else None

    def put(self, ev: Event, kind: str, rt: ResourceType, line: bytes) -> None:
        self._lines[(id(ev), kind, id(rt))] = (ev, rt, line)
        if len(self._lines) > _RENDERED_MAX:
            self._lines.popitem(last=False)


_rendered = _Rendered()


@dataclass
class WatchRequest:
    rt: ResourceType
    namespace: str | None
    matches: Callable[[Obj], bool]
    resource_version: str
    timeout: float
    bookmarks: bool
    send_initial_events: bool
    table: bool
    include_object: str


def _in_scope(req: WatchRequest, obj: Obj | None) -> bool:
    if obj is None:
        return False
    if req.namespace is not None and (obj.get("metadata") or {}).get("namespace") != req.namespace:
        return False
    return req.matches(obj)


def translate(req: WatchRequest, ev: Event) -> tuple[str, Obj] | None:
    now_in, was_in = _in_scope(req, ev.obj), _in_scope(req, ev.old)
    if ev.type == "ADDED":
        return ("ADDED", ev.obj) if now_in else None
    if ev.type == "DELETED":
        return ("DELETED", ev.obj) if (was_in or now_in) else None
    if now_in and was_in:
        return ("MODIFIED", ev.obj)
    if now_in:
        return ("ADDED", ev.obj)
    if was_in:
        return ("DELETED", ev.obj)
    return None


async def serve(
    request: web.Request,
    api: Api,
    req: WatchRequest,
    *,
    bookmark_interval: float,
    stalled: Callable[[], bool] = lambda: False,
) -> web.StreamResponse:
    """Serve one watch. While `stalled()` is true the stream stays open but sends nothing (no events,
    no bookmarks): a test hook for clients that must notice a silent stream."""
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
    )
    resp.enable_chunked_encoding()
    store = api.store
    first_table = True

    def render(kind: str, obj: Obj) -> bytes:
        nonlocal first_table
        rt = req.rt
        if not req.table:
            # the object's text as a GET or the write's answer sends it (encoded once for all of them):
            # what json.dumps of {"type": kind, "object": served} writes, compact
            return f'{{"type":{json.dumps(kind)},"object":{api.encoded(rt, obj)}}}\n'.encode()
        served = tables.table(
            req.rt,
            [api.served(rt, clone(obj))],  # events share the stored dicts: default a copy
            resource_version=obj["metadata"]["resourceVersion"],
            include=req.include_object,
            with_columns=first_table,
        )
        first_table = False
        return (json.dumps({"type": kind, "object": served}, separators=(",", ":")) + "\n").encode()

    def render_event(ev: Event, kind: str, obj: Obj) -> bytes:
        if req.table:
            return render(kind, obj)
        line = _rendered.get(ev, kind, req.rt)
        if line is None:
            line = render(kind, obj)
            _rendered.put(ev, kind, req.rt, line)
        return line

    def bookmark(initial_end: bool = False) -> bytes:
        meta: Obj = {"resourceVersion": str(store.resource_version)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": req.rt.kind, "apiVersion": req.rt.api_version, "metadata": meta}
        return (json.dumps({"type": "BOOKMARK", "object": obj}, separators=(",", ":")) + "\n").encode()

    rv = req.resource_version
    initial: list[bytes] = []
    if rv in ("", "0") or req.send_initial_events:
        for obj in store.peek_list(req.rt.key, req.namespace if req.rt.namespaced else None):
            if req.matches(obj):
                initial.append(render("ADDED", obj))
        since = store.resource_version
        if req.send_initial_events:
            initial.append(bookmark(initial_end=True))
    else:
        if not rv.isdigit():
            raise errors.bad_request(f"invalid resource version: {rv!r}")
        since = int(rv)
        if store.too_old(since):
            await resp.prepare(request)
            status = errors.gone(f"too old resource version: {since} ({store.horizon + 1})").status()
            await resp.write((json.dumps({"type": "ERROR", "object": status}) + "\n").encode())
            await resp.write_eof()
            return resp
    sub = store.subscribe(req.rt.key, since=since)  # no await since the listing: nothing slips between
    try:
        await resp.prepare(request)
        for line in initial:
            await resp.write(line)
        deadline = time.monotonic() + req.timeout
        next_bookmark = time.monotonic() + bookmark_interval
        held: list[Event] = []
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            if stalled():
                if request.transport is None or request.transport.is_closing():
                    break
                await asyncio.sleep(0.05)
                next_bookmark = time.monotonic() + bookmark_interval
                continue
            while held:
                late = held.pop(0)
                out = translate(req, late)
                if out is not None:
                    await resp.write(render_event(late, *out))
            if req.bookmarks and now >= next_bookmark:
                await resp.write(bookmark())
                next_bookmark = now + bookmark_interval
            wait = min(deadline - now, POLL, (next_bookmark - now) if req.bookmarks else POLL)
            try:
                ev = await asyncio.wait_for(sub.queue.get(), timeout=max(wait, 0.01))
            except TimeoutError:
                if request.transport is None or request.transport.is_closing():
                    break
                continue
            if ev is None:  # server shutting down
                break
            if stalled():
                held.append(ev)  # arrived as the stall began: deliver after it
                continue
            out = translate(req, ev)
            if out is not None:
                await resp.write(render_event(ev, *out))
        await resp.write_eof()
    except ConnectionError:
        pass  # the client went away
    finally:
        store.unsubscribe(sub)
    return resp
