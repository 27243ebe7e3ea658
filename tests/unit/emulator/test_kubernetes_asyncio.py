"""The emulator through kubernetes-asyncio, the client the operator is built on."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.rest import ApiException

from testbed.emulator import Emulator

from .conftest import GROUP, PLURAL, VERSION, proxy

MERGE = "application/merge-patch+json"


@pytest.fixture
async def k8s(emu: Emulator) -> AsyncIterator[client.ApiClient]:
    cfg = client.Configuration()
    await config.load_kube_config_from_dict(emu.kubeconfig(), client_configuration=cfg)
    async with client.ApiClient(configuration=cfg) as api:
        yield api


async def test_custom_objects_list_patch_status_and_watch(emu: Emulator, k8s: client.ApiClient) -> None:
    co = client.CustomObjectsApi(k8s)
    await co.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, proxy("a"))
    listed = await co.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
    rv = listed["metadata"]["resourceVersion"]

    w = watch.Watch()
    events: list[tuple[str, str | None]] = []
    bookmarked = asyncio.Event()

    async def consume() -> None:
        async with w.stream(
            co.list_namespaced_custom_object,
            GROUP,
            VERSION,
            "default",
            PLURAL,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=5,
        ) as stream:
            async for ev in stream:
                events.append((ev["type"], (ev["object"].get("status") or {}).get("phase")))
                if ev["type"] == "BOOKMARK":
                    bookmarked.set()
                if ev["type"] == "MODIFIED":
                    w.stop()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(bookmarked.wait(), 5)  # the stream is up (bookmarks every 0.2 s here)
    out = await co.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "a", {"status": {"phase": "Provisioning"}}, _content_type=MERGE
    )
    assert out["status"] == {"phase": "Provisioning"}
    await asyncio.wait_for(task, 5)
    assert events[-1] == ("MODIFIED", "Provisioning")
    assert {t for t, _ in events[:-1]} == {"BOOKMARK"}


async def test_patch_without_content_type_is_refused_like_the_real_server(k8s: client.ApiClient) -> None:
    """kubernetes-asyncio picks application/json-patch+json for a dict body on custom objects; a real
    server refuses that, so callers must pass _content_type."""
    co = client.CustomObjectsApi(k8s)
    await co.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, proxy("a"))
    with pytest.raises(ApiException) as e:
        await co.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "a", {"status": {}})
    assert e.value.status == 400


async def test_watch_from_a_compacted_version_raises_410(emu: Emulator, k8s: client.ApiClient) -> None:
    co = client.CustomObjectsApi(k8s)
    await co.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, proxy("a"))
    old = (await co.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL))["metadata"][
        "resourceVersion"
    ]
    await co.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, proxy("b"))
    emu.compact()
    w = watch.Watch()
    with pytest.raises(ApiException) as e:
        async with w.stream(
            co.list_namespaced_custom_object,
            GROUP,
            VERSION,
            "default",
            PLURAL,
            resource_version=old,
            timeout_seconds=5,
        ) as stream:
            async for _ in stream:
                pass
    assert e.value.status == 410


async def test_status_conflict_on_stale_replace(k8s: client.ApiClient) -> None:
    co = client.CustomObjectsApi(k8s)
    obj = await co.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, proxy("a"))
    await co.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "a", {"status": {"phase": "Pending"}}, _content_type=MERGE
    )
    obj["status"] = {"phase": "Running"}
    with pytest.raises(ApiException) as e:
        await co.replace_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "a", obj)
    assert e.value.status == 409


async def test_finalizer_then_delete_then_release(k8s: client.ApiClient) -> None:
    co = client.CustomObjectsApi(k8s)
    await co.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, proxy("a"))
    await co.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "a",
        {"metadata": {"finalizers": ["egressproxies.io/finalizer"]}},
        _content_type=MERGE,
    )
    await co.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "a")
    obj = await co.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "a")
    assert obj["metadata"]["deletionTimestamp"]
    await co.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "a", [{"op": "remove", "path": "/metadata/finalizers"}]
    )
    with pytest.raises(ApiException) as e:
        await co.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "a")
    assert e.value.status == 404


async def test_secrets_and_events(k8s: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s)
    data = {"username": base64.b64encode(b"u").decode(), "password": base64.b64encode(b"p").decode()}
    await core.create_namespaced_secret(
        "default", client.V1Secret(metadata=client.V1ObjectMeta(name="auth"), data=data)
    )
    secret = await core.read_namespaced_secret("auth", "default")
    assert base64.b64decode(secret.data["password"]) == b"p"
    with pytest.raises(ApiException) as e:
        await core.read_namespaced_secret("nope", "default")
    assert e.value.status == 404
    ref = client.V1ObjectReference(
        kind="Proxy", name="a", namespace="default", uid="u1", api_version=f"{GROUP}/{VERSION}"
    )
    await core.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="a."),
            involved_object=ref,
            reason="Ready",
            message="m",
            type="Normal",
        ),
    )
    got = await core.list_namespaced_event(
        "default", field_selector="involvedObject.name=a,involvedObject.kind=Proxy"
    )
    assert [ev.reason for ev in got.items] == ["Ready"]
    ns = await core.read_namespace("kube-system")
    assert ns.metadata.uid


async def test_leases_with_optimistic_concurrency(k8s: client.ApiClient) -> None:
    co = client.CoordinationV1Api(k8s)
    lease = await co.create_namespaced_lease(
        "default",
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="leader"),
            spec=client.V1LeaseSpec(holder_identity="one", lease_duration_seconds=15),
        ),
    )
    lease.spec.holder_identity = "two"
    won = await co.replace_namespaced_lease("leader", "default", lease)
    assert won.spec.holder_identity == "two"
    lease.spec.holder_identity = "three"  # still carries the old resourceVersion
    with pytest.raises(ApiException) as e:
        await co.replace_namespaced_lease("leader", "default", lease)
    assert e.value.status == 409
    with pytest.raises(ApiException) as e:
        await co.create_namespaced_lease(
            "default", client.V1Lease(metadata=client.V1ObjectMeta(name="leader"))
        )
    assert e.value.status == 409
