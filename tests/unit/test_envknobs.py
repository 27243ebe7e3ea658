"""The test suite's shared environment variables (tests/envknobs.py): the self-test lab's index follows
the session's lab and is never that lab; KVM_TEST_BOOT_TIMEOUT overrides each test's own default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.envknobs import boot_timeout, lab_index, selftest_lab_index, session_lab_index


@pytest.mark.parametrize(("env", "index"), [
    ({}, 0),
    ({"EGRESS_LAB_INDEX": ""}, 0),
    ({"EGRESS_LAB_INDEX": "3"}, 3),
    ({"EGRESS_LAB_INDEX": " 7 "}, 7),
])
def test_lab_index(env, index):
    assert lab_index(env) == index


@pytest.mark.parametrize("raw", ["8", "-1", "x", "1.5"])
def test_lab_index_refuses_what_is_no_index_naming_the_variable(raw):
    message = rf"EGRESS_LAB_INDEX='{raw}': not a lab index \(an integer in 0\.\.7\)"
    with pytest.raises(ValueError, match=message):
        lab_index({"EGRESS_LAB_INDEX": raw})


@pytest.mark.parametrize(("env", "index"), [
    ({}, 4),  # the session lab 0 (the default): 4, no longer a fixed 5 for every session
    ({"EGRESS_LAB_INDEX": "1"}, 5),
    ({"EGRESS_LAB_INDEX": "3"}, 7),
    ({"EGRESS_LAB_INDEX": "5"}, 1),
    ({"EGRESS_LAB_INDEX": "3", "EGRESS_LAB_SELFTEST_INDEX": "6"}, 6),  # the override
    ({"EGRESS_LAB_INDEX": "3", "EGRESS_LAB_SELFTEST_INDEX": ""}, 7),  # empty: unset
    ({"EGRESS_LAB_SELFTEST_INDEX": "5"}, 5),
])
def test_the_selftest_index_follows_the_session_lab(env, index):
    assert selftest_lab_index(env) == index


@pytest.mark.parametrize("env", [
    {"EGRESS_LAB_INDEX": "3", "EGRESS_LAB_SELFTEST_INDEX": "3"},
    {"EGRESS_LAB_SELFTEST_INDEX": "0"},
])
def test_the_selftest_index_is_never_the_session_lab(env):
    with pytest.raises(ValueError) as e:
        selftest_lab_index(env)
    assert "EGRESS_LAB_SELFTEST_INDEX" in str(e.value) and "EGRESS_LAB_INDEX" in str(e.value)


def test_the_selftest_index_refuses_what_is_no_index():
    with pytest.raises(ValueError, match=r"EGRESS_LAB_SELFTEST_INDEX='9': not a lab index"):
        selftest_lab_index({"EGRESS_LAB_SELFTEST_INDEX": "9"})


def test_a_lab_in_egress_lab_dir_is_the_session_lab(tmp_path):
    """tests/conftest.py uses the lab EGRESS_LAB_DIR holds as it is, whatever EGRESS_LAB_INDEX says: the
    self-test pairs with that lab's index, and refuses to be it."""
    (tmp_path / "lab.json").write_text(json.dumps(lab_json(index=2, state_dir=str(tmp_path))))
    env = {"EGRESS_LAB_DIR": str(tmp_path), "EGRESS_LAB_INDEX": "0"}
    assert session_lab_index(env) == 2
    assert selftest_lab_index(env) == 6
    with pytest.raises(ValueError, match="the lab in EGRESS_LAB_DIR"):
        selftest_lab_index({**env, "EGRESS_LAB_SELFTEST_INDEX": "2"})
    # a dir with no lab in it yet: the fixtures bring one up at EGRESS_LAB_INDEX there
    assert session_lab_index({"EGRESS_LAB_DIR": str(tmp_path / "none"), "EGRESS_LAB_INDEX": "1"}) == 1


def lab_json(*, index: int, state_dir: str) -> dict:
    from testbed.lab.info import LabInfo

    return LabInfo(index=index, state_dir=state_dir, ssh_key="k", known_hosts="kh", providers_file="p",
                   image=None, http_target="t", http_target_body="b", hosts=[]).to_dict()


@pytest.mark.parametrize(("env", "seconds"), [
    ({}, 420.0),
    ({"KVM_TEST_BOOT_TIMEOUT": ""}, 420.0),
    ({"KVM_TEST_BOOT_TIMEOUT": "1200"}, 1200.0),
    ({"KVM_TEST_BOOT_TIMEOUT": "90.5"}, 90.5),
])
def test_boot_timeout(env, seconds):
    assert boot_timeout(420, env) == seconds


@pytest.mark.parametrize("raw", ["0", "-5", "ten", "inf", "nan"])
def test_boot_timeout_refuses_what_is_no_time_naming_the_variable(raw):
    with pytest.raises(ValueError, match=rf"KVM_TEST_BOOT_TIMEOUT='{raw}': not a positive number of seconds"):
        boot_timeout(600, {"KVM_TEST_BOOT_TIMEOUT": raw})


PROBE = """
import json, sys
sys.path[:0] = ["tests/e2e", "."]
import e2e_stack, test_e2e, test_image
from tests.integration import test_kvm_provider, test_lab_image
def limit(module):
    return next(m.args[0] for m in module.pytestmark if m.name == "timeout")
print(json.dumps({"e2e_boot": e2e_stack.BOOT_TIMEOUT, "e2e": limit(test_e2e), "image": limit(test_image),
                  "kvm_boot": test_kvm_provider.BOOT_TIMEOUT, "kvm": limit(test_kvm_provider),
                  "lab_image_boot": test_lab_image.BOOT_TIMEOUT, "lab_image": limit(test_lab_image)}))
"""


@pytest.mark.parametrize(("raw", "expected"), [
    ("", {"e2e_boot": 600, "e2e": 3600, "image": 1800, "kvm_boot": 420, "kvm": 1200,
          "lab_image_boot": 600, "lab_image": 900}),
    ("2000", {"e2e_boot": 2000, "e2e": 3600 + 3 * 1400, "image": 1800 + 1400, "kvm_boot": 2000, "kvm": 2780,
              "lab_image_boot": 2000, "lab_image": 2300}),
])
def test_every_boot_wait_and_the_pytest_timeout_around_it_follow_the_knob(raw, expected):
    """The lab and e2e tests' boot waits follow KVM_TEST_BOOT_TIMEOUT (e2e_stack's was a fixed 600 s), and
    so do the pytest timeouts around them, so a raised wait is never cut by a fixed pytest timeout."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "KVM_TEST_BOOT_TIMEOUT": raw}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=root, env=env, capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == expected
