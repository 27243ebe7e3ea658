"""Lets a fixture see its test's outcome (the e2e steps build on each other: after a failure, skip)."""

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep
