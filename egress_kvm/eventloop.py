"""Which asyncio event loop the process runs on: uvloop by default, the standard loop on request.

Why uvloop: the operator's hot path is the libvirt RPC client, and on this machine a minimal
asyncio.Protocol ping-pong costs about 1.4x the latency and 1.9x the CPU on the standard loop that it
costs on uvloop (docs/performance.md); libvirt-python's latency is only reachable on the faster loop.
The standard loop stays supported (every test runs on it): `EGRESS_KVM_EVENT_LOOP=asyncio` selects it.
"""

from __future__ import annotations

import asyncio
import enum
import gc
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

ENV = "EGRESS_KVM_EVENT_LOOP"
T = TypeVar("T")


class EventLoop(enum.Enum):
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


def choose(env: Mapping[str, str]) -> EventLoop:
    """The loop the environment asks for (default uvloop); ValueError naming the variable otherwise."""
    value = env.get(ENV, "").strip().lower() or EventLoop.UVLOOP.value
    try:
        return EventLoop(value)
    except ValueError:
        choices = ", ".join(e.value for e in EventLoop)
        raise ValueError(f"{ENV}={env.get(ENV)!r}: must be one of {choices}") from None


def loop_factory(loop: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory for asyncio.Runner (None: the standard loop)."""
    if loop is EventLoop.ASYNCIO:
        return None
    import uvloop

    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], loop: EventLoop) -> T:
    """asyncio.run on the chosen loop, with what exists before it frozen out of the cyclic GC.

    Why freeze: what is there before the loop starts (every imported module, its classes, functions and
    constants: kubernetes-asyncio's models alone are tens of thousands of objects) lives as long as the
    process, yet every full collection walked all of it again. At 1,000 Proxies that was a stop of
    ~130-160 ms several times a minute, every in-flight reconcile and RPC waiting behind it
    (docs/performance.md). Frozen objects are left out of collections; they are released to the GC again
    when the loop ends, so a process that runs the loop more than once (the tests) leaks nothing. The
    collection first: garbage frozen would never be freed. A caller that froze objects itself (the test
    session, tests/conftest.py) keeps them frozen: gc can only unfreeze everything, so then nothing is."""
    ours = gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    try:
        with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
            return runner.run(main)
    finally:
        if ours:
            gc.unfreeze()
