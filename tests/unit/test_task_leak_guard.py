"""tests/conftest.py freezes what collection built, and what is left after each module, out of the cycle
collector (so the per-test collection is cheap); this proves its guard still fails a test whose failed
task nobody retrieved, even when only the cycle collector can free that task, and also when a
module-scoped fixture held the task until the module's end, or it was kept past its module's end (frozen
then) and dropped later."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

IN_A_TEST = '''
import asyncio

async def test_leaks_a_failed_task_in_a_cycle():
    async def boom():
        me = asyncio.current_task()  # frame -> task -> exception -> traceback -> frame: a cycle
        raise RuntimeError("nobody retrieved this")
    asyncio.get_running_loop().create_task(boom())
    await asyncio.sleep(0.01)

def test_a_clean_one():
    pass
'''

IN_A_MODULE_FIXTURE = '''
import asyncio
import pytest

@pytest.fixture(scope="module")
def failed_task():
    async def boom():
        me = asyncio.current_task()  # a cycle, as above
        raise RuntimeError("a module fixture's task")
    loop = asyncio.new_event_loop()
    task = loop.create_task(boom())
    loop.run_until_complete(asyncio.wait([task]))
    loop.close()
    yield task  # dropped, never retrieved, when the module's fixtures are finalized

def test_holds_it(failed_task):
    assert failed_task.done()
'''


KEEP_FIXTURE = '''

@pytest.fixture(scope="session")
def keep() -> list[object]:
    return []
'''

KEEPS_ONE = '''
import asyncio

async def test_keeps_a_failed_task(keep):
    async def boom():
        me = asyncio.current_task()  # a cycle, as above
        raise RuntimeError("kept past its module")
    keep.append(asyncio.get_running_loop().create_task(boom()))
    await asyncio.sleep(0.01)
'''


def run_pytest(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`-rN`: no short test summary, whose lines pytest prints in full under CI (the `CI` variable) and
    truncates elsewhere, so the counts below would depend on where the suite runs."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rN", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_failed_task_nobody_retrieved_fails_the_test(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_a_module_fixture.py").write_text(IN_A_MODULE_FIXTURE)
    (tmp_path / "test_b_next_module.py").write_text("def test_next():\n    pass\n")
    (tmp_path / "test_c_in_a_test.py").write_text(IN_A_TEST)
    (tmp_path / "test_d_module_fixture_last.py").write_text(IN_A_MODULE_FIXTURE)
    done = run_pytest(tmp_path)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    # A module fixture's task: the next test fails, naming the module ...
    assert "ERROR at setup of test_next" in out
    assert "test_a_module_fixture.py (its module-scoped fixtures): Task exception was never retrieved" in out
    # ... or, after the last module, the session does.
    assert "after the last test (session-scoped fixtures, or kept past its module): Task exception" in out
    assert out.count("RuntimeError(\"a module fixture's task\")") == 2
    # A test's own task fails that test.
    assert "ERROR at teardown of test_leaks_a_failed_task_in_a_cycle" in out
    assert "RuntimeError('nobody retrieved this')" in out
    assert "4 passed, 2 errors" in out


def test_a_failed_task_kept_past_its_module_and_dropped_later_fails_the_session(tmp_path: Path) -> None:
    """Still reachable when its module ended, so frozen; dropped in a later module, where the per-test
    collection cannot free it: the last collection, which unfreezes everything, must report it."""
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text() + KEEP_FIXTURE)
    (tmp_path / "test_a_keeps.py").write_text(KEEPS_ONE)
    (tmp_path / "test_b_drops.py").write_text("def test_drops_it(keep):\n    keep.clear()\n")
    (tmp_path / "test_c_after.py").write_text("def test_after():\n    pass\n")
    done = run_pytest(tmp_path)
    out = done.stdout
    assert "3 passed in" in out, out + done.stderr  # no test failed: only the session can
    assert done.returncode == 1, out + done.stderr
    assert "after the last test (session-scoped fixtures, or kept past its module): Task exception was " \
           "never retrieved: RuntimeError('kept past its module')" in out
