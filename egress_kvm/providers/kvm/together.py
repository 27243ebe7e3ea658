"""Independent libvirt reads of one operation run at once, so their round trips overlap.

A Create used to make about fifteen calls one after another; over a link with 50 ms of round-trip time
that alone was most of a second per Proxy. Calls that do not need each other's answers (the domain and
the pool lookups; the base image check, the pool's free space and the host's free memory) now go out
together on the host's one connection, which pipelines them.

`together` waits for every call, even after one fails (siblings are not cancelled): most are reads, and
waiting keeps the error that surfaces the one the sequential code would have raised (`first_failure`: the
earliest in argument order), so what a Proxy's status says does not depend on which reply arrived first.
The two writes (a Create's overlay and seed volumes) are waited for too: a volume call cut off mid-flight
may still be made on the host, so its outcome is better known; either left by the other's failure is
replaced by the retry or deleted with the instance (by name, recorded in status before the create).
Cancelled itself (a reconcile's timeout, a shutdown), it returns only once every call has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")
D = TypeVar("D")


def first_failure(results: Sequence[object]) -> BaseException | None:
    """The first result that is an exception, in argument order (None: all succeeded)."""
    return next((r for r in results if isinstance(r, BaseException)), None)


@overload
async def together(a: Awaitable[A], b: Awaitable[B], /) -> tuple[A, B]: ...


@overload
async def together(a: Awaitable[A], b: Awaitable[B], c: Awaitable[C], /) -> tuple[A, B, C]: ...


@overload
async def together(a: Awaitable[A], b: Awaitable[B], c: Awaitable[C], d: Awaitable[D], /
                   ) -> tuple[A, B, C, D]: ...


async def together(*calls: Awaitable[Any]) -> tuple[Any, ...]:
    """Run `calls` concurrently; their results in order, or the first failure (in order) raised."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    failure = first_failure(results)
    if failure is not None:
        raise failure
    return tuple(results)



@dataclass(frozen=True)
class Settled(Generic[A]):
    """A call's result or the error it raised, as a value (`together` does not raise it): for a read
    sent beside another on speculation, whose answer may not be needed. `value` raises the error later,
    where the sequential code would have."""

    result: A | Exception

    @property
    def error(self) -> Exception | None:
        return self.result if isinstance(self.result, Exception) else None

    async def value(self) -> A:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


async def settled(call: Awaitable[A]) -> Settled[A]:
    """`call` run to its end, never raising (a cancel is not caught)."""
    try:
        return Settled(await call)
    except Exception as exc:
        return Settled(exc)
