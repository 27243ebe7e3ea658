"""Every stderr line of a configured process is JSON with zap's keys, including other libraries'
records (asyncio's "Task exception was never retrieved" here), which used to come out as plain text."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r'''
import asyncio, gc, logging
from egress_kvm import log

log.configure("debug")
log.get_logger("demo").info("ours", n=1)
logging.getLogger("asyncssh").info("below WARNING: not shown")
logging.getLogger("aiohttp.client").warning("a library warning")

async def main():
    async def boom():
        raise RuntimeError("never awaited")
    task = asyncio.get_running_loop().create_task(boom())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    del task
    gc.collect()

asyncio.run(main())
'''


def test_other_libraries_log_json_through_the_same_handler() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stderr.splitlines()]  # each one JSON, or this raises
    for line in lines:
        assert {"ts", "level", "logger", "msg"} <= set(line), line
    by_logger = {line["logger"]: line for line in lines}
    assert by_logger["demo"]["msg"] == "ours"
    assert by_logger["aiohttp.client"] == {**by_logger["aiohttp.client"], "level": "warn",
                                          "msg": "a library warning"}
    assert "asyncssh" not in by_logger
    task_line = by_logger["asyncio"]
    assert task_line["level"] == "error" and "Task exception was never retrieved" in task_line["msg"]
    assert task_line["error"] == "never awaited" and "RuntimeError" in task_line["stacktrace"]
