"""Environment variables that more than one test module reads, parsed in one place, so a module never
carries its own copy of the parsing and an unusable value is an error naming the variable.

- EGRESS_LAB_INDEX: the session's lab (tests/conftest.py), 0..7, default 0.
- EGRESS_LAB_SELFTEST_INDEX: the lab test_lab_host.py brings up, crashes and removes; default derived
  from the session's lab (`testbed.lab.layout.selftest_index`), never the session's lab itself.
- KVM_TEST_BOOT_TIMEOUT: seconds a test waits for a booted VM (its IP, its proxy); each test keeps its
  own default, a loaded machine raises them all at once.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from testbed.lab.layout import MAX_INDEX, check_index, selftest_index

LAB_INDEX = "EGRESS_LAB_INDEX"
LAB_DIR = "EGRESS_LAB_DIR"
SELFTEST_INDEX = "EGRESS_LAB_SELFTEST_INDEX"
BOOT_TIMEOUT = "KVM_TEST_BOOT_TIMEOUT"


def _index(variable: str, raw: str) -> int:
    try:
        return check_index(int(raw))
    except ValueError:
        raise ValueError(f"{variable}={raw!r}: not a lab index (an integer in 0..{MAX_INDEX})") from None


def lab_index(env: Mapping[str, str] = os.environ) -> int:
    """EGRESS_LAB_INDEX, default 0."""
    raw = env.get(LAB_INDEX, "").strip()
    return _index(LAB_INDEX, raw) if raw else 0


def session_lab_index(env: Mapping[str, str] = os.environ) -> int:
    """The index of the lab the session's fixtures use: the one EGRESS_LAB_DIR holds when it holds one
    (tests/conftest.py uses that lab as it is), else EGRESS_LAB_INDEX."""
    return _session_lab(env)[0]


def _session_lab(env: Mapping[str, str]) -> tuple[int, str]:
    """The session lab's index, and where it comes from (for messages)."""
    lab_dir = env.get(LAB_DIR, "").strip()
    if lab_dir and (Path(lab_dir) / "lab.json").is_file():
        from testbed.lab.info import LabInfo

        return LabInfo.load(lab_dir).index, f"the lab in {LAB_DIR}={lab_dir}"
    return lab_index(env), f"{LAB_INDEX}={env.get(LAB_INDEX, '').strip() or '0 (unset)'}"


def selftest_lab_index(env: Mapping[str, str] = os.environ) -> int:
    """EGRESS_LAB_SELFTEST_INDEX, by default the session lab's partner (`selftest_index`); refused when
    it is the session's lab (`session_lab_index`): the self-test would remove that lab."""
    main, source = _session_lab(env)
    raw = env.get(SELFTEST_INDEX, "").strip()
    index = _index(SELFTEST_INDEX, raw) if raw else selftest_index(main)
    if index == main:
        raise ValueError(
            f"{SELFTEST_INDEX}={index} is the session's own lab ({source}): test_lab_host.py brings "
            f"its lab up, crashes it and removes it, which would take the session's lab with it; set "
            f"{SELFTEST_INDEX} to another index in 0..{MAX_INDEX}, or unset it (then {LAB_INDEX}={main} "
            f"gives {selftest_index(main)})")
    return index


def boot_timeout(default: float, env: Mapping[str, str] = os.environ) -> float:
    """KVM_TEST_BOOT_TIMEOUT in seconds (a positive number), else the calling test's `default`."""
    raw = env.get(BOOT_TIMEOUT, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{BOOT_TIMEOUT}={raw!r}: not a positive number of seconds")
    return value
