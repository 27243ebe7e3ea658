"""The store's copy discipline (store.py): a stored object, and so every published event, never changes
after it is stored, and nothing a caller gets back is shared with the store. Reads hand out the stored
dicts themselves (Store.peek) and writes take over their own copies (adopt=True), so a write path that
changed what it only meant to read would silently rewrite history: watch replays, the `old` state a
selector watch compares, and the encoded-once watch lines (watch.py) would disagree.

Each test records a deep copy of every event as it is published and checks, after every step, that the
events still equal their copies; every object a call returns is then scribbled over, which must change
nothing stored."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from testbed.emulator import Api, ApiError
from testbed.emulator.resources import ResourceType
from testbed.emulator.store import Event, Store, same_json

from .conftest import crd_type, proxy, widget_crd

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


class Recorded:
    """Every event `store` publishes from now on, with a deep copy taken as it is published."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[Event, Any, Any]] = []
        publish = store._publish

        def recording(ev: Event) -> None:
            self.events.append((ev, copy.deepcopy(ev.obj), copy.deepcopy(ev.old)))
            publish(ev)

        monkeypatch.setattr(store, "_publish", recording)

    def changed(self) -> list[str]:
        """The events whose object or previous state is no longer what was published."""
        return [f"{ev.type} {ev.obj['metadata'].get('name')} rv={ev.rv}"
                for ev, obj, old in self.events if ev.obj != obj or ev.old != old]


def _scribble(value: Any) -> None:
    """Change every dict and list of a returned object, as a careless caller might."""
    if isinstance(value, dict):
        for v in list(value.values()):
            _scribble(v)
        value["scribbled"] = True
    elif isinstance(value, list):
        for v in value:
            _scribble(v)
        value.append("scribbled")
    elif isinstance(value, tuple):  # (object, warnings) and the like
        for v in value:
            _scribble(v)


@pytest.fixture
def recorded(api: Api, monkeypatch: pytest.MonkeyPatch) -> Recorded:
    return Recorded(api.store, monkeypatch)


