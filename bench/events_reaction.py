"""Time from `virsh destroy` of a Proxy's VM to the operator's reaction, on the real lab (issue 9 item 1).

The real operator process, the API emulator and kubectl on a lab (tests/e2e/e2e_stack.Stack). One Proxy
is applied; once its domain runs (no need to wait for the guest to boot: the event is about the domain),
the VM is destroyed `--rounds` times with virsh, each time after the operator started it again, and three
times are read from the operator's own log lines (their `ts`) against the moment virsh was called:

- **event**: the controller's `instance event; reconciling its Proxy` line (the lifecycle event, mapped
  to the Proxy and queued);
- **started**: the provider's `KVM domain ensured running` line of the reconcile the event triggered;
- without events (`--no-events` is not offered: the polling path is the prober's three failures at the
  Proxy's interval, or the resync, i.e. tens of seconds to minutes; see docs/kvm-provider.md).

Run against a lab you keep (it empties the lab's pools first, like the e2e test):

    egress-kvm lab up --index N --hosts 2
    EGRESS_LAB_INDEX=N .venv/bin/python bench/events_reaction.py \
        --lab /var/tmp/egress-kvm-lab/labN [--rounds 5]

Target: reaction <= 2 s. Measured figures and the machine's load go in the report it prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from e2e_stack import Stack, wait_until  # noqa: E402

from testbed import lab as labmod  # noqa: E402


def running(info: labmod.LabInfo, name: str) -> bool:
    return name in labmod.virsh(info, "host0", "list", "--name").split()


def destroy_once(st: Stack, info: labmod.LabInfo, name: str) -> tuple[float, float, float]:
    """One `virsh destroy`: seconds from calling it to the event line and to the domain started, and
    from its return (the domain is gone by then) to the event line."""
    proxy = "default/bench-events"
    events_before = len(st.log_msgs("instance event; reconciling its Proxy", proxy=proxy))
    started_before = len(st.log_msgs("KVM domain ensured running", name=name))
    t0 = time.time()  # before virsh: its own start-up (nsenter, connect) counts against the operator
    labmod.virsh(info, "host0", "destroy", name)
    t1 = time.time()
    ev = wait_until(lambda: st.log_msgs("instance event; reconciling its Proxy", proxy=proxy)[events_before:],
                    timeout=120, what="the reaction", interval=0.05)[0]
    started = wait_until(lambda: st.log_msgs("KVM domain ensured running", name=name)[started_before:],
                         timeout=120, what="the restart", interval=0.05)[0]
    return ev["ts"] - t0, started["ts"] - t0, ev["ts"] - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", required=True, help="state dir of a lab that is up (lab.json)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    info = labmod.LabInfo.load(args.lab)
    work = Path(tempfile.mkdtemp(prefix="events-reaction-"))
    st = Stack(info, work)
    st.start()
    rows: list[tuple[float, float, float]] = []
    try:
        st.kubectl.apply(st.proxy("bench-events"))  # type: ignore[union-attr]
        name = wait_until(lambda: (st.status("bench-events").get("instance") or {}).get("name"), timeout=900,
                          what="status.instance", interval=1)
        # Started by the operator (its start succeeded: a start can fail once on a loaded machine).
        wait_until(lambda: running(info, name) and st.log_msgs("KVM domain ensured running", name=name)
                   and st.log_msgs("lifecycle events subscribed", host="host0"), timeout=900,
                   what="the domain running and events subscribed", interval=1)
        for _ in range(args.rounds):
            rows.append(destroy_once(st, info, name))
            print(f"virsh destroy called -> event {rows[-1][0]:6.3f}s, -> started {rows[-1][1]:6.3f}s; "
                  f"virsh destroy returned -> event {rows[-1][2]:6.3f}s", flush=True)
            wait_until(lambda: running(info, name), timeout=120, what="running again", interval=0.5)
            time.sleep(2)
    finally:
        st.close()
    load = os.getloadavg()
    print(f"\n{len(rows)} rounds; reaction (event line) median {statistics.median(r[0] for r in rows):.3f}s, "
          f"max {max(r[0] for r in rows):.3f}s; domain started median "
          f"{statistics.median(r[1] for r in rows):.3f}s, max {max(r[1] for r in rows):.3f}s; from virsh's "
          f"return to the event line: median {statistics.median(r[2] for r in rows):.3f}s; "
          f"load average {load[0]:.1f} on {os.cpu_count()} CPUs; logs {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
