"""End to end: the real operator process + the Kubernetes API emulator + the hypervisor lab.

Nothing is faked below the Kubernetes API: `egress-kvm emulator` serves the API, real kubectl applies
and watches, `egress-kvm run` reconciles over SSH into the lab's libvirtd, real VMs boot under QEMU and
the test fetches a page through their tinyproxy. The steps share one stack and build on each other;
each prints its duration (`pytest -s` shows them, and the session ends with a summary table).

Software-emulated boots take minutes, so VMs that do not depend on each other boot at once, two at a
time: as soon as the first Proxy's base image is cached, step 1 starts step 3's second Proxy in the
background (`Background`), and once the first is Ready, step 4's (on host1); steps 3 and 4 join them.
The three repairs (2b destroy, 3b undefine with volumes gone, 3c DHCP address change) each break a
different VM, in two lanes. The table prints each background body's own duration beside the tests'.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from e2e_stack import (
    BOOT_TIMEOUT,
    CANARY,
    Background,
    Stack,
    domains,
    instance_of_volume,
    join_all,
    lab_base,
    log_records,
    timeout_with_boots,
    volumes,
    wait_until,
)

from testbed import lab as labmod
from testbed.lab import web

# Three boot waits in a row at most in one test: step 1 (the base image cached, the first Proxy Ready,
# then step 3's reuse check), and the 2b/3b lane of the repairs test (2b's Ready twice, then 3b's).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(timeout_with_boots(3600, boot_waits=3))]

FIRST, SECOND, FIXME = "lab-proxy-host0", "lab-proxy-host0-b", "lab-proxy-fixme"
# Two at a time: the steps are laid out so at most two software-emulated guests boot at once, one per
# core of the 2-core CI machine. A starved guest is slower than its share of the CPU (its timers and
# timeouts run on wall time): on a machine loaded by other work, guests had no DHCP lease after 10 min.
BAD_MACHINE_TYPE = "huge-e2e"


def image_downloads(lab: labmod.LabInfo) -> int:
    log = Path(lab.state_dir) / "host0" / "http-image.log"
    return sum('"GET /' in line for line in log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture(scope="module")
def stack(lab, tmp_path_factory):
    st = Stack(lab, tmp_path_factory.mktemp("e2e"))
    st.start()
    yield st
    st.close()
    print("\n=== e2e step times (tests run one after another; [bg]/[||] rows overlap them) ===")
    for step, seconds in list(st.times.items()):  # a copy: a background body may still be ending
        print(f"  {step:<66} {seconds:7.1f}s")
    tests = sum(v for k, v in list(st.times.items()) if k.startswith("test_"))
    print(f"  {'sum of the tests (wall time of the steps)':<66} {tests:7.1f}s")
    print(f"  logs: {st.workdir}")


@pytest.fixture
def step(stack, request):
    """Skip once an earlier step failed (they build on each other); time and record this one."""
    if stack.failed:
        pytest.skip(f"an earlier step failed ({stack.failed})")
    t0 = time.monotonic()
    yield stack
    name = request.node.name
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        stack.failed = name
    stack.times[name] = time.monotonic() - t0
    print(f"\ne2e {name}: {stack.times[name]:.1f}s")


def background(step, name: str, fn) -> None:  # type: ignore[no-untyped-def]
    """Run a step's body while the next steps run; the table gets its own duration when it ends."""
    def timed():  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            step.times[f"[bg] {name}"] = time.monotonic() - t0
    step.background[name] = Background(name, timed)