@pytest.fixture
def step(recorded: Recorded) -> Callable[..., Any]:
    """Run one call, then no event may have changed; scribble over what it returns, then still none
    may have. Returns a copy of the object returned (of the first item of a tuple: (object, warnings)
    and the like). With `refused=CODE`, the call must fail with that HTTP code instead."""
    count = 0

    def run(call: Callable[..., Any], *args: Any, refused: int = 0, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        where = f"step {count}: {call.__name__}{args[1:3]}"
        if refused:
            with pytest.raises(ApiError) as e:
                call(*args, **kwargs)
            assert e.value.code == refused, where
            assert recorded.changed() == [], where
            return None
        out = call(*args, **kwargs)
        assert recorded.changed() == [], where
        kept = copy.deepcopy(out)
        _scribble(out)
        assert recorded.changed() == [], f"{where}, scribbling over its result"
        return kept[0] if isinstance(kept, tuple) else kept

    return run


def test_no_write_changes_a_stored_object_or_a_published_event(
    api: Api, proxies: ResourceType, step: Callable[..., Any]
) -> None:
    configmaps = api.resource("", "v1", "configmaps")
    namespaces = api.resource("", "v1", "namespaces")
    # create, taking the body over (owned) or copying it (then the caller may change the body after)
    step(api.create, proxies, "default", proxy("a", port=8080), manager="op", owned=True)
    body = proxy("b")
    step(api.create, proxies, "default", body, manager="op")
    _scribble(body)
    # update (PUT), owned, with a stale and a current version; one that changes nothing; one that sends
    # managedFields of its own
    a = step(api.get, proxies, "default", "a")
    stale = copy.deepcopy(a)
    a["spec"]["port"] = 9090
    a["metadata"]["labels"] = {"team": "x"}
    a = step(api.update, proxies, "default", "a", copy.deepcopy(a), manager="op", owned=True)
    step(api.update, proxies, "default", "a", stale, manager="op", owned=True, refused=409)
    a = step(api.update, proxies, "default", "a", copy.deepcopy(a), manager="op", owned=True)
    a["metadata"]["managedFields"] = [dict(m, manager="someone") for m in a["metadata"]["managedFields"]]
    a = step(api.update, proxies, "default", "a", copy.deepcopy(a), manager="op", owned=True)
    a = step(api.patch, proxies, "default", "a", JSON_PATCH,
             [{"op": "replace", "path": "/metadata/managedFields/0/manager", "value": "migrated"}],
             manager="op")
    sent = proxy("sent")
    sent["metadata"]["managedFields"] = copy.deepcopy(a["metadata"]["managedFields"])
    step(api.create, proxies, "default", sent, manager="op", owned=True)
    # status: PUT and patches, again and again (the same status is a no-op), a condition list (map list)
    cond = {"type": "Ready", "status": "True", "reason": "Up", "message": "", "lastTransitionTime": api.now()}
    a["status"] = {"phase": "Ready", "conditions": [cond]}
    a = step(api.update, proxies, "default", "a", copy.deepcopy(a), subresource="status", manager="op",
             owned=True)
    for phase in ("Ready", "Failed", "Failed"):
        step(api.patch, proxies, "default", "a", MERGE, {"status": {"phase": phase}}, subresource="status",
             manager="op")
    step(api.patch, proxies, "default", "a", JSON_PATCH,
         [{"op": "add", "path": "/status/conditions/-", "value": dict(cond, type="Healthy")},
          {"op": "copy", "from": "/status/conditions/0/reason", "path": "/status/conditions/1/reason"}],
         subresource="status", manager="op")
    # patches of the main resource, a dry run of each kind of write
    step(api.patch, proxies, "default", "a", MERGE, {"spec": {"port": None}}, manager="kubectl-edit")
    step(api.patch, proxies, "default", "a", JSON_PATCH,
         [{"op": "copy", "from": "/metadata/labels", "path": "/metadata/annotations"}], manager="x")
    step(api.patch, proxies, "default", "a", MERGE, {"spec": {"port": 1}}, dry_run=True, manager="x")
    a = step(api.get, proxies, "default", "a")
    a["spec"]["port"] = 2
    step(api.update, proxies, "default", "a", copy.deepcopy(a), dry_run=True, manager="x", owned=True)
    step(api.create, proxies, "default", proxy("dry"), dry_run=True, manager="x", owned=True)
    step(api.delete, proxies, "default", "a", dry_run=True)
    # server-side apply: create, change, a conflict refused, then forced; apply to status
    applied = {"apiVersion": "egressproxies.io/v1alpha1", "kind": "Proxy", "metadata": {"name": "c"},
               "spec": {"provider": "lab", "port": 3000}}
    step(api.patch, proxies, "default", "c", APPLY, copy.deepcopy(applied), manager="kubectl")
    applied["spec"]["port"] = 3001
    step(api.patch, proxies, "default", "c", APPLY, copy.deepcopy(applied), manager="kubectl")
    step(api.patch, proxies, "default", "c", MERGE, {"spec": {"port": 3002}}, manager="op")
    step(api.patch, proxies, "default", "c", APPLY, copy.deepcopy(applied), manager="kubectl", refused=409)
    step(api.patch, proxies, "default", "c", APPLY, copy.deepcopy(applied), manager="kubectl", force=True)
    step(api.patch, proxies, "default", "c", APPLY,
         {**applied, "status": {"phase": "Ready"}}, manager="op", subresource="status")
    # a built-in: strategic merge patch of a configmap, list and watch-free reads
    step(api.create, configmaps, "default", {"metadata": {"name": "cm"}, "data": {"k": "v"}}, owned=True)
    step(api.patch, configmaps, "default", "cm", STRATEGIC, {"data": {"k2": "v2"}}, manager="x")
    step(api.list, proxies, None, label_selector="team=x")
    # deletion held by a finalizer, finished by removing it
    step(api.patch, proxies, "default", "b", MERGE, {"metadata": {"finalizers": ["x/y"]}}, manager="op")
    step(api.delete, proxies, "default", "b")
    step(api.delete, proxies, "default", "b")
    step(api.patch, proxies, "default", "b", MERGE, {"metadata": {"finalizers": None}}, manager="op")
    # a namespace deleted with what it holds, one object of it held by a finalizer
    step(api.create, namespaces, "", {"metadata": {"name": "team"}}, owned=True)
    held = proxy("held")
    held["metadata"]["finalizers"] = ["x/y"]
    step(api.create, proxies, "team", held, owned=True)
    step(api.create, proxies, "team", proxy("free"), owned=True)
    step(api.delete, namespaces, "", "team")
    step(api.patch, proxies, "team", "held", JSON_PATCH, [{"op": "remove", "path": "/metadata/finalizers"}],
         manager="op")
    # a CRD that gains a default (applied on read), then goes with its objects
    crds = crd_type(api)
    step(api.create, crds, "", widget_crd(status=True), owned=True)
    widgets = api.resource("example.com", "v1", "widgets")
    step(api.create, widgets, "default", {"metadata": {"name": "w"}, "spec": {"tags": ["a"]}}, owned=True)
    step(api.patch, widgets, "default", "w", MERGE, {"status": {"x": 1}}, subresource="status", manager="x")
    crd = step(api.get, crds, "", "widgets.example.com")
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    props["spec"]["properties"]["new"] = {"type": "string", "default": "later"}
    props["status"]["properties"] = {"seen": {"type": "string", "default": "no"}}
    step(api.update, crds, "", "widgets.example.com", crd, owned=True)
    widgets = api.resource("example.com", "v1", "widgets")
    w = step(api.get, widgets, "default", "w")
    assert (w["spec"]["new"], w["status"]["seen"]) == ("later", "no")
    step(api.patch, widgets, "default", "w", APPLY, {"apiVersion": "example.com/v1", "kind": "Widget",
         "metadata": {"name": "w"}, "spec": {"size": 3}}, manager="kubectl", force=True)
    step(api.patch, widgets, "default", "w", MERGE, {"spec": {"size": 4}}, manager="x")
    step(api.delete, crds, "", "widgets.example.com")
    assert api.store.get(widgets.key, "default", "w") is None


def test_defaults_reaching_into_metadata_change_no_stored_managed_fields(
    api: Api, recorded: Recorded
) -> None:
    """A schema whose root `additionalProperties` applies to `metadata` defaults inside its managedFields
    entries too. A write starts from the stored object's managedFields (replaced once the write's
    ownership is recorded); defaulting the new object must not reach the stored list."""
    entry = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
             "properties": {"defaulted": {"type": "string", "default": "d"}}}
    crd = widget_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True,
        "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True,
                                 "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True,
                                                          "items": entry}}}
    api.create(crd_type(api), "", crd)
    widgets = api.resource("example.com", "v1", "widgets")
    w, _ = api.create(widgets, "default", {"metadata": {"name": "w"}, "spec": {"size": 1}}, manager="a")
    w["spec"]["size"] = 2
    api.update(widgets, "default", "w", w, manager="b")
    api.patch(widgets, "default", "w", MERGE, {"spec": {"size": 3}}, manager="c")
    assert recorded.changed() == []


