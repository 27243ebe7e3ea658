"""A Proxy deleted while its providers-file entry is missing is never let go with its VM left running
(issue 9 item 7): the real operator process, the API emulator, real kubectl and the lab's libvirtd.

The operator reads a copy of the lab's providers file, which the test rewrites as a user's `kubectl
edit` of the ConfigMap would: the entry removed (`providers: []`, what an old install's upgrade reset it
to), the Proxy deleted: it stays `Deleting` with reason DeleteBlocked and a Warning Event naming the
entry, its finalizer kept and its VM still defined and running on the host. The entry put back, the
operator re-evaluates on the file change: the VM and its volumes go, then the Proxy. No guest needs to
boot for this: the VM only has to exist.
"""

from __future__ import annotations

import json
import shutil
import time
from typing import Any

import pytest
import yaml
from e2e_stack import Stack, domains, instance_of_volume, log_records, volumes, wait_until

from egress_kvm.kube.interfaces import FINALIZER
from testbed import lab as labmod

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

NAME = "blocked-delete"
TIMEOUT = 300  # an image import on a fresh lab, a poll of the providers file, a reconcile


def ready_reason(st: Stack) -> str | None:
    conds = [c for c in st.status(NAME).get("conditions", []) if c.get("type") == "Ready"]
    return conds[0].get("reason") if conds else None


def warnings(st: Stack, reason: str) -> list[dict[str, Any]]:
    assert st.kubectl is not None
    items = json.loads(st.kubectl("get", "events", "-n", "default", "-o", "json").stdout).get("items", [])
    return [e for e in items if e.get("reason") == reason and e.get("type") == "Warning"
            and (e.get("involvedObject") or {}).get("name") == NAME]


def reloads(st: Stack) -> int:
    return sum(r.get("msg") == "providers config reloaded" for r in log_records(st.all_log_lines()))


def test_delete_blocked_while_the_entry_is_missing_then_proceeds_when_it_is_back(lab, tmp_path):
    t0 = time.monotonic()
    providers = tmp_path / "providers.yaml"
    shutil.copyfile(lab.providers_file, providers)
    original = providers.read_text()
    entry = yaml.safe_load(original)["providers"][0]["name"]
    st = Stack(lab, tmp_path, providers_file=str(providers))
    st.start()
    try:
        assert st.kubectl is not None
        st.kubectl.apply(st.proxy(NAME))

        def defined() -> str | None:
            inst = (st.status(NAME).get("instance") or {}).get("name")
            return inst if inst and inst in domains(lab, "host0") else None
        vm = wait_until(defined, timeout=TIMEOUT, what=f"{NAME}'s VM defined on host0", interval=2)
        t_created = time.monotonic()

        doc = yaml.safe_load(original)
        doc["providers"] = []
        before = reloads(st)
        providers.write_text(yaml.safe_dump(doc, sort_keys=False))
        wait_until(lambda: reloads(st) > before, timeout=60, what="the operator to reload the providers file")
        st.kubectl("delete", "px", NAME, "--wait=false")
        wait_until(lambda: ready_reason(st) == "DeleteBlocked", timeout=TIMEOUT, what="DeleteBlocked",
                   interval=1)
        obj = st.kubectl.get("px", NAME)
        assert obj is not None and FINALIZER in obj["metadata"]["finalizers"]
        assert obj["status"]["phase"] == "Deleting"
        assert vm in domains(lab, "host0")
        assert "running" in labmod.virsh(lab, "host0", "domstate", vm)
        # Events are written in the background, after the status of the pass that records them: poll.
        found = wait_until(lambda: warnings(st, "DeleteBlocked"), timeout=30,
                           what="the DeleteBlocked Warning Event", interval=0.5)
        message = found[0]["message"]
        assert f"provider {entry!r} is not in the providers file" in message and vm in message
        assert f"kubectl patch px {NAME} -n default --type=json" in message
        print(f"\n[delete blocked] {obj['status']['message'][:160]}...")
        time.sleep(5)  # a few more seconds: still blocked, nothing deleted (retries are minutes apart)
        assert st.kubectl.get("px", NAME) is not None and vm in domains(lab, "host0")

        before = reloads(st)
        providers.write_text(original)
        t_restored = time.monotonic()
        wait_until(lambda: reloads(st) > before, timeout=60, what="the operator to reload the providers file")
        wait_until(lambda: st.kubectl.get("px", NAME) is None, timeout=TIMEOUT,  # type: ignore[union-attr]
                   what="the Proxy gone once its entry is back", interval=1)
        assert vm not in domains(lab, "host0")
        assert not [v for v in volumes(lab, "host0") if instance_of_volume(v) == vm]
        print(f"[entry restored] Proxy and VM gone {time.monotonic() - t_restored:.1f}s after the file "
              f"was restored; create took {t_created - t0:.0f}s; test {time.monotonic() - t0:.0f}s "
              "(shared cores)")
    finally:
        st.close()
