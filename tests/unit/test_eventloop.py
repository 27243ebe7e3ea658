"""The operator's event loop choice: uvloop by default, the standard loop on request, clear errors."""

from __future__ import annotations

import asyncio
import gc

import pytest
import uvloop

from egress_kvm import eventloop
from egress_kvm.eventloop import ENV, EventLoop


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, EventLoop.UVLOOP),
        ({ENV: ""}, EventLoop.UVLOOP),
        ({ENV: "uvloop"}, EventLoop.UVLOOP),
        ({ENV: " AsyncIO "}, EventLoop.ASYNCIO),
    ],
)
def test_choice(env: dict[str, str], expected: EventLoop) -> None:
    assert eventloop.choose(env) is expected


def test_an_unknown_loop_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=r"EGRESS_KVM_EVENT_LOOP='trio': must be one of uvloop, asyncio"):
        eventloop.choose({ENV: "trio"})


@pytest.mark.parametrize(("name", "loop_type"), [("uvloop", uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)])
def test_run_uses_the_chosen_loop(name: str, loop_type: type) -> None:
    async def which() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    loop = eventloop.run(which(), eventloop.choose({ENV: name}))
    assert isinstance(loop, loop_type)
    assert (name == "uvloop") == isinstance(loop, uvloop.Loop)


@pytest.mark.parametrize("name", ["uvloop", "asyncio"])
def test_run_freezes_what_exists_before_the_loop_and_releases_it_after(name: str) -> None:
    """What exists before the loop (modules and their objects) is out of the cyclic GC while it runs;
    what the loop makes is not; and everything is collectable again once it ends."""
    gc.unfreeze()  # the test session's own freeze (tests/conftest.py): as in a process that froze nothing

    async def inside() -> tuple[int, bool, bool]:
        made = [object()]  # a container: tracked by the GC
        frozen = gc.get_freeze_count()
        # gc.get_objects() lists only the generations the collector walks, not the frozen one.
        walked = {id(o) for o in gc.get_objects()}
        return frozen, id(test_run_freezes_what_exists_before_the_loop_and_releases_it_after) in walked, \
            id(made) in walked

    frozen, module_function_walked, new_walked = eventloop.run(inside(), eventloop.choose({ENV: name}))
    assert frozen > 1000  # the imported modules' objects, at least
    assert not module_function_walked
    assert new_walked
    assert gc.get_freeze_count() == 0


def test_run_leaves_frozen_what_its_caller_froze() -> None:
    """gc can only unfreeze everything: a caller's own freeze (the test session's, tests/conftest.py) must
    survive the loop, or every later full collection walks again all it had frozen."""
    gc.freeze()
    before = gc.get_freeze_count()
    assert before > 0

    async def nothing() -> None:
        return None

    eventloop.run(nothing(), eventloop.choose({ENV: "asyncio"}))
    assert gc.get_freeze_count() >= before