def test_step1_sample_proxy_goes_provisioning_running_ready(step):
    step.kubectl.apply(step.proxy(FIRST))
    # As soon as host0's base image is cached, the second Proxy can boot beside the first; it must still
    # reuse that base (step 3 checks: no second fetch, no second GET on the image server).
    wait_until(lambda: step.log_msgs("base image cached", host="host0"), timeout=BOOT_TIMEOUT,
               what="host0's base image cached", interval=0.5)
    downloads = image_downloads(step.lab)
    reuse_checked = threading.Event()
    background(step, "step3", lambda: step3_second_proxy(step, downloads=downloads, checked=reuse_checked))
    st = step.wait_ready(FIRST)
    phases = step.phases_logged(FIRST)
    assert [p for p in phases if p in ("Provisioning", "Running", "Ready")][:3] == [
        "Provisioning", "Running", "Ready"], phases
    assert st["instance"]["zone"] == "host0"
    assert st["ip"] in Path(step.lab.hosts[0].dnsmasq_leases).read_text()
    wanted = ["fetching base image into host pool", "base image cached"]
    msgs = [r["msg"] for r in log_records(step.all_log_lines())
            if r.get("msg") in wanted and r.get("host") == "host0"]
    assert msgs == wanted, msgs
    table = step.kubectl("get", "px", FIRST).stdout
    assert "Ready" in table and "True" in table and st["ip"] in table
    if len(step.lab.hosts) > 1:  # step 4's Proxy lives on host1: nothing it does touches host0's Proxies
        # Its base import GETs from the same image server: only once step 3 has counted the GETs.
        assert reuse_checked.wait(timeout=BOOT_TIMEOUT), "step 3 never checked the base reuse"
        background(step, "step4", lambda: step4_fail_then_fix(step))


def test_step2_fetch_through_the_vms_proxy(step):
    st = step.status(FIRST)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://{st['ip']}:3128"}))
    with opener.open(step.lab.http_target, timeout=30) as resp:
        body = resp.read().decode()
        via = resp.headers.get("Via", "")
    assert body == step.lab.http_target_body
    assert "egress-kvm-lab" in via  # tinyproxy as the user-data configured it, not a stray default


def step2b_destroyed_vm_restarted(step) -> None:  # type: ignore[no-untyped-def]
    """Issue 9 item 3: `virsh destroy` of the Ready Proxy's VM. The operator hears libvirt's lifecycle
    event (its subscription on the host connection), reconciles that Proxy at once and starts the VM;
    the Proxy is Ready again. Printed: the time from the destroy to the operator's first reaction (the
    reconcile the event triggered) and to the domain running again; target <= 2 s, not asserted (timed
    tests are not allowed). Asserted: the reaction came from the event, not a probe, refresh or resync."""
    name = step.status(FIRST)["instance"]["name"]
    subscribed = step.log_msgs("lifecycle events subscribed", host="host0")
    assert subscribed, "the operator has no lifecycle-event subscription on host0"
    before = len(step.log_msgs("instance event; reconciling its Proxy", proxy=f"default/{FIRST}"))
    restarted_before = step.log_msgs("KVM domain ensured running", name=name)
    ready_before = len(step.phases_logged(FIRST))
    t_destroy = time.time()
    labmod.virsh(step.lab, "host0", "destroy", name)
    t_returned = time.time()  # libvirt's destroy (QEMU stopped and reaped) takes seconds on a loaded machine

    def reacted() -> list[dict]:
        recs = step.log_msgs("instance event; reconciling its Proxy", proxy=f"default/{FIRST}")
        return recs[before:]
    [event_line, *_] = wait_until(reacted, timeout=60, what="the operator's reaction to the destroy",
                                  interval=0.1)
    assert (event_line["instance"], event_line["change"], event_line["detail"]) == (
        name, "Stopped", "destroyed")
    started = wait_until(
        lambda: step.log_msgs("KVM domain ensured running", name=name)[len(restarted_before):],
        timeout=60, what="the VM started again", interval=0.1)
    # The start came from the reconcile the event queued: logged after the event line (a probe needs
    # three failures in a row before it would have re-queued the Proxy).
    assert started[0]["ts"] >= event_line["ts"]
    reaction_s = event_line["ts"] - t_destroy
    started_s = started[0]["ts"] - t_destroy
    print(f"\nevents-driven repair: virsh destroy called -> operator reaction {reaction_s:.2f}s "
          f"({event_line['ts'] - t_returned:+.2f}s from virsh's return), -> domain started {started_s:.2f}s "
          "(target <= 2 s; shared 2-core machine, noisy)")
    assert "running" in labmod.virsh(step.lab, "host0", "domstate", name)
    # Ready again after the restart (not the Ready status written before it): the next step's event
    # wakes only a Proxy that is not in a restart loop. A boot's timeout: this reboot now shares the CPU
    # with 3c's (the other lane), where 300 s was set for a boot alone.
    wait_until(lambda: step.phases_logged(FIRST)[ready_before:].count("Ready"), timeout=BOOT_TIMEOUT,
               what="Ready again after the restart", interval=1)
    st = step.wait_ready(FIRST)
    assert st["instance"]["name"] == name  # the same VM, started again, not a new one
    # Events are written in the background, after the pass that records them: poll.
    wait_until(lambda: events_of(step, FIRST, "Restarted"), timeout=30, what="the Restarted Event",
               interval=0.5)


