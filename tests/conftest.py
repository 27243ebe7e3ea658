"""Shared fixtures: the hypervisor lab (testbed.lab), one per test session.

`lab_host`: a lab's hosts (sshd + libvirtd + bridge), image or not, for RPC/provider tests.
`lab`: the same lab with the test image built and served (for tests that boot VMs).
Both honour EGRESS_LAB_DIR: when it points at a lab that is up, that lab is used and left running;
otherwise a lab is brought up (index EGRESS_LAB_INDEX, default 0; EGRESS_LAB_HOSTS hosts, default 2)
and torn down when the session ends. They skip, saying why, only where a lab cannot exist (not root,
no `ip netns`); CI runs as root, so there they always run.

`hypervisor`: "libvirtd" unless a module asks for both (tests/integration/conftest.py parametrizes the
KVM provider's tests over "libvirtd" and "simulated"); a "simulated" `lab`/`lab_host` is the simulated
lab of the same index (`lab up --simulated`, docs/lab.md), brought up and torn down the same way.

`libvirt_trace`: a test hands it the provider's `libvirt call` log; it is written to the terminal after
the test's result line under `-v` (the spec: "its -v output includes the libvirt call trace"), and kept
as a report section, so it also shows on failure and with `-rP`.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest


class _NeverRetrieved(logging.Handler):
    """Collects asyncio's "Task exception was never retrieved" (and "Future ...") log lines."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "exception was never retrieved" in message:
            cause = f": {record.exc_info[1]!r}" if record.exc_info else ""
            self.lines.append(message.splitlines()[0] + cause)


def _collect_unretrieved() -> list[str]:
    """A full cycle collection, returning the never-retrieved reports it set off."""
    handler = _NeverRetrieved()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        gc.collect()
    finally:
        logger.removeHandler(handler)
    return handler.lines


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (modules, test items, parameters: ~200k objects) out of the cycle
    collector. `no_unretrieved_task_exceptions` runs a full collection after every test, and each one
    walked all of them: ~0.15 s of CPU per test, 90% of the unit layer's time. Tasks, loops and every
    other object a test makes are created after this point, so the per-test collection still sees them."""
    gc.collect()
    gc.freeze()


_LEFT_BY_MODULE = pytest.StashKey[list[str]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, object]:
    """After a module's last test, once its module-scoped fixtures are finalized and pytest has let go of
    the test's arguments: collect, then freeze what is left, all of it still reachable (session fixtures,
    pytest's reports), so later modules' collections skip it as well; without this the per-test
    collection grew back to ~0.1 s over a few hundred tests. A never-retrieved task this collection finds
    (one a module-scoped fixture held) fails the next test, or the session after the last one.

    A frozen object is never collected, even once it is unreachable: a failed task still reachable when
    its module ended (kept in a session fixture or a global) and dropped later would go unreported. So
    after the last test, once the session fixtures are finalized too, everything is unfrozen first and
    that last collection walks it all, once: such a task fails the session."""
    result = yield
    if nextitem is None:
        gc.unfreeze()
        _report_left(item, "after the last test (session-scoped fixtures, or kept past its module)")
    elif nextitem.path != item.path:
        _report_left(item, f"{item.path.name} (its module-scoped fixtures)")
        gc.freeze()
    return result


def _report_left(item: pytest.Item, where: str) -> None:
    """Collect; what was never retrieved fails the next test, or the session (pytest_sessionfinish)."""
    lines = _collect_unretrieved()
    if lines:
        item.session.stash.setdefault(_LEFT_BY_MODULE, []).extend(f"{where}: {line}" for line in lines)


def pytest_sessionfinish(session: pytest.Session) -> None:
    lines = session.stash.get(_LEFT_BY_MODULE, [])
    if lines:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("task exceptions never retrieved:\n" + "\n".join(lines), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def no_unretrieved_task_exceptions(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test fails on a task whose exception nobody retrieved (issue 13 item 9): such an error went
    unhandled, and asyncio reports it only when the task is collected, far from its cause, at ERROR."""
    left = request.session.stash.get(_LEFT_BY_MODULE, [])
    if left:  # by the module before this one
        request.session.stash[_LEFT_BY_MODULE] = []
        pytest.fail("task exceptions never retrieved:\n" + "\n".join(left), pytrace=False)
    handler = _NeverRetrieved()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        yield
        gc.collect()  # the report comes from the task's finaliser
    finally:
        logger.removeHandler(handler)
    if handler.lines:
        pytest.fail("task exceptions never retrieved:\n" + "\n".join(handler.lines), pytrace=False)


