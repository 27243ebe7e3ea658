"""The simulator's kernel neighbour entries (testbed/sim/neigh.py, over rtnetlink) are the ones
`ip neigh replace ... nud permanent` makes, go with their guest, and a refusal is logged naming the
command; no process is started for them and the one thread that writes them ends with the daemon.

Runs sim_neigh_netns.py in a network namespace of its own (`unshare --net`, as root), no lab needed.
The provider reading these entries over SSH is test_kvm_provider.py's [simulated] run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _run() -> tuple[dict[str, Any], str]:
    proc = subprocess.run(["unshare", "--net", sys.executable, str(HERE / "sim_neigh_netns.py"), str(ROOT)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def _by_ip(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["dst"]: e for e in entries}


def _rest(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry but its address and MAC."""
    return {k: v for k, v in entry.items() if k not in ("dst", "lladdr")}


def test_neighbour_entries_are_iproute2s_follow_their_guests_and_refusals_are_logged() -> None:
    out, log = _run()
    booted = _by_ip(out["booted"])
    assert {ip: e["lladdr"] for ip, e in booted.items()} == {
        "10.99.0.2": "52:54:00:00:00:01", "10.99.0.3": "52:54:00:00:00:02", "10.99.0.4": "52:54:00:00:00:03"}
    # Every field `ip -d -j neigh` shows but the address and MAC is what iproute2's own entry has.
    reference = _rest(_by_ip(out["iproute2"])["10.99.0.200"])
    assert reference["state"] == ["PERMANENT"]
    assert [_rest(e) for e in booted.values()] == [reference] * 3
    assert set(_by_ip(out["after_destroy"])) == {"10.99.0.2", "10.99.0.4"}
    assert out["after_close"] == []  # the daemon's exit shut the guests off: their entries went with them
    # One writer thread, whatever the number of guests; no process; nothing left after close().
    assert (out["workers_booted"], out["children_booted"]) == (1, [])
    assert (out["workers_closed"], out["children_closed"]) == (0, [])
    assert ("ip neigh replace 10.99.0.3 lladdr 52:54:00:00:00:04 dev nosuch0 nud permanent: "
            "Cannot find device 'nosuch0'") in log
    assert "ip neigh del 10.99.0.3 dev nosuch0: Cannot find device 'nosuch0'" in log