def test_step2c_a_paused_vm_is_resumed_on_its_event(step):
    """Issue 9 item 2: `virsh suspend` of the Ready Proxy's VM; the event queues the Proxy, the reconcile
    resumes the same QEMU process (same domain id, `running (unpaused)`), and the Proxy is Ready again."""
    name = step.status(FIRST)["instance"]["name"]
    dom_id = labmod.virsh(step.lab, "host0", "domid", name).strip()
    before = len(step.log_msgs("instance event; reconciling its Proxy", proxy=f"default/{FIRST}"))
    t0 = time.time()
    labmod.virsh(step.lab, "host0", "suspend", name)
    [line, *_] = wait_until(
        lambda: step.log_msgs("instance event; reconciling its Proxy", proxy=f"default/{FIRST}")[before:],
        timeout=60, what="the operator's reaction to the suspend", interval=0.1)
    assert (line["instance"], line["change"], line["detail"]) == (name, "Paused", "paused")
    resumed = wait_until(lambda: step.log_msgs("KVM domain resumed", name=name), timeout=60,
                         what="the VM resumed", interval=0.1)
    assert resumed[0]["ts"] >= line["ts"] and resumed[0]["pausedReason"] == "user"
    print(f"\npause repaired: suspend -> operator reaction {line['ts'] - t0:.2f}s, -> resumed "
          f"{resumed[0]['ts'] - t0:.2f}s")
    state = labmod.virsh(step.lab, "host0", "domstate", "--reason", name)
    assert "running (unpaused)" in state, state
    assert labmod.virsh(step.lab, "host0", "domid", name).strip() == dom_id  # the same process
    step.wait_ready(FIRST)


def step3_second_proxy(step, *, downloads: int, checked: threading.Event) -> None:  # type: ignore[no-untyped-def]
    """Applied once host0's base image is cached (while the first Proxy still boots). Once its VM is
    defined its overlay exists, so any fetch of the base it needed is over: the reuse is checked then
    (`checked` lets step 4's import, which GETs from the same server, begin only after that)."""
    try:
        step.kubectl.apply(step.proxy(SECOND))
        wait_until(lambda: (n := (step.status(SECOND).get("instance") or {}).get("name"))
                   and n in domains(step.lab, "host0"), timeout=BOOT_TIMEOUT,
                   what=f"Proxy {SECOND}'s VM defined on host0", interval=0.5)
        assert len(step.log_msgs("fetching base image into host pool", host="host0")) == 1
        assert image_downloads(step.lab) == downloads  # the lab's image server saw no second GET
    finally:
        checked.set()
    st = step.wait_ready(SECOND)
    assert st["instance"]["zone"] == "host0"
    assert st["instance"]["name"] != step.status(FIRST)["instance"]["name"]
    assert len(step.log_msgs("fetching base image into host pool", host="host0")) == 1


def step3b_undefined_vm_recreated(step) -> None:  # type: ignore[no-untyped-def]
    """Issue 9 item 2: the second Proxy's VM undefined and its overlay and seed deleted behind the
    operator's back (undefined while running, the volumes deleted, then destroyed: the domain is gone the
    moment it stops, so the operator never sees it half-removed). The events queue the Proxy; it is
    recreated under the same name with a `Recreated` Warning Event, boots and is Ready again."""
    name = step.status(SECOND)["instance"]["name"]
    before = len(step.log_msgs("instance event; reconciling its Proxy", proxy=f"default/{SECOND}"))
    labmod.virsh(step.lab, "host0", "undefine", name, "--nvram")
    def its_volumes() -> list[str]:
        return sorted(v for v in volumes(step.lab, "host0") if instance_of_volume(v) == name)
    gone = its_volumes()
    assert len(gone) == 2  # overlay and seed
    for vol in gone:
        labmod.virsh(step.lab, "host0", "vol-delete", "--pool", "default", vol)
    labmod.virsh(step.lab, "host0", "destroy", name)
    lines = wait_until(
        lambda: [r for r in step.log_msgs("instance event; reconciling its Proxy", proxy=f"default/{SECOND}")
                 [before:] if r["change"] == "Stopped"],
        timeout=60, what="the operator's reaction to the destroy", interval=0.2)
    assert lines[0]["instance"] == name
    wait_until(lambda: name in domains(step.lab, "host0"), timeout=120, what="the VM recreated", interval=0.5)
    assert its_volumes() == gone  # the same names: made again
    st = step.wait_ready(SECOND)
    assert st["instance"]["name"] == name
    recreated = wait_until(lambda: events_of(step, SECOND, "Recreated"), timeout=30,
                           what="the Recreated Event", interval=0.5)
    assert recreated and recreated[0]["type"] == "Warning" and name in recreated[0]["message"], recreated


