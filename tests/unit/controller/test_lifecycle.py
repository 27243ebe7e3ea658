"""The phase machine end to end: Controller + in-memory Kubernetes + fake provider + a real local proxy.

Each test plays what a user (kubectl) and the world (a VM shut off, a host unreachable) do, and watches
the Proxy's status and Events the way `kubectl get px -w` and `kubectl describe px` would.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from egress_kvm.controller.status import get_condition
from egress_kvm.controller.verdict import ProbeKey
from egress_kvm.kube.interfaces import FINALIZER
from egress_kvm.policy.secrets import USABLE
from egress_kvm.providers.base import PowerState, QuotaError, TransientError

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy, TargetServer

KEY = ("default", "px1")


def spec_for(proxy: MiniProxy, target: TargetServer | None = None, **extra: object) -> dict:
    spec: dict = {"mode": "Managed", "provider": "kvm-home",
                  "placement": {"zone": "nas1", "machineType": "small", "image": "debian-13"},
                  "port": proxy.port, "cloudInit": {"userData": "#cloud-config\nruncmd: [tinyproxy]\n"},
                  "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 2}}
    if target is not None:
        spec["healthCheck"]["url"] = target.url
    spec.update(extra)
    return spec


def phase(kube: FakeKube, key: tuple[str, str] = KEY) -> str | None:
    obj = kube.objects.get(key)
    return (obj.get("status") or {}).get("phase") if obj else None


def cond(kube: FakeKube, type_: str, key: tuple[str, str] = KEY) -> dict:
    return get_condition(kube.status(key), type_) or {}


async def test_proxy_goes_provisioning_running_ready_with_ip_and_probe_through_proxy(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, target: TargetServer,
        make_controller) -> None:
    phases: list[str] = []
    statuses: list[dict] = []
    kube.watch(lambda kind, obj: phases.append((obj.get("status") or {}).get("phase")))
    kube.watch(lambda kind, obj: statuses.append(dict(obj.get("status") or {})))
    make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server, target))
    await eventually(lambda: phase(kube) == "Ready", what="Ready")
    await eventually(lambda: "Ready" in phases, what="the Ready write's watch event")  # delivered call_soon
    # No verdict yet, no Healthy condition: HEALTHY stays blank while Provisioning/Running (spec's sample).
    early = [st for st in statuses if st.get("phase") in ("Provisioning", "Running")]
    assert early and all(get_condition(st, "Healthy") is None for st in early), early

    obj = kube.objects[KEY]
    st = obj["status"]
    assert FINALIZER in obj["metadata"]["finalizers"]
    assert st["ip"] == "127.0.0.1"
    assert st["endpoint"] == f"http://127.0.0.1:{proxy_server.port}"
    assert st["healthy"] is True
    assert st["observedGeneration"] == 1
    assert st["instance"]["name"].startswith("proxy-") and st["instance"]["zone"] == "nas1"
    assert st["lastProbeTime"].endswith("Z")
    assert cond(kube, "Ready")["status"] == "True"
    assert cond(kube, "Healthy")["status"] == "True"
    assert cond(kube, "Healthy")["reason"] == "ProbeSucceeded"
    assert provider.names() == {st["instance"]["name"]}
    assert target.hits >= 2  # successThreshold 2: fetched through the proxy at least twice
    seen = [p for i, p in enumerate(phases) if p and (i == 0 or phases[i - 1] != p)]
    assert seen[:3] == ["Provisioning", "Running", "Ready"], seen
    reasons = kube.reasons("px1")
    assert reasons.index("Created") < reasons.index("Running") < reasons.index("Ready")


async def test_unhealthy_after_failure_threshold_then_ready_again(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)  # no URL: TCP connect probe
    spec["healthCheck"].update(failureThreshold=2, successThreshold=2)
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    await proxy_server.stop()
    await eventually(lambda: phase(kube) == "Running", what="Running after probe failures")
    assert kube.status(KEY)["healthy"] is False
    assert cond(kube, "Healthy")["reason"] == "ProbeFailed"
    assert "TCP connect to 127.0.0.1" in cond(kube, "Healthy")["message"]
    assert cond(kube, "Ready")["reason"] == "Unhealthy"
    assert "Unhealthy" in kube.reasons("px1")
    await proxy_server.start()
    await eventually(lambda: phase(kube) == "Ready", what="Ready again")
    assert len(provider.names()) == 1  # an unhealthy proxy is not replaced


async def test_spec_error_fails_naming_the_field_and_is_not_retried_until_generation_changes(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    spec["placement"]["machineType"] = "huge"
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Failed")
    st = kube.status(KEY)
    assert "spec.placement" in st["message"] and "'huge'" in st["message"], st["message"]
    assert cond(kube, "Ready")["reason"] == "InvalidPlacement"  # what `kubectl get px` shows as REASON
    # The Event is written after the status (its own request): wait for it, not for the status alone.
    await eventually(lambda: ("Warning", "Failed", st["message"]) in kube.events_for("px1"), what="Event")
    assert provider.names() == set()
    await eventually(lambda: len(c.queue) == 0 and not c.queue.processing())

    writes = kube.status_writes
    calls = len(provider.calls)
    for _ in range(3):
        c.enqueue(KEY)  # resyncs
    await eventually(lambda: len(c.queue) == 0 and not c.queue.processing())
    assert kube.status_writes == writes and len(provider.calls) == calls  # not retried

    spec["placement"]["machineType"] = "small"
    kube.set_spec(KEY, spec)
    await eventually(lambda: phase(kube) == "Ready")
    assert kube.status(KEY)["observedGeneration"] == 2


@pytest.mark.parametrize(("change", "fragment"), [
    ({"provider": "nope"}, "spec.provider: 'nope' is not in the providers file (configured: kvm-home)"),
    ({"placement": {"zone": "nas9"}}, "spec.placement: zone 'nas9'"),
    ({"placement": {"image": "ftp://x/y.img"}}, "spec.placement: image 'ftp://x/y.img'"),
    ({"cloudInit": {"userData": "x", "secretRef": {"name": "s", "key": "k"}}},
     "spec.cloudInit: set userData or secretRef, not both"),
    ({"mode": "External"}, "spec.external.address: is required in External mode"),
])
async def test_failed_messages_name_the_offending_value(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller, change: dict,
        fragment: str) -> None:
    make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server) | change)
    await eventually(lambda: phase(kube) == "Failed")
    assert fragment in kube.status(KEY)["message"]


async def test_providers_file_change_retries_a_failed_proxy(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Failed")
    assert "'kvm-home' is not in the providers file (configured: none)" in kube.status(KEY)["message"]
    c.update_providers({"kvm-home": provider}, "hash2")
    await eventually(lambda: phase(kube) == "Ready")


async def test_missing_cloud_init_secret_is_pending_then_proceeds(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider})
    ref = {"secretRef": {"name": "ci", "key": "user-data"}}
    kube.create_proxy("px1", spec_for(proxy_server, cloudInit=ref))
    await eventually(lambda: phase(kube) == "Pending")
    assert "waiting for Secret default/ci" in kube.status(KEY)["message"]
    assert cond(kube, "Ready")["reason"] == "Waiting"
    assert provider.names() == set()
    kube.put_secret("default", "ci", {"other": b"x"}, labels=USABLE)
    await eventually(lambda: "waiting for key 'user-data'" in kube.status(KEY).get("message", ""))
    kube.put_secret("default", "ci", {"user-data": b"#cloud-config\nSECRET-USERDATA\n"}, labels=USABLE)
    await eventually(lambda: phase(kube) == "Ready")  # retried on its own, no event needed
    name = kube.status(KEY)["instance"]["name"]
    assert provider.user_data[name] == b"#cloud-config\nSECRET-USERDATA\n"


async def test_vm_found_shut_off_is_started_again_with_an_event(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    for i, state in enumerate((PowerState.STOPPED, PowerState.CRASHED, PowerState.PAUSED)):
        provider.power(name, state, "I/O error" if state is PowerState.PAUSED else "")
        c.enqueue(KEY)
        await eventually(lambda i=i: kube.reasons("px1").count("Restarted") == i + 1)
        assert provider.vms[("nas1", name)].power_state is PowerState.RUNNING
        await eventually(lambda: phase(kube) == "Ready")  # a new stop after Ready is a new streak
    restarted = [m for t, r, m in kube.events_for("px1") if r == "Restarted"]
    assert len(restarted) == 3 and all(t == "Warning" for t, r, _ in kube.events_for("px1")
                                       if r == "Restarted")
    assert f"instance {name} was Paused (I/O error); started it" in restarted
    assert provider.names() == {name}  # started, not recreated
    await eventually(lambda: phase(kube) == "Ready")


async def test_vm_that_vanished_is_recreated_with_a_warning(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    provider.vanish(name)
    c.enqueue(KEY)
    await eventually(lambda: "Recreated" in kube.reasons("px1"), what="Recreated event")
    assert name in provider.names()
    await eventually(lambda: phase(kube) == "Ready")


async def test_unreachable_host_sets_a_condition_and_never_recreates(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    provider.unreachable.add("nas1")
    c.enqueue(KEY)
    await eventually(lambda: cond(kube, "HostReachable").get("status") == "False")
    # several backoff retries happen while unreachable; none of them may create or delete
    await eventually(lambda: sum(1 for op, _ in provider.calls if op == "get") >= 5)
    assert not [op for op, _ in provider.calls if op in ("create", "delete", "start")][1:]
    st = kube.status(KEY)
    assert "zone nas1 unreachable" in st["message"]
    assert st["phase"] == "Ready"  # the VM still answers its probes directly
    await proxy_server.stop()  # ...until it does not: Ready follows Healthy even while the host is away
    await eventually(lambda: phase(kube) == "Running")
    assert cond(kube, "HostReachable")["status"] == "False"
    await proxy_server.start()
    provider.unreachable.clear()
    await eventually(lambda: cond(kube, "HostReachable").get("status") == "True")
    assert provider.names() == {name}


async def test_quota_error_backs_off_slowly_with_a_message(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    provider.capacity = 0
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: "out of capacity" in kube.status(KEY).get("message", ""))
    assert cond(kube, "Ready")["reason"] == "QuotaExceeded"
    # The Event and the backoff follow the status write within the same reconcile: wait for them.
    await eventually(lambda: "QuotaExceeded" in kube.reasons("px1"), what="QuotaExceeded Event")
    await eventually(lambda: c.queue.failures(KEY) >= 1, what="the failure counted")
    # Retries of the same shortage neither rewrite status nor repeat the Event.
    await eventually(lambda: sum(1 for op, _ in provider.calls if op == "create") >= 3)
    writes = kube.status_writes
    await eventually(lambda: sum(1 for op, _ in provider.calls if op == "create") >= 6)
    assert kube.status_writes == writes
    assert kube.reasons("px1").count("QuotaExceeded") == 1
    provider.capacity = None
    await eventually(lambda: phase(kube) == "Ready")


async def test_delete_removes_the_vm_then_the_finalizer(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    phases: list[str] = []
    kube.watch(lambda kind, obj: phases.append((obj.get("status") or {}).get("phase")))
    kube.delete(KEY)
    await eventually(lambda: KEY not in kube.objects, what="Proxy gone")
    assert provider.names() == set()
    assert ("delete", name) in provider.calls
    assert "Deleting" in phases
    assert ("Normal", "Deleted", f"deleted instance {name} on nas1") in kube.events_for("px1")


async def test_delete_with_provider_removed_from_config_is_blocked_until_the_entry_is_back(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """Dropping the finalizer would leak the VM (issue 9 item 7): the Proxy stays DeleteBlocked with a
    Warning naming the entry, and the providers file's return lets the delete proceed."""
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    c.update_providers({}, "empty")
    await eventually(lambda: phase(kube) == "Failed")
    kube.delete(KEY)
    await eventually(lambda: cond(kube, "Ready").get("reason") == "DeleteBlocked", what="DeleteBlocked")
    assert kube.objects[KEY]["metadata"]["finalizers"] == [FINALIZER]
    assert phase(kube) == "Deleting"
    assert provider.names() == {name}  # the VM is still there, not forgotten
    warnings = [m for t, r, m in kube.events_for("px1") if t == "Warning" and r == "DeleteBlocked"]
    assert len(warnings) == 1
    assert "provider 'kvm-home' is not in the providers file" in warnings[0] and name in warnings[0]
    assert "kubectl patch px px1 -n default --type=json" in warnings[0]
    assert "kubectl patch px px1" in kube.status(KEY)["message"]
    c.update_providers({"kvm-home": provider}, "back")  # re-evaluates every Proxy at once
    await eventually(lambda: KEY not in kube.objects, what="Proxy gone once the entry is back")
    assert provider.names() == set()
    assert ("Normal", "Deleted", f"deleted instance {name} on nas1") in kube.events_for("px1")


