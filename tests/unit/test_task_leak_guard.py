"""tests/conftest.py freezes what collection built, and what is left after each module, out of the cycle
collector (so the per-test collection is cheap); this proves its guard still fails a test whose failed
task nobody retrieved, even when only the cycle collector can free that task, and also when a
module-scoped fixture held the task until the module's end."""

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


def test_a_failed_task_nobody_retrieved_fails_the_test(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_a_module_fixture.py").write_text(IN_A_MODULE_FIXTURE)
    (tmp_path / "test_b_next_module.py").write_text("def test_next():\n    pass\n")
    (tmp_path / "test_c_in_a_test.py").write_text(IN_A_TEST)
    (tmp_path / "test_d_module_fixture_last.py").write_text(IN_A_MODULE_FIXTURE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    # A module fixture's task: the next test fails, naming the module ...
    assert "ERROR at setup of test_next" in out
    assert "test_a_module_fixture.py (its module-scoped fixtures): Task exception was never retrieved" in out
    # ... or, after the last module, the session does.
    assert "test_d_module_fixture_last.py (its module-scoped fixtures): Task exception" in out
    assert out.count("RuntimeError(\"a module fixture's task\")") == 2
    # A test's own task fails that test.
    assert "ERROR at teardown of test_leaks_a_failed_task_in_a_cycle" in out
    assert "RuntimeError('nobody retrieved this')" in out
    assert "4 passed, 2 errors" in out
