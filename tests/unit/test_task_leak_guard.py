"""tests/conftest.py freezes what collection built out of the cycle collector (so the per-test collection
is cheap); this proves its guard still fails a test whose failed task nobody awaited, even when only the
cycle collector can free that task."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

LEAKY = '''
import asyncio

async def test_leaks_a_failed_task_in_a_cycle():
    async def boom():
        me = asyncio.current_task()  # frame -> task -> exception -> traceback -> frame: a cycle
        raise RuntimeError("nobody retrieved this")
    asyncio.get_running_loop().create_task(boom())
    await asyncio.sleep(0.01)
'''


def test_a_failed_task_nobody_awaited_fails_the_test(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "task exceptions never retrieved" in done.stdout
    assert "RuntimeError('nobody retrieved this')" in done.stdout
    assert "1 passed, 1 error" in done.stdout