async def test_a_host_that_answers_with_an_error_is_not_reported_unreachable(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """A libvirt error from a host that answered (storage, a busy job) is retried, but HostReachable is
    about the link only: it stays True and the message does not say the zone is unreachable."""
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    real_get = provider.get

    async def busy(name: str, zone: str, *, owner_uid: str | None = None):  # type: ignore[no-untyped-def]
        provider.calls.append(("get", name))
        raise TransientError(f"host {zone!r}: lookup {name!r} failed: cannot acquire state change lock")

    provider.get = busy  # type: ignore[method-assign]
    c.enqueue(KEY)
    await eventually(lambda: "cannot acquire state change lock" in kube.status(KEY).get("message", ""))
    st = kube.status(KEY)
    assert st["message"].startswith("retrying: ") and "unreachable" not in st["message"]
    assert cond(kube, "HostReachable")["status"] == "True"
    assert phase(kube) == "Ready"
    provider.get = real_get  # type: ignore[method-assign]
    await eventually(lambda: kube.status(KEY).get("message", "").startswith("healthy"))


async def test_delete_never_goes_to_another_providers_host_of_the_same_name(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """Host names are unique only within a provider. With the Proxy's provider removed from the file,
    another provider's `nas1` is not where its VM is: the delete must not be sent there and reported
    done; the deletion is blocked naming the missing entry, until the finalizer is removed by hand."""
    other = FakeProvider("kvm-other", zones=("nas1",))
    c = make_controller({"kvm-home": provider, "kvm-other": other})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    assert kube.status(KEY)["instance"]["provider"] == "kvm-home"
    c.update_providers({"kvm-other": other}, "without kvm-home")
    kube.delete(KEY)
    await eventually(lambda: "DeleteBlocked" in kube.reasons("px1"))
    assert ("delete", name) not in other.calls
    assert "Deleted" not in kube.reasons("px1")
    warnings = [m for t, r, m in kube.events_for("px1") if r == "DeleteBlocked"]
    assert name in warnings[0] and "'kvm-home'" in warnings[0]
    kube.force_remove(KEY)  # the escape hatch: the user removes the finalizer by hand
    assert provider.names() == {name}  # nothing deleted it: that is what the user took on


@pytest.mark.parametrize("to_external", [False, True], ids=["replaced", "switched-to-external"])
async def test_an_instance_whose_entry_is_gone_is_kept_until_the_entry_is_back(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller,
        to_external: bool) -> None:
    """A replacement or a switch to External used to drop an instance whose providers-file entry was
    gone from status with a ProviderMissing Warning, leaking its VM: it stays as previousInstance, and
    the entry's return deletes it."""
    other = FakeProvider("kvm-b", zones=("nas1",))
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    c.update_providers({"kvm-b": other}, "kvm-home gone")
    if to_external:
        spec = {"mode": "External", "external": {"address": f"127.0.0.1:{proxy_server.port}"},
                "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 2}}
    else:
        spec = {**spec_for(proxy_server), "provider": "kvm-b"}
    kube.set_spec(KEY, spec)
    await eventually(lambda: "ProviderMissing" in kube.reasons("px1"), what="ProviderMissing")
    await eventually(lambda: phase(kube) == "Ready", what="Ready on the new spec")
    assert kube.status(KEY)["previousInstance"]["name"] == name
    assert provider.names() == {name} and ("delete", name) not in provider.calls
    type_, warning = next((t, m) for t, r, m in kube.events_for("px1") if r == "ProviderMissing")
    assert type_ == "Warning" and name in warning and "'kvm-home'" in warning and "kept" in warning
    c.update_providers({"kvm-b": other, "kvm-home": provider}, "kvm-home back")
    await eventually(lambda: "previousInstance" not in kube.status(KEY), what="previous deleted")
    assert provider.names() == set()


async def test_a_blocked_delete_deletes_and_announces_what_it_can_once(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The instance whose entry is there goes on the first pass; the retries while the other one's entry
    is missing neither delete it again nor record another Normal Deleted, and status names only what is
    left."""
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    kube.objects[KEY]["status"]["previousInstance"] = {"name": "proxy-elsewhere", "zone": "nas9",
                                                       "provider": "kvm-gone"}
    kube.delete(KEY)
    await eventually(lambda: "DeleteBlocked" in kube.reasons("px1"), what="DeleteBlocked")
    for _ in range(2):  # two more blocked passes, as the slow retry or a providers change runs them
        await c.reconciler.reconcile(KEY)
    assert [c_ for c_ in provider.calls if c_ == ("delete", name)] == [("delete", name)]
    assert kube.reasons("px1").count("Deleted") == 1
    left = kube.status(KEY)
    assert left["instance"]["name"] == "proxy-elsewhere" and "previousInstance" not in left


async def test_delete_while_host_unreachable_waits_and_keeps_the_finalizer(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    provider.unreachable.add("nas1")
    kube.delete(KEY)
    await eventually(lambda: "retrying" in kube.status(KEY).get("message", ""))
    assert kube.objects[KEY]["metadata"]["finalizers"] == [FINALIZER]
    assert phase(kube) == "Deleting"
    provider.unreachable.clear()
    await eventually(lambda: KEY not in kube.objects)
    assert provider.names() == set()


async def test_status_conflicts_are_survived(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """Conflicting writes are retried; and a status computed from generation 1 is never stored once the
    spec is at generation 2 (the fake, like the client, refuses it: SpecChanged), so what status says it
    observed is what it evaluated."""
    kube.inject_conflicts = 3
    provider.hold_create = asyncio.Event()
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    kube.create_proxy("px1", spec)
    await provider.create_started.wait()
    kube.set_spec(KEY, {**spec, "placement": {**spec["placement"], "machineType": "large"}})
    provider.hold_create.set()
    await eventually(lambda: phase(kube) == "Ready" and kube.status(KEY)["observedGeneration"] == 2
                     and "previousInstance" not in kube.status(KEY))
    assert kube.conflicts >= 3
    assert kube.stale_rejected >= 1  # the write computed from generation 1 after the edit
    assert provider.names() == {kube.status(KEY)["instance"]["name"]}


async def test_external_mode_is_running_then_ready_by_probes_only(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, target: TargetServer,
        make_controller) -> None:
    make_controller({"kvm-home": provider})
    spec = {"mode": "External", "external": {"address": f"127.0.0.1:{proxy_server.port}"},
            "healthCheck": {"url": target.url, "intervalSeconds": 1}}
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Running")
    await eventually(lambda: phase(kube) == "Ready")
    st = kube.status(KEY)
    assert st["endpoint"] == f"http://127.0.0.1:{proxy_server.port}" and st["ip"] == "127.0.0.1"
    assert "instance" not in st
    assert provider.calls == []  # no provider involved
    await proxy_server.stop()
    await eventually(lambda: phase(kube) == "Running")
    kube.delete(KEY)
    await eventually(lambda: KEY not in kube.objects)


async def test_create_progress_shows_in_message(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    provider.hold_create = asyncio.Event()
    make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: "fetching base image debian-13: 50%" in kube.status(KEY).get("message", ""))
    assert phase(kube) == "Provisioning"
    assert kube.status(KEY)["instance"]["name"].startswith("proxy-")  # recorded before the create
    provider.hold_create.set()
    await eventually(lambda: phase(kube) == "Ready")


async def test_switching_managed_to_external_deletes_the_vm(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    kube.set_spec(KEY, {"mode": "External", "external": {"address": f"127.0.0.1:{proxy_server.port}"},
                        "healthCheck": {"intervalSeconds": 1}})
    await eventually(lambda: "instance" not in kube.status(KEY) and phase(kube) == "Ready")
    assert provider.names() == set()
    assert ("Normal", "Deleted", f"deleted instance {name} on nas1") in kube.events_for("px1")
    assert cond(kube, "HostReachable") == {}


async def test_the_ip_is_re_read_on_every_reconcile(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    c = make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: phase(kube) == "Ready")
    name = kube.status(KEY)["instance"]["name"]
    # a new DHCP lease after a host reboot: nothing listens there yet
    provider.vms[("nas1", name)] = dataclasses.replace(provider.vms[("nas1", name)], ip="127.0.0.3")
    c.enqueue(KEY)
    await eventually(lambda: kube.status(KEY).get("ip") == "127.0.0.3")
    st = kube.status(KEY)
    assert st["endpoint"] == f"http://127.0.0.3:{proxy_server.port}"
    assert st["phase"] == "Running"  # probes start over at the new address
    assert c.prober.target(ProbeKey(KEY)).host == "127.0.0.3"


async def test_long_provider_errors_are_capped_in_status(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    async def wordy_create(request: object, *, progress: object = None) -> None:
        raise QuotaError("no room: " + "x" * 5000)

    provider.create = wordy_create  # type: ignore[method-assign]
    make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: "no room" in kube.status(KEY).get("message", ""))
    st = kube.status(KEY)
    assert len(st["message"]) <= 1024 and st["message"].endswith("...")
    assert all(len(c["message"]) <= 1024 for c in st["conditions"])


async def test_a_proxy_made_while_its_host_is_down_is_deleted_without_waiting_for_it(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The host does not answer from the start: the pass looks before it creates (planner.look_first: no
    live session), so status names no instance and the delete has nothing to wait for."""
    provider.unreachable.add("nas1")
    make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: cond(kube, "HostReachable").get("status") == "False", what="HostUnreachable")
    assert "instance" not in kube.status(KEY)
    kube.delete(KEY)
    await eventually(lambda: KEY not in kube.objects, what="deleted while the host is still down")
    assert [op for op, _ in provider.calls if op in ("create", "delete")] == []