def step3c_dhcp_address_followed(step, proxy: str) -> None:  # type: ignore[no-untyped-def]
    """Issue 9 item 2: the Proxy's VM gets another address from the LAN's DHCP server (the guest,
    through its agent, releases its lease and asks dnsmasq for a free address of the range). The NIC's
    clean-traffic filter still allows only the first address libvirt learned, so the host gets no answer
    from the new one: the operator sees the VM stranded, defines it afresh (`Readdressed` Warning; new
    UUID, same name), and the filter learns the lease dnsmasq gives at boot. status.ip and the endpoint
    follow, Ready on the new address, a page fetched through it."""
    old = step.status(proxy)
    name, zone = old["instance"]["name"], old["instance"]["zone"]
    uuid = labmod.virsh(step.lab, zone, "domuuid", name).strip()
    leases = Path(step.lab.host(zone).dnsmasq_leases).read_text()
    base = old["ip"].rsplit(".", 1)[0]
    new_ip = next(f"{base}.{i}" for i in range(199, 99, -1) if f" {base}.{i} " not in leases)
    # The running dhclient (ifupdown's) releases the lease, so dnsmasq forgets it; the same command with a
    # config asking for `new_ip` (DHCP option 50) takes it, which dnsmasq grants when it is free, and
    # records it in ifupdown's lease file: the guest's own DHCP state is the new lease, as after a change
    # made by the server.
    script = ("set -e; dev=$(ip -o -4 addr show | awk '$2 != \"lo\" {print $2; exit}'); "
              "running=$(ps -o args= -C dhclient | head -1); test -n \"$running\"; $running -r; "
              "cp /etc/dhcp/dhclient.conf /run/e2e-dhclient.conf; "
              f"echo 'send dhcp-requested-address {new_ip};' >> /run/e2e-dhclient.conf; "
              "${running/dhclient /dhclient -cf /run/e2e-dhclient.conf } </dev/null >/dev/null 2>&1; "
              "ip -o -4 addr show dev $dev")
    # (dhclient stays as a daemon: its output goes to /dev/null, or the agent would wait for the pipe.)
    code, out = guest_run(step.lab, zone, name, script)
    assert code == 0 and new_ip in out, out
    t0 = time.monotonic()
    st = wait_until(
        lambda: (s := step.status(proxy)).get("ip") == new_ip and s.get("phase") == "Ready" and s,
        timeout=60 + BOOT_TIMEOUT, what=f"status.ip {new_ip} and Ready", interval=2)  # a reboot in it
    print(f"\nIP change {old['ip']} -> {new_ip}: status followed, Ready again after "
          f"{time.monotonic() - t0:.1f}s")
    assert new_ip in st["endpoint"] and st["instance"]["name"] == name
    assert labmod.virsh(step.lab, zone, "domuuid", name).strip() != uuid  # defined afresh
    readdressed = wait_until(lambda: events_of(step, proxy, "Readdressed"), timeout=30,
                             what="the Readdressed Event", interval=0.5)
    assert readdressed and readdressed[0]["type"] == "Warning" and new_ip in readdressed[0]["message"]
    # The zone's own target: the root namespace does not forward between hosts, so a host1 VM cannot reach
    # host0's (step.lab.http_target).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://{new_ip}:3128"}))
    with opener.open(step.lab.host(zone).http_target, timeout=30) as resp:
        assert resp.read().decode() == web.target_body(index=step.lab.index, host=zone)


