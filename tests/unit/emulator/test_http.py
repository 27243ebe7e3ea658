"""The emulator over HTTP (aiohttp client): Status bodies, discovery, Tables, and the watch stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from testbed.emulator import Emulator

from .conftest import proxy, widget_crd

PX = "/apis/egressproxies.io/v1alpha1/namespaces/default/proxies"
TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
    "application/json"
)


@pytest.fixture
async def http(emu: Emulator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=emu.url, headers={"Authorization": "Bearer ignored"}) as s:
        yield s


async def _lines(resp: aiohttp.ClientResponse, n: int, limit: float = 5.0) -> list[dict[str, Any]]:
    out = []

    async def read() -> None:
        while len(out) < n:
            line = await resp.content.readline()
            if not line:
                return
            out.append(json.loads(line))

    await asyncio.wait_for(read(), limit)
    return out


async def _collect(resp: aiohttp.ClientResponse, seconds: float) -> list[dict[str, Any]]:
    """Whatever events arrive within `seconds`."""
    out: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(seconds):
            while line := await resp.content.readline():
                out.append(json.loads(line))
    except TimeoutError:
        pass
    return out


async def test_errors_are_status_objects(http: aiohttp.ClientSession) -> None:
    async with http.get(f"{PX}/missing") as r:
        body = await r.json()
    assert r.status == 404
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'proxies.egressproxies.io "missing" not found',
        "reason": "NotFound",
        "code": 404,
        "details": {"name": "missing", "group": "egressproxies.io", "kind": "proxies"},
    }
    async with http.get("/apis/nope.io/v1/things") as r:
        assert r.status == 404 and (await r.json())["reason"] == "NotFound"


async def test_create_get_and_unknown_field_warning_header(http: aiohttp.ClientSession) -> None:
    async with http.post(PX, json=proxy("a", bogus=1)) as r:
        assert r.status == 201
        assert r.headers.getall("Warning") == ['299 - "unknown field \\"spec.bogus\\""']
    async with http.post(PX + "?fieldValidation=Strict", json=proxy("b", bogus=1)) as r:
        assert r.status == 400
    async with http.get(f"{PX}/a") as r:
        assert (await r.json())["spec"]["port"] == 3128


async def test_discovery_lists_crd_with_short_names_and_status(http: aiohttp.ClientSession) -> None:
    async with http.get("/apis") as r:
        groups = {g["name"] for g in (await r.json())["groups"]}
    assert {"egressproxies.io", "coordination.k8s.io", "apiextensions.k8s.io", "apps"} <= groups
    async with http.get("/apis/egressproxies.io/v1alpha1") as r:
        res = {x["name"]: x for x in (await r.json())["resources"]}
    assert res["proxies"]["shortNames"] == ["px"] and res["proxies"]["namespaced"] is True
    assert res["proxies/status"]["verbs"] == ["get", "patch", "update"]
    async with http.get("/openapi/v3") as r:
        url = (await r.json())["paths"]["apis/egressproxies.io/v1alpha1"]["serverRelativeURL"]
    async with http.get(url) as r:
        doc = await r.json()
    patch_ops = [p["patch"] for p in doc["paths"].values() if "patch" in p]
    assert all(any(q["name"] == "fieldValidation" for q in op["parameters"]) for op in patch_ops)
    assert doc["components"]["schemas"]["io.egressproxies.v1alpha1.Proxy"]["x-kubernetes-group-version-kind"]


async def test_table_for_get_and_list(http: aiohttp.ClientSession) -> None:
    await http.post(PX, json=proxy("a"))
    async with http.get(PX, headers={"Accept": TABLE}) as r:
        t = await r.json()
    assert t["kind"] == "Table" and t["rows"][0]["cells"][:3] == ["a", "Managed", "lab"]
    async with http.get(f"{PX}/a", headers={"Accept": TABLE}) as r:
        assert (await r.json())["rows"][0]["cells"][0] == "a"


async def test_watch_replays_from_version_then_streams(emu: Emulator, http: aiohttp.ClientSession) -> None:
    async with http.post(PX, json=proxy("a")) as r:
        rv = (await r.json())["metadata"]["resourceVersion"]
    await http.patch(
        f"{PX}/a", json={"spec": {"port": 1000}}, headers={"Content-Type": "application/merge-patch+json"}
    )
    async with http.get(PX, params={"watch": "1", "resourceVersion": rv}) as r:
        first = await _lines(r, 1)
        assert first[0]["type"] == "MODIFIED" and first[0]["object"]["spec"]["port"] == 1000
        await http.delete(f"{PX}/a")
        ev = await _lines(r, 1)
        assert ev[0]["type"] == "DELETED" and ev[0]["object"]["metadata"]["name"] == "a"
        assert int(ev[0]["object"]["metadata"]["resourceVersion"]) == emu.store.resource_version


async def test_watch_without_version_starts_with_current_objects(http: aiohttp.ClientSession) -> None:
    await http.post(PX, json=proxy("a"))
    async with http.get(PX, params={"watch": "true"}) as r:
        ev = await _lines(r, 1)
    assert ev[0]["type"] == "ADDED" and ev[0]["object"]["metadata"]["name"] == "a"


async def test_bookmarks_carry_the_current_version(emu: Emulator, http: aiohttp.ClientSession) -> None:
    rv = str(emu.store.resource_version)
    async with http.get(PX, params={"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true"}) as r:
        emu.create_namespace("other")  # moves the global version; no Proxy event
        ev = await _lines(r, 1)
    assert ev[0]["type"] == "BOOKMARK"
    assert ev[0]["object"]["metadata"] == {"resourceVersion": str(emu.store.resource_version)}
    assert ev[0]["object"]["kind"] == "Proxy"


async def test_too_old_version_is_an_error_event_with_410(emu: Emulator, http: aiohttp.ClientSession) -> None:
    async with http.post(PX, json=proxy("a")) as r:
        old = (await r.json())["metadata"]["resourceVersion"]
    await http.post(PX, json=proxy("b"))
    emu.compact()
    async with http.get(PX, params={"watch": "1", "resourceVersion": old}) as r:
        assert r.status == 200
        ev = await _lines(r, 2)
    assert len(ev) == 1 and ev[0]["type"] == "ERROR"
    status = ev[0]["object"]
    assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"
    async with http.get(PX, params={"watch": "1", "resourceVersion": str(emu.store.resource_version)}) as r:
        await http.post(PX, json=proxy("c"))
        assert (await _lines(r, 1))[0]["type"] == "ADDED"  # watching from now after compaction is fine


async def test_watch_timeout_ends_the_stream(http: aiohttp.ClientSession) -> None:
    async with http.get(PX, params={"watch": "1", "resourceVersion": "1", "timeoutSeconds": "1"}) as r:
        ev = await _lines(r, 5, limit=5)
    assert ev == []


async def test_field_selector_watch_turns_changes_into_added_and_deleted(http: aiohttp.ClientSession) -> None:
    await http.post(PX, json=proxy("a"))
    params = {"watch": "1", "resourceVersion": "1", "labelSelector": "team=x"}
    async with http.get(PX, params=params) as r:
        hdr = {"Content-Type": "application/merge-patch+json"}
        await http.patch(f"{PX}/a", json={"metadata": {"labels": {"team": "x"}}}, headers=hdr)
        await http.patch(f"{PX}/a", json={"metadata": {"labels": {"team": "y"}}}, headers=hdr)
        ev = await _lines(r, 2)
    assert [e["type"] for e in ev] == ["ADDED", "DELETED"]


async def test_watchers_of_one_event_each_get_their_own_rendering(http: aiohttp.ClientSession) -> None:
    """An event is encoded once for all watchers of a type (watch.py's cache), yet each watch still gets
    what it asked for: MODIFIED for a plain watch, ADDED where the change enters a selector, a Table row."""
    async with http.post(PX, json=proxy("a")) as r:
        rv = (await r.json())["metadata"]["resourceVersion"]
    base = {"watch": "1", "resourceVersion": rv}
    async with (
        http.get(PX, params=base) as plain,
        http.get(PX, params=base) as plain2,
        http.get(PX, params={**base, "labelSelector": "team=x"}) as selected,
        http.get(PX, params=base, headers={"Accept": TABLE}) as table,
    ):
        hdr = {"Content-Type": "application/merge-patch+json"}
        await http.patch(f"{PX}/a", json={"metadata": {"labels": {"team": "x"}}}, headers=hdr)
        got = [(await _lines(w, 1))[0] for w in (plain, plain2, selected, table)]
    assert [e["type"] for e in got] == ["MODIFIED", "MODIFIED", "ADDED", "MODIFIED"]
    assert got[0] == got[1] and got[0]["object"]["metadata"]["labels"] == {"team": "x"}
    assert got[2]["object"] == got[0]["object"] and got[3]["object"]["kind"] == "Table"


async def test_watches_of_two_versions_of_a_kind_get_their_own_version(http: aiohttp.ClientSession) -> None:
    """One stored event, two served versions: the encoded-once line (watch.py) is per resource type."""
    crd = widget_crd()
    v1 = crd["spec"]["versions"][0]
    crd["spec"]["versions"] = [dict(v1, name="v1beta1", storage=False), v1]
    async with http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd) as r:
        assert r.status == 201
    path = "/apis/example.com/{}/namespaces/default/widgets"
    async with http.get(path.format("v1beta1"), params={"watch": "1"}) as old, http.get(
        path.format("v1"), params={"watch": "1"}
    ) as new:
        async with http.post(path.format("v1"), json={"metadata": {"name": "w"}}) as r:
            assert r.status == 201
        got = [(await _lines(w, 1))[0] for w in (old, new)]
    assert [e["object"]["apiVersion"] for e in got] == ["example.com/v1beta1", "example.com/v1"]


async def test_watch_events_carry_defaults_added_to_the_crd_later(emu: Emulator,
                                                                  http: aiohttp.ClientSession) -> None:
    """Defaults apply on read: an object stored before its CRD gained a default is sent with it."""
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/proxies.egressproxies.io"
    async with http.post(PX, json=proxy("a")) as r:
        rv = (await r.json())["metadata"]["resourceVersion"]
    async with http.get(crd) as r:
        body = await r.json()
    props = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    props["provider"]["default"] = "unused"  # present: not applied
    props["newField"] = {"type": "string", "default": "later"}
    async with http.put(crd, json=body) as r:
        assert r.status == 200
    # The stored object was never written again: the initial listing and the replayed creation both
    # come from the stored state, defaulted as they are sent.
    async with http.get(PX, params={"watch": "1"}) as listing, http.get(
        PX, params={"watch": "1", "resourceVersion": str(int(rv) - 1)}
    ) as replay:
        got = [(await _lines(w, 1))[0] for w in (listing, replay)]
    assert [e["type"] for e in got] == ["ADDED", "ADDED"]
    assert [e["object"]["spec"]["newField"] for e in got] == ["later", "later"]
    assert got[0]["object"]["spec"]["provider"] == "lab"
    assert "newField" not in emu.store.get(("egressproxies.io", "proxies"), "default", "a")["spec"]


async def test_table_watch_rows(http: aiohttp.ClientSession) -> None:
    async with http.post(PX, json=proxy("a")) as r:
        rv = (await r.json())["metadata"]["resourceVersion"]
    async with http.get(PX, params={"watch": "1", "resourceVersion": rv}, headers={"Accept": TABLE}) as r:
        await http.patch(
            f"{PX}/a/status",
            json={"status": {"phase": "Ready"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        await http.patch(
            f"{PX}/a/status",
            json={"status": {"phase": "Failed"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        ev = await _lines(r, 2)
    assert [e["object"]["kind"] for e in ev] == ["Table", "Table"]
    assert (
        ev[0]["object"]["rows"][0]["cells"][3] == "Ready"
        and ev[1]["object"]["rows"][0]["cells"][3] == "Failed"
    )
    assert ev[0]["object"]["columnDefinitions"] and not ev[1]["object"]["columnDefinitions"]


async def test_stop_ends_open_watches(emu: Emulator, http: aiohttp.ClientSession) -> None:
    async with http.get(PX, params={"watch": "1", "resourceVersion": "1"}) as r:
        await asyncio.sleep(0.1)
        assert emu.store.subscriptions == 1
        emu.store.close_all()
        assert await _lines(r, 1) == []
    await asyncio.sleep(0.1)
    assert emu.store.subscriptions == 0


async def test_stalled_watch_sends_nothing_then_delivers(emu: Emulator, http: aiohttp.ClientSession) -> None:
    params = {"watch": "1", "resourceVersion": str(emu.store.resource_version), "allowWatchBookmarks": "true"}
    async with http.get(PX, params=params) as r:
        assert (await _lines(r, 1))[0]["type"] == "BOOKMARK"  # the stream is up
        emu.stall_watches()
        await http.post(PX, json=proxy("quiet"))
        quiet = await _collect(r, 0.6)  # three bookmark intervals
        assert "ADDED" not in [e["type"] for e in quiet]  # (a bookmark already in flight may arrive)
        emu.stall_watches(False)
        types = []
        while "ADDED" not in types:
            types += [e["type"] for e in await _lines(r, 1)]
    assert set(types) <= {"BOOKMARK", "ADDED"}


async def test_end_watches_closes_streams_and_new_ones_work(
    emu: Emulator, http: aiohttp.ClientSession
) -> None:
    async with http.get(PX, params={"watch": "1", "resourceVersion": "1"}) as r:
        await asyncio.sleep(0.1)
        emu.end_watches()
        assert await _lines(r, 1) == []
    async with http.get(PX, params={"watch": "1", "resourceVersion": str(emu.store.resource_version)}) as r:
        await http.post(PX, json=proxy("after"))
        assert (await _lines(r, 1))[0]["type"] == "ADDED"


async def test_debug_requests_counts_by_verb_resource_and_writer(emu: Emulator) -> None:
    """/debug/requests (emulator only): what a benchmark counts the operator's API writes with."""
    async with aiohttp.ClientSession(base_url=emu.url, headers={"User-Agent": "egress-kvm/1.0"}) as op, \
            aiohttp.ClientSession(base_url=emu.url, headers={"User-Agent": "kubectl/v1.30"}) as kc:
        async with kc.post(PX, json=proxy("p1")) as resp:
            assert resp.status == 201
            created = await resp.json()
        async with op.get(f"{PX}/p1") as resp:
            assert resp.status == 200
        created["status"] = {"phase": "Pending"}
        async with op.put(f"{PX}/p1/status", json=created) as resp:
            assert resp.status == 200
        async with op.put(f"{PX}/p1/status?fieldManager=someone", json=created) as resp:
            assert resp.status == 409  # a stale resourceVersion: refused, and still a write that landed
        async with op.get("/debug/requests") as resp:
            rows = (await resp.json())["requests"]
    counts = {(r["method"], r["watch"], r["resource"], r["subresource"], r["agent"]): r["count"]
              for r in rows}
    assert counts == {("POST", "", "proxies", "", "kubectl"): 1, ("GET", "", "proxies", "", "egress-kvm"): 1,
                      ("PUT", "", "proxies", "status", "egress-kvm"): 1,
                      ("PUT", "", "proxies", "status", "someone"): 1}


def _uncached(emu: Emulator, group: str, version: str, plural: str, name: str) -> bytes:
    """What a GET sent before answers were encoded once per stored object: `Api.get`'s copy, encoded."""
    obj = emu.api.get(emu.api.resource(group, version, plural), "default", name)
    return json.dumps(obj, separators=(",", ":")).encode()


async def test_answers_and_events_share_one_encoding_that_follows_every_change(
    emu: Emulator, http: aiohttp.ClientSession
) -> None:
    """A stored object's text is encoded once (Api.encoded) for the write's answer, its watch event and
    later GETs: each must still be exactly the object as stored now, for the type asked for; a dry run
    answers its own object and leaves the stored text; a CRD that gains a default changes the text."""
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/proxies.egressproxies.io"
    px = ("egressproxies.io", "v1alpha1", "proxies", "a")
    async with http.get(PX, params={"watch": "1"}) as w:
        async with http.post(PX, json=proxy("a"), params={"fieldManager": "op"}) as r:
            created = await r.read()
        async with http.get(f"{PX}/a") as r:
            assert await r.read() == created == _uncached(emu, *px)
        obj = json.loads(created)
        obj["spec"]["port"] = 8080
        async with http.put(f"{PX}/a", json=obj, params={"fieldManager": "op"}) as r:
            updated = await r.read()
        assert json.loads(updated)["spec"]["port"] == 8080
        async with http.get(f"{PX}/a") as r:
            assert await r.read() == updated == _uncached(emu, *px)
        events = await _lines(w, 2)
    assert [json.dumps(e["object"], separators=(",", ":")).encode() for e in events] == [created, updated]
    dry = {**json.loads(updated), "spec": {**obj["spec"], "port": 9090}}
    async with http.put(f"{PX}/a", json=dry, params={"dryRun": "All", "fieldManager": "other"}) as r:
        answered = json.loads(await r.read())
    assert answered["spec"]["port"] == 9090
    assert [m["manager"] for m in answered["metadata"]["managedFields"]] == ["op", "other"]
    async with http.get(f"{PX}/a") as r:
        assert await r.read() == updated
    async with http.get(crd_path) as r:
        crd = await r.json()
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    props["newField"] = {"type": "string", "default": "later"}
    async with http.put(crd_path, json=crd) as r:
        assert r.status == 200
    async with http.get(f"{PX}/a") as r:
        again = await r.read()
    assert json.loads(again)["spec"]["newField"] == "later" and again == _uncached(emu, *px)


async def test_gets_of_two_versions_of_one_object_get_their_own_version(http: aiohttp.ClientSession) -> None:
    """The encoded-once text of a stored object is per resource type: each version's GET its apiVersion."""
    crd = widget_crd()
    v1 = crd["spec"]["versions"][0]
    crd["spec"]["versions"] = [dict(v1, name="v1beta1", storage=False), v1]
    async with http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd) as r:
        assert r.status == 201
    path = "/apis/example.com/{}/namespaces/default/widgets"
    async with http.post(path.format("v1"), json={"metadata": {"name": "w"}}) as r:
        assert r.status == 201
    got = []
    for version in ("v1", "v1beta1", "v1"):
        async with http.get(path.format(version) + "/w") as r:
            got.append((await r.json())["apiVersion"])
    assert got == ["example.com/v1", "example.com/v1beta1", "example.com/v1"]
