"""A routine pass from the informer's cache: when the cache may stand in for a fresh read, and the check
that sends the pass back to a fresh read before it does anything.

A pass queued by the clock alone (a resync; see planner.vouched) starts from the cache's copy of the
Proxy when the cache can be trusted (listed, following the server, holding the key). Such a pass changes
nothing: before a step with any act that does something (actions.acting: a write, an Event, a provider
call, a look included, a change of the probes or of the reconciler's memory) or any end but a plain
result, it starts over from a fresh read (context.FreshReadNeeded). So it completes only for a Proxy its
probes vouch for with nothing to change, which is what a fresh pass would have done when the cache was
current; anything newer reaches the controller as a watch event, which queues a pass that reads fresh
(not routine). A settled Proxy's resync costs the API server nothing, and no write, Event, provider call,
delete, finalizer step or KeyState change is ever made on the cache's word.
"""

from __future__ import annotations

import copy
from typing import Protocol, runtime_checkable

from egress_kvm.kube.interfaces import Key, Obj, ProxyStore

from . import actions
from .context import Context
from .planner import Act


@runtime_checkable
class Follows(Protocol):
    """A cache that can tell whether it follows the server right now (the informer: listed, a watch
    stream open and heard from, run() alive). One that cannot (a test's store) is trusted once synced."""

    def current(self) -> bool: ...


def cached_copy(cache: ProxyStore | None, key: Key) -> Obj | None:
    """The cache's copy of the Proxy, if the cache can be trusted: listed, following the server (a watch
    gone silent, reconnecting or relisting leaves it behind by any amount), holding the key."""
    if cache is None or not cache.has_synced() or (isinstance(cache, Follows) and not cache.current()):
        return None
    obj = cache.get(key)
    return copy.deepcopy(obj) if obj is not None else None  # the cache's objects are shared


def check_step(ctx: Context, acts: tuple[Act, ...]) -> None:
    """A pass from the cache starts over fresh before a step that would change anything, so none of the
    step's acts runs on the cache's word (not even the ones before the one that changes something)."""
    if ctx.cached:
        for act in acts:
            what = actions.acting(ctx, act)
            if what is not None:
                ctx.must_read(what)
