"""The Proxy informer: a hand-rolled list+watch that keeps a cache and tells the controller what changed.

Shape (client-go's reflector, reduced to what one resource needs):
- List, store every object, remember the list's resourceVersion; then watch from that version with
  bookmarks, applying each event to the cache before handing it on, so a handler that reads the store
  sees at least the state the event describes.
- A watch from a version the server no longer has is answered with 410 Gone, either as the HTTP status
  or (as the real server does once the stream is open) as an ERROR event whose Status has code 410.
  Both mean: relist. A relist is diffed against the cache, so the handler sees ADDED/MODIFIED/DELETED
  only for what actually changed while we were not watching, never a duplicate of what it already has.
- A stream can stop delivering without closing (a half-open TCP connection through a NAT or an API
  server failover): if neither an event nor a bookmark arrives for `stall_timeout` seconds, drop it and
  watch again from the last version seen. A stream that breaks or is refused reconnects with jittered
  exponential backoff, reset once a stream is healthy again. Only while a stream is open and heard from
  is the cache `current()`: a routine reconcile trusts it instead of reading fresh only then.
- Lines are split by hand from raw chunks (see lines.py): one long line must not wedge the watch.
- Errors we expect from a network and a server are retried forever; anything else is a bug and ends
  run() with the exception, and from then on healthy() is False, so /healthz fails and the kubelet
  restarts the process instead of leaving it running with a cache that no longer moves.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from ..backoff import Backoff
from ..log import Logger, get_logger
from .interfaces import GROUP, KIND, PLURAL, VERSION, Key, Obj, key_of
from .k8s import ApiClient, ApiException, CustomObjectsApi
from .lines import LineSplitter
from .rest import KubeApiError, from_api_exception
from .trim import trimmed

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
RECOVERABLE = (KubeApiError, aiohttp.ClientError, TimeoutError, OSError, ValueError)


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): relist."""

    def __init__(self, *, progressed: bool) -> None:
        super().__init__("resourceVersion expired (410 Gone)")
        self.progressed = progressed


class _Stalled(Exception):
    """Neither an event nor a bookmark within stall_timeout."""