def guest_run(lab: labmod.LabInfo, host: str, name: str, script: str, *, limit: float = 120.0,
              ) -> tuple[int, str]:
    """Run a bash script in the guest through its agent (guest-exec): exit code and stdout."""
    start = json.dumps({"execute": "guest-exec", "arguments": {
        "path": "/bin/bash", "arg": ["-c", script], "capture-output": True}})
    pid = json.loads(labmod.virsh(lab, host, "qemu-agent-command", name, start))["return"]["pid"]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        status = json.loads(labmod.virsh(lab, host, "qemu-agent-command", name, json.dumps(
            {"execute": "guest-exec-status", "arguments": {"pid": pid}})))["return"]
        if status.get("exited"):
            out = base64.b64decode(status.get("out-data", "")).decode()
            err = base64.b64decode(status.get("err-data", "")).decode()
            return int(status.get("exitcode", -1)), out + err
        time.sleep(1)
    raise AssertionError(f"guest script did not finish within {limit}s: {script}")


def step4_fail_then_fix(step) -> None:  # type: ignore[no-untyped-def]
    """An unknown machine type fails with a message naming it and no VM; the fixed spec boots Ready."""
    zone = "host1" if len(step.lab.hosts) > 1 else "host0"
    step.kubectl.apply(step.proxy(FIXME, zone=zone, machine_type=BAD_MACHINE_TYPE))
    st = wait_until(lambda: (s := step.status(FIXME)).get("phase") == "Failed" and s, timeout=120,
                    what=f"Proxy {FIXME} Failed", interval=1)
    assert BAD_MACHINE_TYPE in st.get("message", ""), st
    others = {(step.status(n).get("instance") or {}).get("name") for n in (FIRST, SECOND)}
    assert not [d for d in domains(step.lab, zone) if d not in others]
    step.kubectl("patch", "px", FIXME, "--type=merge", "-p", '{"spec":{"placement":{"machineType":"small"}}}')
    st = step.wait_ready(FIXME)
    assert st["instance"]["zone"] == zone
    assert st["instance"]["name"] in domains(step.lab, zone)


def test_step3_second_proxy_reuses_the_cached_base(step):
    step.background["step3"].result()


def test_step4_unknown_machine_type_fails_then_a_fixed_spec_is_ready(step):
    if "step4" in step.background:
        step.background["step4"].result()
    else:  # a one-host lab: its Proxies would share host0 with step 1's, so it runs now
        step4_fail_then_fix(step)


def test_step2b_3b_3c_repairs_of_three_vms_two_at_a_time(step):
    """2b destroys the first Proxy's VM, 3b undefines the second's with its volumes, 3c moves the third
    (step 4's) to another DHCP address: each checked as if alone (its own Events and log lines, selected
    by Proxy and instance). Two lanes, so at most two guests boot at once (see the note by FIRST): 3c
    (the longest: detection, then a reboot) beside 2b then 3b."""
    lanes(step, [
        [("step3c DHCP address change followed (FIXME)", lambda: step3c_dhcp_address_followed(step, FIXME))],
        [("step2b destroyed VM restarted (FIRST)", lambda: step2b_destroyed_vm_restarted(step)),
         ("step3b undefined VM, volumes gone, recreated (SECOND)",
          lambda: step3b_undefined_vm_recreated(step))],
    ])


def lanes(step, plan) -> None:  # type: ignore[no-untyped-def]
    """Run each lane (a list of named step bodies, one after another) in its own thread; every body is
    timed in the table; the first failure in a lane ends that lane, and the test fails naming it."""
    def run(lane):  # type: ignore[no-untyped-def]
        for name, fn in lane:
            t0 = time.monotonic()
            try:
                fn()
            except BaseException as e:
                raise AssertionError(f"{name}: {e}") from e
            finally:
                step.times[f"[||] {name}"] = time.monotonic() - t0
    tasks = [Background(f"lane {i}", lambda lane=lane: run(lane)) for i, lane in enumerate(plan)]
    for task in tasks:  # Stack.close() waits for them too, should this test be interrupted (its timeout)
        step.background[task.name] = task
    join_all(tasks)


