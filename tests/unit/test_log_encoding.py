"""What --zap-encoder, --zap-time-encoding and --zap-stacktrace-level do to the lines the operator writes."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from egress_kvm import log
from egress_kvm.log import Encoder, TimeEncoding, ZapOptions, encode_time

BIN = Path(sys.executable).parent


@pytest.fixture
def buf() -> Iterator[io.StringIO]:
    out = io.StringIO()
    yield out
    log.configure("info")  # back to the default for the next test


@pytest.mark.parametrize("encoding,expected", [
    (TimeEncoding.EPOCH, 1767236645.5),
    (TimeEncoding.MILLIS, 1767236645500.0),
    (TimeEncoding.NANO, 1767236645500000000),
    (TimeEncoding.RFC3339, "2026-01-01T03:04:05Z"),
    (TimeEncoding.ISO8601, "2026-01-01T03:04:05.500Z"),
    (TimeEncoding.RFC3339NANO, "2026-01-01T03:04:05.5Z"),
])
def test_time_encodings(encoding: TimeEncoding, expected: object) -> None:
    assert encode_time(1767236645.5, encoding) == expected


def test_json_lines_carry_a_stacktrace_from_the_stacktrace_level(buf: io.StringIO) -> None:
    log.configure(stream=buf, options=ZapOptions(stacktrace_level=logging.WARNING,
                                                 time_encoding=TimeEncoding.RFC3339))
    lg = log.get_logger("t")
    lg.info("hello", n=1)
    lg.warning("careful")
    first, second = (json.loads(x) for x in buf.getvalue().splitlines())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first["ts"])
    assert first["n"] == 1 and "stacktrace" not in first
    assert "test_json_lines_carry_a_stacktrace_from_the_stacktrace_level" in second["stacktrace"]
    assert "logging/__init__.py" not in second["stacktrace"]  # the logging machinery's frames are left out


def test_console_encoder_is_zaps(buf: io.StringIO) -> None:
    log.configure(stream=buf, options=ZapOptions(development=True))
    lg = log.get_logger("ctl").with_values(proxy="default/px1")
    lg.v(1).info("debug line")
    lg.error("boom", "reconcile failed")
    lines = buf.getvalue().splitlines()
    ts, level, logger, msg, fields = lines[0].split("\t")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ts)  # development: ISO8601
    assert (level, logger, msg) == ("DEBUG", "ctl", "debug line")
    assert json.loads(fields) == {"proxy": "default/px1"}
    assert lines[1].split("\t")[1:4] == ["ERROR", "ctl", "reconcile failed"]
    assert json.loads(lines[1].split("\t")[4]) == {"error": "boom", "proxy": "default/px1"}
    assert lines[2].startswith("  File ")  # development: stack traces from warn, on the following lines


def test_production_defaults_are_json_info_and_no_stack_below_error(buf: io.StringIO) -> None:
    log.configure(stream=buf, options=ZapOptions())
    lg = log.get_logger("p")
    lg.v(1).info("hidden")
    lg.warning("w")
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert [x["msg"] for x in lines] == ["w"] and "stacktrace" not in lines[0]
    assert isinstance(lines[0]["ts"], float)
    assert ZapOptions().resolved_encoder is Encoder.JSON


def test_the_operator_logs_its_version_first_and_version_command_agrees(tmp_path: Path) -> None:
    from egress_kvm.metrics import version

    out = subprocess.run([str(BIN / "egress-kvm"), "version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(f"egress-kvm {version()} (python ")
    as_json = subprocess.run([str(BIN / "egress-kvm"), "version", "-o", "json"], capture_output=True,
                             text=True, timeout=60)
    assert json.loads(as_json.stdout)["version"] == version()
    run = subprocess.run([str(BIN / "egress-kvm"), "--zap-devel", "--zap-encoder=json",
                          f"--providers-config={tmp_path / 'missing.yaml'}"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    first = json.loads(run.stderr.splitlines()[0])
    assert (first["msg"], first["version"]) == ("egress-kvm starting", version())