_TRACE = pytest.StashKey[str]()
TRACE_SECTION = "libvirt call trace"


@pytest.fixture
def libvirt_trace(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Call with the trace text (once, at the end of the test, e.g. from a fixture's teardown)."""
    def record(text: str) -> None:
        request.node.stash[_TRACE] = request.node.stash.get(_TRACE, "") + text
    return record


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    text = item.stash.get(_TRACE, "") if call.when == "teardown" else ""
    if text:
        report.sections.append((f"Captured {TRACE_SECTION}", text))
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        if item.config.option.verbose > 0 and reporter is not None:
            reporter.ensure_newline()
            reporter.section(f"{TRACE_SECTION}: {item.nodeid}", sep="-")
            reporter.write(text if text.endswith("\n") else text + "\n")
    return report


class _SessionLab:
    """Brings the session's lab up at most once (adding the image on demand) and knows whether it owns it."""

    def __init__(self, *, simulated: bool = False) -> None:
        self.owned_dir: Path | None = None
        self.simulated = simulated

    def get(self, *, image: bool):  # type: ignore[no-untyped-def]
        from testbed import lab
        from testbed.lab.layout import default_state_dir
        from tests.envknobs import lab_index

        reason = lab.unavailable_reason()
        if reason:
            pytest.skip(reason)
        env_dir = None if self.simulated else os.environ.get("EGRESS_LAB_DIR")
        if env_dir and not lab.problems(env_dir):
            info = lab.LabInfo.load(env_dir)
            if image and info.image is None:  # add the image to that running lab; it stays running
                info = lab.up(state_dir=env_dir, index=info.index, hosts=len(info.hosts), image=True)
            return info
        index = lab_index()  # EGRESS_LAB_INDEX (tests/envknobs.py)
        hosts = int(os.environ.get("EGRESS_LAB_HOSTS", "2"))
        state = Path(env_dir) if env_dir else default_state_dir(index, simulated=self.simulated)
        if self.owned_dir is not None and not image and not lab.problems(self.owned_dir):
            return lab.LabInfo.load(self.owned_dir)  # hosts-only users take the lab as it is, image or not
        info = lab.up(state_dir=state, index=index, hosts=hosts, image=image, simulated=self.simulated)
        self.owned_dir = state
        return info

    def close(self) -> None:
        if self.owned_dir is not None:
            from testbed import lab

            lab.down(self.owned_dir)
            self.owned_dir = None


@pytest.fixture(scope="session")
def _session_lab() -> Iterator[_SessionLab]:
    holder = _SessionLab()
    yield holder
    holder.close()


@pytest.fixture(scope="session")
def _session_sim_lab() -> Iterator[_SessionLab]:
    holder = _SessionLab(simulated=True)
    yield holder
    holder.close()


@pytest.fixture(scope="session")
def hypervisor(request: pytest.FixtureRequest) -> str:
    """What answers on the lab hosts' libvirt socket: "libvirtd", or "simulated" (testbed/sim)."""
    return str(getattr(request, "param", "libvirtd"))


def _lab_for(request: pytest.FixtureRequest, hypervisor: str) -> _SessionLab:
    name = "_session_sim_lab" if hypervisor == "simulated" else "_session_lab"
    holder: _SessionLab = request.getfixturevalue(name)
    return holder


@pytest.fixture(scope="session")
def lab_host(request: pytest.FixtureRequest, hypervisor: str):  # type: ignore[no-untyped-def]
    """A running lab (LabInfo) whose hosts are up; the test image may or may not be there."""
    return _lab_for(request, hypervisor).get(image=False)


@pytest.fixture(scope="session")
def lab(request: pytest.FixtureRequest, hypervisor: str):  # type: ignore[no-untyped-def]
    """A running lab (LabInfo) with the test image built and served (info.image is set)."""
    return _lab_for(request, hypervisor).get(image=True)
