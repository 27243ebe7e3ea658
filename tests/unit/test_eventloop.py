"""The operator's event loop choice: uvloop by default, the standard loop on request, clear errors."""

from __future__ import annotations

import asyncio

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