def test_stored_answers_hand_out_the_stored_object_only_within_and_only_for_stored_writes(
    api: Api, proxies: ResourceType
) -> None:
    """The HTTP server's mode (Api.stored_answers): a write that stores returns the stored dict itself,
    to be encoded, not copied; outside it, and after a write refused within it, callers get copies."""
    with api.stored_answers():
        created, _ = api.create(proxies, "default", proxy("a"), manager="op")
        assert created is api.store.peek(proxies.key, "default", "a")
        with pytest.raises(ApiError):
            api.create(proxies, "default", proxy("a"), manager="op")  # exists: 409
    copied, _ = api.create(proxies, "default", proxy("b"), manager="op")
    assert copied is not api.store.peek(proxies.key, "default", "b")
    with pytest.raises(ApiError), api.stored_answers():
        api.update(proxies, "default", "a", {**created, "metadata": {"name": "a"}}, manager="op")  # no rv
    changed = copy.deepcopy(created)
    changed["spec"]["port"] = 8080
    updated, _ = api.update(proxies, "default", "a", changed, manager="other")
    assert updated is not api.store.peek(proxies.key, "default", "a") and updated["spec"]["port"] == 8080
    assert updated == api.get(proxies, "default", "a")


@pytest.mark.parametrize(("a", "b", "same"), [
    ({"x": 1, "y": [1, "a"]}, {"y": [1, "a"], "x": 1}, True),  # key order is no part of JSON equality
    (1, True, False),
    (1, 1.0, False),
    (0, False, False),
    ({"x": [1]}, {"x": [1.0]}, False),
    ({"x": {"y": True}}, {"x": {"y": 1}}, False),
    ([{"k": 1}], [{"k": 1}, {"k": 1}], False),
    ({"x": None}, {}, False),
    ({"x": None}, {"x": None}, True),
])
def test_same_json_tells_apart_what_python_equality_confuses(a: Any, b: Any, same: bool) -> None:
    """store.same_json, what the caches that skip work for unchanged fields compare with."""
    assert same_json(a, b) is same and same_json(b, a) is same
