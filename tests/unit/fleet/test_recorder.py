"""The fleet bench's per-stage times come from the first sight of each phase on the watch."""

from __future__ import annotations

from typing import Any

from testbed.fleet.kube import Recorder


def _obj(phase: str, *, healthy: bool = False) -> dict[str, Any]:
    conds = [{"type": "Healthy", "status": "True" if healthy else "False"}]
    return {"metadata": {"name": "p"}, "status": {"phase": phase, "conditions": conds}}


def test_stages_are_first_sightings_and_ready_needs_healthy() -> None:
    rec = Recorder()
    rec.created["p"] = 10.0
    rec.seen("MODIFIED", _obj("Provisioning"), 12.0)
    rec.seen("MODIFIED", _obj("Provisioning"), 13.0)  # a later write of the same phase moves nothing
    rec.seen("MODIFIED", _obj("Running"), 19.0)
    rec.seen("MODIFIED", _obj("Ready"), 25.0)  # Ready, not yet Healthy: not the first Ready
    rec.seen("MODIFIED", _obj("Ready", healthy=True), 30.0)
    assert rec.stage("p", "", "Provisioning") == 2.0
    assert rec.stage("p", "Provisioning", "Running") == 7.0
    assert rec.stage("p", "Running", "Ready") == 11.0
    assert rec.stage("p", "", "Ready") == 20.0


def test_a_stage_not_seen_is_none() -> None:
    rec = Recorder()
    rec.created["p"] = 1.0
    rec.seen("MODIFIED", _obj("Running"), 5.0)
    assert rec.stage("p", "", "Provisioning") is None
    assert rec.stage("p", "Running", "Ready") is None
    assert rec.stage("q", "", "Running") is None