def events_of(step, proxy: str, reason: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """The Proxy's Events with this reason, as the API server has them now."""
    out = step.kubectl("get", "events", "--field-selector", f"involvedObject.name={proxy}", "-o", "json")
    return [e for e in json.loads(out.stdout)["items"] if e.get("reason") == reason]


def unhealthy_events(step, proxy: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """The Proxy's Unhealthy Events, by name, with how often each was seen (a repeat bumps `count`)."""
    return {e["metadata"]["name"]: int(e.get("count") or 1) for e in events_of(step, proxy, "Unhealthy")}


def test_step5_orphan_gc_removes_a_vm_whose_proxy_vanished(step):
    inst = step.status(FIXME)["instance"]
    name, zone = inst["name"], inst["zone"]
    # Earlier steps may have turned the live Proxies unhealthy on purpose (2b, 2c, 3b): only
    # Unhealthy Events the restart adds count, so take stock of them first, once the old operator has
    # stopped (its Events are written in the background: the stop drains them).
    assert step.operator.stop() == 0
    unhealthy_before = {other: unhealthy_events(step, other) for other in (FIRST, SECOND)}
    step.kubectl("patch", "px", FIXME, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    step.kubectl("delete", "px", FIXME, "--wait=false")
    wait_until(lambda: step.kubectl.get("px", FIXME) is None, timeout=30, what=f"Proxy {FIXME} gone")
    assert name in domains(step.lab, zone)  # nobody has touched the VM yet
    step.start_operator()

    def collected() -> bool:
        vols = volumes(step.lab, zone)
        gone = name not in domains(step.lab, zone)
        return gone and not [v for v in vols if instance_of_volume(v) == name]
    wait_until(collected, timeout=300, what=f"orphan GC of {name} on {zone}", interval=2)
    for other in (FIRST, SECOND):  # live Proxies' VMs are untouched
        assert step.status(other)["instance"]["name"] in domains(step.lab, "host0")

    # The restart did not flap the live Proxies: the new process probes them itself and they stay Ready
    # throughout (no Ready -> Running -> Ready, so no phase change logged and no Unhealthy Event).
    new_op = step.operator

    def probed_twice() -> bool:
        recs = log_records(new_op.log_lines())
        return all(sum(1 for r in recs if r.get("msg") == "health probe" and r.get("ok") is True
                       and r.get("proxy") == f"default/{n}") >= 2 for n in (FIRST, SECOND))
    wait_until(probed_twice, timeout=120, what="the restarted operator probing the live Proxies", interval=2)
    for other in (FIRST, SECOND):
        assert step.status(other)["phase"] == "Ready"
        changed = [r for r in log_records(new_op.log_lines())
                   if r.get("msg") == "phase changed" and r.get("proxy") == f"default/{other}"]
        assert not changed, changed
        assert unhealthy_events(step, other) == unhealthy_before[other], (other, unhealthy_before[other])


def test_step6_deleting_proxies_removes_vms_keeps_the_base(step):
    names = {n: step.status(n)["instance"]["name"] for n in (FIRST, SECOND)}
    step.kubectl("delete", "px", "--all", "--wait=true", "--timeout=300s", timeout=330)
    wait_until(lambda: not step.kubectl("get", "px", "-o", "name").stdout.strip(), timeout=60,
               what="all Proxies gone")
    for h in step.lab.hosts:
        assert domains(step.lab, h.name) == []
        vols = set(volumes(step.lab, h.name))
        assert not {v for v in vols if any(v.startswith(n) for n in names.values())}, vols
        assert vols <= set(lab_base(step.lab)), vols
    assert set(volumes(step.lab, "host0")) == set(lab_base(step.lab))


def test_step7_debug_logs_have_rpc_lines_and_never_the_user_data(step):
    assert step.operator.stop() == 0
    lines = step.all_log_lines()
    records = log_records(lines)
    not_json = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("{")]
    assert not not_json, f"log lines that are not JSON: {not_json[:3]}"
    rpc = [r for r in records if r.get("logger") == "kvm.libvirt" and r.get("msg") == "libvirt call"]
    assert rpc, "no per-RPC debug lines"
    assert all("method" in r and "duration" in r for r in rpc)
    methods = {r["method"] for r in rpc}
    assert {"domain_define_xml", "storage_vol_upload"} & methods or len(methods) > 5, methods
    user_data = step.sample["spec"]["cloudInit"]["userData"]
    secret_lines = [ln.strip() for ln in user_data.splitlines() if len(ln.strip()) > 12]
    leaks = [ln for ln in lines if CANARY in ln or any(s in ln for s in secret_lines)]
    assert not leaks, leaks[:3]
    print(f"\n{len(lines)} operator log lines, {len(rpc)} libvirt call lines, methods: {sorted(methods)}")
