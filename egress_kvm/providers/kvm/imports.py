"""Background image imports: a base image is fetched by one task per host+image, never by a reconcile.

A create that finds its base missing starts the import (or joins the one running) and is answered at
once with InProgress, whose `wake` completes when the import ends; the controller then enqueues the Proxy.
So a slow or hostile URL holds at most an import slot, never a reconcile worker: deletions and Proxies
on cached images go on meanwhile. At most `MAX_CONCURRENT_IMPORTS` imports run at a time in the process
(the rest queue for a slot, with "queued" in their status); each is bounded by the limits in images.py.

Each import knows who waits on it: the instance whose create asked for it, under its owner (the Proxy's
uid). An owner asking for another image (its Proxy moved to another image, or the image's url/sha256
changed) leaves the import it waited on, and a delete of the instance leaves it too. An import nobody
waits on any more is cancelled at once: its partial volume is deleted (images.py) and its slot freed.

An import that failed is remembered for `FAILURE_HOLD` seconds (and until someone was told): every Proxy
waiting on it gets the error (so status says why, and its own backoff grows), and the next attempt after
that starts a fresh import. So a failing URL is tried at most once per hold, however many Proxies wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from egress_kvm.log import Logger, get_logger
from egress_kvm.providers.base import (
    InProgress,
    PermanentError,
    ProgressCallback,
    ProviderError,
    QuotaError,
    TransientError,
)

from .images import BaseImage

MAX_CONCURRENT_IMPORTS = 2
FAILURE_HOLD = 10.0

_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def process_slots() -> asyncio.Semaphore:
    """The process-wide cap on concurrent imports (one semaphore per event loop), shared by every
    provider, also across providers-file reloads."""
    loop = asyncio.get_running_loop()
    sem = _slots.get(loop)
    if sem is None:
        sem = _slots[loop] = asyncio.Semaphore(MAX_CONCURRENT_IMPORTS)
    return sem


@dataclass
class _Import:
    label: str
    task: asyncio.Task[BaseImage] | None = None
    waiters: dict[str, str] = field(default_factory=dict)  # owner (Proxy uid, else instance) -> instance
    cancelled: bool = False  # nobody waited any more: its end is no failure to tell anyone
    wake: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    progress: str = "queued for an import slot"


@dataclass
class _Failure:
    at: float
    error: ProviderError
    reported: bool = False


class Importer:
    def __init__(self, *, slots: Callable[[], asyncio.Semaphore] = process_slots,
                 clock: Callable[[], float] = time.monotonic, failure_hold: float = FAILURE_HOLD,
                 log: Logger | None = None) -> None:
        self._slots = slots
        self._clock = clock
        self._failure_hold = failure_hold
        self._log = log or get_logger("kvm")
        self._running: dict[Hashable, _Import] = {}
        self._failed: dict[Hashable, _Failure] = {}
        self._cancelled: set[asyncio.Task[BaseImage]] = set()  # still cleaning up: close() waits for them

    def running(self) -> list[str]:
        return [imp.label for imp in self._running.values()]

    def running_keys(self) -> list[Any]:
        return list(self._running)

    def waiting(self, key: Hashable) -> list[str]:
        """The instances waiting on the import of `key` (none when it does not run)."""
        imp = self._running.get(key)
        return sorted(imp.waiters.values()) if imp is not None else []

    async def base(self, key: Hashable, *, label: str, instance: str, owner: str = "",
                   cached: Callable[[], Awaitable[BaseImage | None]],
                   fetch: Callable[[ProgressCallback], Awaitable[BaseImage]]) -> BaseImage:
        """The cached base, or InProgress while its import runs (started here if need be) with
        `instance` (of `owner`) among its waiters; an import `owner` waited on for another key is left."""
        who = owner or instance
        self._leave(lambda o, _i: o == who, keep=key)
        imp = self._running.get(key)
        if imp is None:
            failure = self._failed.get(key)
            if failure is not None:
                if not failure.reported or self._clock() - failure.at < self._failure_hold:
                    failure.reported = True
                    raise _copy(failure.error)
                del self._failed[key]
            base = await cached()
            if base is not None:
                return base
            imp = self._running.get(key)  # another reconcile may have started it during that await
            if imp is None:
                imp = self._start(key, label=label, fetch=fetch)
        imp.waiters[who] = instance
        raise InProgress(f"waiting for image {label}: {imp.progress}", wake=imp.wake)

    def leave(self, instance: str) -> None:
        """`instance` waits no more (it is being deleted); an import left without waiters is cancelled."""
        self._leave(lambda _o, i: i == instance)

    def _leave(self, match: Callable[[str, str], bool], *, keep: Hashable | None = None) -> None:
        for key, imp in list(self._running.items()):
            if key == keep:
                continue
            gone = [o for o, i in imp.waiters.items() if match(o, i)]
            for o in gone:
                del imp.waiters[o]
            if gone and not imp.waiters:
                self._cancel(key, imp)

    def _cancel(self, key: Hashable, imp: _Import) -> None:
        """Nobody waits: stop it (images.py deletes what it wrote). It leaves `_running` now, so a create
        asking again starts afresh, queued behind this one's clean-up by the host's image lock."""
        self._log.info("image import cancelled: nobody waits for it any more", image=imp.label,
                       progress=imp.progress)
        del self._running[key]
        imp.cancelled = True
        if imp.task is not None:
            imp.task.cancel()
            self._cancelled.add(imp.task)
            imp.task.add_done_callback(self._cancelled.discard)
        if not imp.wake.done():
            imp.wake.set_result(None)

    def _start(self, key: Hashable, *, label: str,
               fetch: Callable[[ProgressCallback], Awaitable[BaseImage]]) -> _Import:
        imp = _Import(label=label)

        async def progress(text: str) -> None:
            imp.progress = text

        async def run() -> BaseImage:
            async with self._slots():
                imp.progress = "starting the download"
                return await fetch(progress)

        imp.task = asyncio.get_running_loop().create_task(run(), name=f"image import {label}")
        imp.task.add_done_callback(lambda t: self._ended(key, imp, t))
        self._running[key] = imp
        return imp

    def _ended(self, key: Hashable, imp: _Import, task: asyncio.Task[BaseImage]) -> None:
        if self._running.get(key) is imp:
            del self._running[key]
        if not imp.wake.done():
            imp.wake.set_result(None)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here, always: no "Task exception was never retrieved"
        if exc is None or imp.cancelled:
            return
        if not isinstance(exc, ProviderError):
            self._log.error(exc, "image import failed unexpectedly", image=imp.label)
            exc = TransientError(f"image {imp.label!r}: import failed ({type(exc).__name__})")
        elif not isinstance(exc, PermanentError | QuotaError):
            self._log.info("image import failed; will be retried", image=imp.label, error=str(exc))
        self._failed[key] = _Failure(at=self._clock(), error=exc)

    async def close(self) -> None:
        tasks = [imp.task for imp in self._running.values() if imp.task is not None]
        for t in tasks:
            t.cancel()
        # Cancelled ones are cleaning up (deleting their partial volume): awaited, not cut short.
        for t in [*tasks, *self._cancelled]:
            with contextlib.suppress(BaseException):
                await t


def _copy(err: ProviderError) -> ProviderError:
    """A fresh exception of the same kind and message: raising one object again and again would chain
    every waiter's traceback onto it."""
    return type(err)(str(err))