class ProxyInformer:
    """ProxyStore for the controller, fed by list+watch. Run `run()` as a task; `stop()` ends it."""

    def __init__(self, api_client: ApiClient, *, namespace: str | None,
                 on_event: Callable[[str, Obj], Any],
                 logger: Logger | None = None,
                 watch_timeout: float = 300.0,
                 stall_timeout: float = 120.0,
                 request_timeout: float = 30.0,
                 healthy_stream_after: float = 10.0,
                 backoff: Backoff | None = None, page_size: int = 100) -> None:
        self._custom = CustomObjectsApi(api_client)
        self.namespace = namespace or None
        self._on_event = on_event
        self._log = (logger or get_logger("kube")).with_name("informer").with_values(
            resource=f"{PLURAL}.{GROUP}", namespace=self.namespace or "")
        self.watch_timeout = watch_timeout
        self.stall_timeout = stall_timeout
        self.request_timeout = request_timeout
        self.healthy_stream_after = healthy_stream_after
        self.page_size = page_size
        self._backoff = backoff or Backoff(0.5, 30.0, jitter=0.5)
        self._store: dict[Key, Obj] = {}
        self._rv: str | None = None
        self._synced = False
        self._stopping = False
        self._task: asyncio.Task[Any] | None = None
        self._died: BaseException | None = None
        # time.monotonic() the open watch stream was last heard from (opened, an event, a bookmark); None
        # while no stream is open (listing, reconnecting, backing off after errors): see current().
        self._heard: float | None = None
        # Counters for tests and the debug log; not a substitute for the cache's content.
        self.lists = 0
        self.watches = 0

    # --- ProxyStore ----------------------------------------------------------------------------------

    def get(self, key: Key) -> Obj | None:
        """The cached object (shared: do not mutate it)."""
        return self._store.get(key)

    def keys(self) -> list[Key]:
        return list(self._store)

    def has_synced(self) -> bool:
        return self._synced

    def healthy(self) -> bool:
        """False once run() ended without stop(): the cache would never move again."""
        return self._died is None

    def current(self) -> bool:
        """Whether the cache follows the server now: listed, a watch stream open and heard from within
        stall_timeout, run() alive. Between streams (a silent one dropped, reconnects failing and backing
        off, a relist) the cache may lag by any amount while healthy() stays True, so a routine reconcile
        reads fresh then instead of trusting it (controller/cached.py)."""
        return (self._died is None and self._synced and self._heard is not None
                and time.monotonic() - self._heard < self.stall_timeout)

    @property
    def resource_version(self) -> str | None:
        return self._rv

    # --- lifecycle -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """List+watch until stop(). May be run again after stop(): it resumes from the last version
        seen (or relists, diffing against the cache, if that version has been compacted away)."""
        self._task = asyncio.current_task()
        self._stopping = False
        try:
            await self._loop()
        except asyncio.CancelledError:
            if self._stopping:
                return
            raise
        except BaseException as exc:
            self._died = exc
            self._log.error(exc, "informer died; the process reports unhealthy from now on")
            raise

    def stop(self) -> None:
        self._stopping = True
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _loop(self) -> None:
        expired_in_a_row = 0
        while not self._stopping:
            progressed = False
            try:
                if self._rv is None:
                    await self._relist()
                progressed = await self._watch_once()
                expired_in_a_row = 0
                self._log.v(1).info("watch stream closed by the server, watching again",
                                    resourceVersion=self._rv)
            except _Expired as exc:
                self._log.info("watch resourceVersion expired (410 Gone), relisting",
                               resourceVersion=self._rv)
                self._rv = None
                # Relist at once after a 410 (the normal case after a long disconnect); only a server
                # answering 410 to the version its own list just gave backs off.
                expired_in_a_row = 0 if exc.progressed else expired_in_a_row + 1
                progressed = exc.progressed or expired_in_a_row == 1
            except _Stalled:
                self._log.info("watch stream silent, reconnecting", seconds=self.stall_timeout,
                               resourceVersion=self._rv)
                progressed = True  # it did wait stall_timeout: reconnecting at once cannot spin
            except RECOVERABLE as exc:
                self._log.error(exc, "list/watch failed, retrying", resourceVersion=self._rv)
            if progressed:
                self._backoff.reset()
            else:
                await asyncio.sleep(self._backoff.next())

    # --- list ----------------------------------------------------------------------------------------

    async def _relist(self) -> None:
        # In pages of `page_size`, each trimmed before the next is read: one response holding every
        # Proxy (64 KiB of user-data each) would cost more memory than the cache itself.
        fresh: dict[Key, Obj] = {}
        token: str | None = None
        rv = ""
        while True:
            page: dict[str, Any] = {"limit": self.page_size, "_request_timeout": self.request_timeout}
            if token:
                page["_continue"] = token
            try:
                if self.namespace:
                    result = await self._custom.list_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, **page)
                else:
                    result = await self._custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **page)
            except ApiException as exc:
                raise from_api_exception(exc) from None
            for item in result.get("items") or []:
                item.setdefault("apiVersion", f"{GROUP}/{VERSION}")
                item.setdefault("kind", KIND)
                fresh[key_of(item)] = trimmed(item)  # the cache keeps what the controller reads (trim.py)
            meta = result.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            del result
            if not token:
                break
        self.lists += 1
        if not rv:
            raise KubeApiError(0, "NoResourceVersion", "list answered without metadata.resourceVersion")
        old, first = self._store, not self._synced
        self._store = fresh
        self._rv = rv
        self._synced = True
        changes: list[tuple[str, Obj]] = []
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                changes.append((ADDED, obj))
            elif _rv_of(before) != _rv_of(obj):
                changes.append((MODIFIED, obj))
        changes.extend((DELETED, obj) for key, obj in old.items() if key not in fresh)
        self._log.v(1).info("listed", count=len(fresh), changes=len(changes), resourceVersion=rv,
                            initial=first)
        for kind, obj in changes:
            await self._deliver(kind, obj)

    # --- watch ---------------------------------------------------------------------------------------

    async def _watch_once(self) -> bool:
        """One watch request, consumed until the server closes it. True if the stream was healthy
        (delivered something or stayed open a while), so the next one may start without delay."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        timeout = aiohttp.ClientTimeout(connect=self.request_timeout, sock_connect=self.request_timeout)
        # Booleans as Go spells them: kubernetes-asyncio would send Python's `True`, which the real
        # server accepts but a strict parser (or a proxy in front of the server) may not.
        kwargs: dict[str, Any] = dict(
            watch="true", resource_version=self._rv, allow_watch_bookmarks="true",
            timeout_seconds=max(1, int(self.watch_timeout)), _preload_content=False,
            _request_timeout=timeout)
        try:
            if self.namespace:
                resp = await self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, **kwargs)
            else:
                resp = await self._custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kwargs)
        except ApiException as exc:
            raise from_api_exception(exc) from None
        self.watches += 1
        progressed = False
        try:
            if resp.status == 410:
                raise _Expired(progressed=False)
            if resp.status != 200:
                body = await resp.read()
                exc = ApiException(status=resp.status, reason=resp.reason)
                exc.body = body
                raise from_api_exception(exc)
            self._log.v(1).info("watching", resourceVersion=self._rv)
            self._heard = time.monotonic()
            splitter = LineSplitter()
            deadline = loop.time() + self.stall_timeout
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise _Stalled()
                try:
                    chunk = await asyncio.wait_for(resp.content.readany(), remaining)
                except TimeoutError:
                    raise _Stalled() from None
                if not chunk:
                    return progressed or loop.time() - started >= self.healthy_stream_after
                for line in splitter.feed(chunk):
                    try:
                        await self._handle(json.loads(line))
                    except _Expired:
                        raise _Expired(progressed=progressed) from None
                    progressed = True
                    deadline = loop.time() + self.stall_timeout
                    self._heard = time.monotonic()
        finally:
            self._heard = None
            resp.close()

    async def _handle(self, event: Any) -> None:
        if not isinstance(event, dict):
            raise ValueError(f"watch line is not an object: {type(event).__name__}")
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise ValueError(f"watch event {kind!r} without an object")
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise _Expired(progressed=False)
            raise KubeApiError(int(code or 0), str(obj.get("reason", "")), str(obj.get("message", "")))
        rv = _rv_of(obj)
        if kind == "BOOKMARK":
            if rv:
                self._rv = rv
            return
        if kind not in (ADDED, MODIFIED, DELETED):
            self._log.info("ignoring unknown watch event type", type=kind)
            return
        obj.setdefault("apiVersion", f"{GROUP}/{VERSION}")
        obj.setdefault("kind", KIND)
        obj = trimmed(obj)
        key = key_of(obj)
        if rv:
            self._rv = rv
        if kind == DELETED:
            if self._store.pop(key, None) is None:
                return  # we never had it (deleted before our list saw it): nothing to forget
        else:
            before = self._store.get(key)
            self._store[key] = obj
            if before is not None and rv and _rv_of(before) == rv:
                return  # already delivered (same version): do not make the controller do it twice
            if before is not None:
                kind = MODIFIED
        await self._deliver(kind, obj)

    async def _deliver(self, kind: str, obj: Obj) -> None:
        try:
            result = self._on_event(kind, obj)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # a handler bug must not stop the cache from following the server
            self._log.error(exc, "event handler failed", type=kind, name=obj["metadata"].get("name"))


def _rv_of(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion") or "")
