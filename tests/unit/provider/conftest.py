"""Fixtures for the provider's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from provider_helpers import LogCapture

from egress_kvm import log


@pytest.fixture
def logs(request: pytest.FixtureRequest) -> Iterator[LogCapture]:
    """Capture JSON log lines; `@pytest.mark.parametrize('logs', ['2'], indirect=True)` sets the level."""
    cap = LogCapture()
    level = getattr(request, "param", "debug")
    log.configure(level, stream=cap.stream)
    yield cap
    log.configure("info")
