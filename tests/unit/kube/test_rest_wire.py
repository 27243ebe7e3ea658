"""The operator's hot calls (Proxy GET, status PUT, finalizer PUT, Event POST) go out through
rest.send_json, not kubernetes-asyncio's typed APIs: the request on the wire must be the one the typed
call sends (method, path, query, headers in order, JSON body), and the token refresh hook must still run
before every request (an in-cluster token is re-read from its file that way)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration, CustomObjectsApi

from egress_kvm.kube.api import FIELD_MANAGER, KubeApiClient
from egress_kvm.kube.interfaces import FINALIZER, GROUP, PLURAL, VERSION
from egress_kvm.kube.rest import MERGE_PATCH, KubeApiError, request_json, send_json

pytestmark = pytest.mark.timeout(30)

# Filled in by aiohttp for both paths alike (and Host carries the test server's port).
TRANSPORT_HEADERS = {"Host", "Content-Length", "Accept-Encoding"}


class Recorder:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, list[tuple[str, str]], Any]] = []
        self.answer: tuple[int, str] = (200, '{"kind": "Proxy", "metadata": {"name": "p"}}')

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k not in TRANSPORT_HEADERS]
        self.requests.append((request.method, request.path_qs, headers, json.loads(raw) if raw else None))
        status, text = self.answer
        return web.Response(status=status, text=text, content_type="application/json")


Served = tuple[Recorder, ApiClient, list[int]]  # the recorder, a client to it, one entry per token refresh


@pytest.fixture
async def server() -> AsyncIterator[Served]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    refreshed: list[int] = []

    def refresh(conf: Configuration) -> None:  # what the in-cluster loader installs, counted
        refreshed.append(1)
        conf.api_key["BearerToken"] = f"Bearer tok-{len(refreshed)}"

    conf = Configuration(host=f"http://127.0.0.1:{port}")
    conf.api_key["BearerToken"] = "Bearer tok-0"
    conf.refresh_api_key_hook = refresh
    try:
        async with ApiClient(conf) as client:
            yield recorder, client, refreshed
    finally:
        await runner.cleanup()


def the_same(recorded: list[Any]) -> None:
    """Two requests (typed, then ours) equal but for the token each carried."""
    assert len(recorded) == 2
    (m1, p1, h1, b1), (m2, p2, h2, b2) = recorded
    strip = [(k, v) for k, v in h1 if k.lower() != "authorization"], \
        [(k, v) for k, v in h2 if k.lower() != "authorization"]
    assert (m1, p1, strip[0], b1) == (m2, p2, strip[1], b2)
    assert [k for k, _ in h1] == [k for k, _ in h2]  # the same headers, in the same order
    tokens = [v for k, v in h1 + h2 if k.lower() == "authorization"]
    assert len(tokens) == 2 and tokens[0] != tokens[1]  # each had a fresh token


async def test_hot_calls_send_what_the_typed_calls_send(server: Served) -> None:
    recorder, client, refreshed = server
    custom, kube = CustomObjectsApi(client), KubeApiClient(client)
    proxy = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
             "metadata": {"name": "p", "namespace": "ns-1", "resourceVersion": "7", "finalizers": ["a/b"],
                          "managedFields": [{"manager": "kubectl"}]},
             "spec": {"port": 3128}}
    status = {"phase": "Pending", "message": "waiting", "conditions": [{"type": "Ready", "status": "False"}]}
    unmanaged = {**proxy, "metadata": {k: v for k, v in proxy["metadata"].items() if k != "managedFields"}}

    await custom.get_namespaced_custom_object(GROUP, VERSION, "ns-1", PLURAL, "p", _request_timeout=30)
    assert await kube.get_proxy("ns-1", "p") == {"kind": "Proxy", "metadata": {"name": "p"}}
    the_same(recorder.requests)

    recorder.requests.clear()
    await custom.replace_namespaced_custom_object_status(
        GROUP, VERSION, "ns-1", PLURAL, "p", {**unmanaged, "status": status}, field_manager=FIELD_MANAGER)
    await kube.update_proxy_status(proxy, status)
    the_same(recorder.requests)
    assert recorder.requests[1][1] == f"/apis/{GROUP}/{VERSION}/namespaces/ns-1/{PLURAL}/p/status?" \
                                      f"fieldManager={FIELD_MANAGER}"

    recorder.requests.clear()
    body = {**unmanaged, "metadata": {**unmanaged["metadata"], "finalizers": ["a/b", FINALIZER]}}
    await custom.replace_namespaced_custom_object(GROUP, VERSION, "ns-1", PLURAL, "p", body,
                                                  field_manager=FIELD_MANAGER)
    await kube.set_finalizer(proxy, present=True)
    the_same(recorder.requests)
    assert proxy["metadata"]["finalizers"] == ["a/b"]  # the caller's object is left as it was

    recorder.requests.clear()
    event = {"kind": "Event", "metadata": {"name": "p.1"}, "count": 1}
    await client.call_api("/api/v1/namespaces/ns-1/events", "POST", query_params=[("fieldManager", "x")],
                          header_params={"Accept": "application/json", "Content-Type": "application/json"},
                          body=event, response_types_map={201: "object"}, auth_settings=["BearerToken"],
                          _return_http_data_only=True, _request_timeout=30)
    await request_json(client, "POST", "/api/v1/namespaces/ns-1/events", query={"fieldManager": "x"},
                       body=event)
    the_same(recorder.requests)
    assert len(refreshed) == 8  # the hook ran before every request, ours as well


async def test_errors_and_odd_answers_read_as_through_call_api(server: Served) -> None:
    recorder, client, _ = server
    recorder.answer = (409, json.dumps({"kind": "Status", "reason": "Conflict", "message": "rv 7 is stale"}))
    with pytest.raises(KubeApiError) as caught:
        await send_json(client, "PUT", "/x", body={"a": 1})
    err = caught.value
    assert (err.status, err.reason, err.message) == (409, "Conflict", "rv 7 is stale")
    recorder.answer = (404, "not json")
    with pytest.raises(KubeApiError) as caught:
        await send_json(client, "GET", "/x")
    assert (caught.value.status, caught.value.reason, caught.value.not_found) == (404, "Not Found", True)
    recorder.answer = (200, "plain")
    assert await send_json(client, "GET", "/x") == "plain"
    assert await request_json(client, "GET", "/x") == {}


async def test_the_status_sent_is_the_one_passed_even_if_it_changes_during_the_auth_await(
        server: Served) -> None:
    """update_proxy_status no longer deep-copies the status: what goes on the wire must be the status as
    it was when the call was made, even if the caller's dict changes while the request waits for its
    token (an exec or in-cluster refresh is an await; another task may edit the status meanwhile)."""
    recorder, client, _ = server
    status = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
    proxy = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
             "metadata": {"name": "p", "namespace": "ns-1", "resourceVersion": "7"}}

    async def refresh_and_meanwhile_edit(conf: Configuration) -> None:
        status["phase"] = "Ready"
        status["conditions"][0]["status"] = "True"

    client.configuration.refresh_api_key_hook = refresh_and_meanwhile_edit
    await KubeApiClient(client).update_proxy_status(proxy, status)
    assert recorder.requests[0][3]["status"] == {"phase": "Pending",
                                                 "conditions": [{"type": "Ready", "status": "False"}]}


async def test_the_event_patch_sends_what_call_api_sends(server: Served) -> None:
    """The Event count bump is a merge patch: its Content-Type must survive the client's defaults."""
    recorder, client, _ = server
    path, patch = "/api/v1/namespaces/ns-1/events/p.1", {"count": 2, "lastTimestamp": "2026-12-02T00:00:00Z"}
    await client.call_api(path, "PATCH", query_params=[("fieldManager", FIELD_MANAGER)],
                          header_params={"Accept": "application/json", "Content-Type": MERGE_PATCH},
                          body=patch, response_types_map={200: "object"}, auth_settings=["BearerToken"],
                          _return_http_data_only=True, _request_timeout=30)
    await request_json(client, "PATCH", path, query={"fieldManager": FIELD_MANAGER}, body=patch,
                       content_type=MERGE_PATCH)
    the_same(recorder.requests)
    assert dict(recorder.requests[1][2])["Content-Type"] == MERGE_PATCH
