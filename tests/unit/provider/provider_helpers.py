"""Helpers for the provider's unit tests: a request builder and a JSON log capture."""

from __future__ import annotations

import io
import json
from typing import Any

from egress_kvm.providers.base import CreateRequest, ResolvedPlacement

SECRET = b"#cloud-config\npassword: hunter2-very-secret\n"


def request(name: str = "proxy-abc", *, zone: str = "host0", image: str = "debian-12",
            machine_type: str = "small", uid: str = "uid-1") -> CreateRequest:
    """A create as the controller sends it: the placement resolved (defaults: the fake config's)."""
    return CreateRequest(name=name, owner_uid=uid,
                         placement=ResolvedPlacement(zone=zone, image=image, machine_type=machine_type),
                         user_data=SECRET, owner_namespace="ns1", owner_name="px1")


class LogCapture:
    def __init__(self) -> None:
        self.stream = io.StringIO()

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def lines(self, msg: str | None = None) -> list[dict[str, Any]]:
        out = [json.loads(line) for line in self.text.splitlines() if line.strip()]
        return [r for r in out if msg is None or r["msg"] == msg]




async def create_waiting(provider: Any, req: CreateRequest, *, progress: Any = None) -> Any:
    """`provider.create` as the controller drives it: while a background image import runs, create answers
    InProgress at once; wait for its `wake` and ask again. Each InProgress message goes to `progress`."""
    from egress_kvm.providers.base import InProgress

    while True:
        try:
            return await provider.create(req)
        except InProgress as e:
            if progress is not None:
                await progress(str(e))
            assert e.wake is not None
            await e.wake
