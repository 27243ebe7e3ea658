"""The emulator's HTTP face (aiohttp): URL routing, content negotiation, and the `Emulator` handle.

Routing follows the real server's URL scheme (`/api/v1/...`, `/apis/<group>/<version>/...`, with
`namespaces/<ns>/` for namespaced kinds and `/status` for the status subresource). Everything about
what a verb does lives in api.py; this module only turns requests into calls and results into JSON,
Tables (`Accept: ...;as=Table;g=meta.k8s.io;v=v1`) or watch streams.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from aiohttp import web

from egress_kvm.log import get_logger
from testbed.emulator import discovery, kubeconfig, protobuf, rbac, tables, watch
from testbed.emulator.api import Api
from testbed.emulator.errors import ApiError, bad_request, method_not_allowed
from testbed.emulator.fieldmanager import manager_from_user_agent
from testbed.emulator.resources import ResourceType
from testbed.emulator.selectors import field_matcher, label_matcher
from testbed.emulator.store import Store

Obj = dict[str, Any]


class RequestKey(NamedTuple):
    """One row of the request counts: verb (`watch` for a watching GET), resource, subresource, writer
    (the fieldManager parameter, else the User-Agent's product: `egress-kvm` for the operator)."""

    method: str
    watch: str
    resource: str
    subresource: str
    agent: str

log = get_logger("emulator")
API_KEY: web.AppKey[Api] = web.AppKey("api", Api)
EMU_KEY: web.AppKey[Emulator] = web.AppKey("emulator", object)  # type: ignore[arg-type]


def _json(data: Any, status: int = 200, warnings: list[str] | None = None) -> web.Response:
    resp = web.Response(
        status=status, text=json.dumps(data, separators=(",", ":")), content_type="application/json"
    )
    for w in warnings or []:
        resp.headers.add("Warning", f"299 - {json.dumps(w)}")
    return resp


def _json_text(text: str, status: int = 200, warnings: list[str] | None = None) -> web.Response:
    """`_json` of data already encoded (`Api.encoded`)."""
    resp = web.Response(status=status, text=text, content_type="application/json")
    for w in warnings or []:
        resp.headers.add("Warning", f"299 - {json.dumps(w)}")
    return resp


def _plain(request: web.Request, dry_run: bool) -> bool:
    """Whether a write's answer is the stored object as JSON (no dry run, no Table or metadata only):
    then the Api returns the stored object itself (`Api.stored_answers`) and `_written` sends its text."""
    return not dry_run and not _accepts_table(request) and not _accepts_partial(request)


def _written(request: web.Request, api: Api, rt: ResourceType, obj: Obj, status: int, warnings: list[str],
             plain: bool) -> web.Response:
    """The answer to a write: for a `_plain` one the stored object's text, encoded once for the answer and
    its watch event (`Api.stored_encoded`); else, or if `obj` is not the stored state (a write that deleted
    the object: then the Api returned a served copy, as it does outside `stored_answers`), `obj` rendered."""
    if plain:
        text = api.stored_encoded(rt, obj)
        if text is not None:
            return _json_text(text, status, warnings)
    return _json(_render_one(request, api, rt, obj), status, warnings)


def _not_found() -> web.Response:
    return _json(ApiError(404, "NotFound", "the server could not find the requested resource").status(), 404)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        resp = await handler(request)
    except ApiError as e:
        resp = _json(e.status(), e.code)
    except web.HTTPException as e:
        if e.status == 404:
            resp = _not_found()
        elif e.status == 405:
            resp = _json(method_not_allowed().status(), 405)
        else:
            raise
    if log.enabled(1):  # checked first: a Logger per request cost ~2% of the emulator's CPU in the fleet
        log.v(1).info("request", method=request.method, path=request.path, status=resp.status)
    return resp


def _accepts_table(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    first = accept.split(",")[0]
    return "as=Table" in first.replace(" ", "")


def _accepts_partial(request: web.Request) -> bool:
    first = request.headers.get("Accept", "").split(",")[0].replace(" ", "")
    return "as=PartialObjectMetadata" in first


def _is_watch(request: web.Request) -> bool:
    return request.query.get("watch", "").lower() in ("1", "true")


def _fresh_json(request: web.Request) -> bool:
    """Whether `_body` parses this request's body with json.loads: a tree nothing else refers to and
    without shared parts (YAML aliases can share them), which the Api may take over instead of copying."""
    ctype = request.content_type
    return not ("protobuf" in ctype or "cbor" in ctype or ctype.endswith("yaml"))


async def _body(request: web.Request, kind: str = "") -> Any:
    raw = await request.read()
    if not raw:
        return {}
    ctype = request.content_type
    if ctype == "application/vnd.kubernetes.protobuf" and kind in protobuf.KINDS:
        try:
            return protobuf.decode(raw, kind=kind)
        except protobuf.ProtobufError as e:
            raise bad_request(f"the protobuf request body could not be decoded: {e}") from None
    if "protobuf" in ctype or "cbor" in ctype:
        # kubectl's typed commands send protobuf bodies; the emulator decodes them only for the kinds
        # in protobuf.KINDS and says so for the rest instead of guessing.
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the emulator decodes {ctype} request bodies only for {', '.join(protobuf.KINDS)}; send JSON or "
            "YAML (for kubectl: `kubectl create ... --dry-run=client -o yaml | kubectl apply -f -`)",
        )
    try:
        if ctype.endswith("yaml"):
            return yaml.safe_load(raw)
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as e:
        kind = "YAML" if ctype.endswith("yaml") else "JSON"
        raise bad_request(f"the request body is not valid {kind}: {e}") from None


def _parse_path(api: Api, group: str, version: str, rest: str) -> tuple[ResourceType, str | None, str, str]:
    """rest -> (type, namespace or None, name, subresource)."""
    parts = [p for p in rest.split("/")]
    if any(not p for p in parts):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    if parts[0] == "namespaces" and len(parts) >= 3:
        cand = api.registry.get(group, version, parts[2])
        if cand is not None and cand.namespaced:
            if len(parts) > 5:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return cand, parts[1], parts[3] if len(parts) > 3 else "", parts[4] if len(parts) > 4 else ""
    if len(parts) > 3:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    rt = api.resource(group, version, parts[0])
    return rt, None, parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else ""


def _render_one(request: web.Request, api: Api, rt: ResourceType, obj: Obj) -> Obj:
    if _accepts_table(request):
        return tables.table(
            rt,
            [obj],
            resource_version=obj["metadata"].get("resourceVersion", ""),
            include=request.query.get("includeObject", "Metadata"),
        )
    if _accepts_partial(request):
        return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
    return obj


async def _resource(request: web.Request) -> web.StreamResponse:
    api = request.app[API_KEY]
    emu = request.app[EMU_KEY]
    group = request.match_info.get("group", "")
    version = request.match_info.get("version", "v1")
    rt, ns, name, sub = _parse_path(api, group, version, request.match_info["rest"])
    q = request.query
    dry_run = q.get("dryRun") == "All"
    fv = q.get("fieldValidation", "Warn")
    # Who writes: the fieldManager parameter, else the User-Agent's product (the real server's default).
    # Apply requires the parameter.
    manager = q.get("fieldManager") or ""
    writer = manager or manager_from_user_agent(request.headers.get("User-Agent", ""))
    if sub and (sub != "status" or not rt.status_subresource):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    method = request.method
    emu.requests[RequestKey(method, "watch" if _is_watch(request) else "", rt.plural, sub, writer)] += 1
    if not name:
        if method == "GET":
            labels, fields = q.get("labelSelector"), q.get("fieldSelector")
            if _is_watch(request):
                label_m, field_m = label_matcher(labels), field_matcher(fields, kind=rt.kind)
                try:
                    timeout = float(q.get("timeoutSeconds") or watch.DEFAULT_TIMEOUT)
                except ValueError:
                    raise bad_request(f"invalid timeoutSeconds: {q.get('timeoutSeconds')!r}") from None
                req = watch.WatchRequest(
                    rt=rt,
                    namespace=ns,
                    matches=lambda o: label_m(o) and field_m(o),
                    resource_version=q.get("resourceVersion", ""),
                    timeout=timeout,
                    bookmarks=q.get("allowWatchBookmarks", "").lower() in ("1", "true"),
                    send_initial_events=q.get("sendInitialEvents", "").lower() == "true",
                    table=_accepts_table(request),
                    include_object=q.get("includeObject", "Metadata"),
                )
                return await watch.serve(
                    request,
                    api,
                    req,
                    bookmark_interval=emu.bookmark_interval,
                    stalled=lambda: emu.watches_stalled,
                )
            items, rv = api.list(rt, ns, label_selector=labels, field_selector=fields)
            if _accepts_table(request):
                return _json(
                    tables.table(rt, items, resource_version=rv, include=q.get("includeObject", "Metadata"))
                )
            if _accepts_partial(request):
                return _json(
                    {
                        "kind": "PartialObjectMetadataList",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": {"resourceVersion": rv},
                        "items": [
                            {
                                "kind": "PartialObjectMetadata",
                                "apiVersion": "meta.k8s.io/v1",
                                "metadata": i["metadata"],
                            }
                            for i in items
                        ],
                    }
                )
            return _json(
                {
                    "kind": rt.list_kind,
                    "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": rv},
                    "items": items,
                }
            )
        if method == "POST":
            if rt.namespaced and ns is None:
                raise method_not_allowed()
            body = await _body(request, rt.kind)
            plain = _plain(request, dry_run)
            with api.stored_answers() if plain else nullcontext():  # no await within
                obj, warnings = api.create(
                    rt,
                    ns or "",
                    body,
                    field_validation=fv,
                    dry_run=dry_run,
                    manager=writer,
                    owned=_fresh_json(request),
                )
            return _written(request, api, rt, obj, 201, warnings, plain)
        if method == "DELETE":
            deleted = api.delete_collection(
                rt, ns, label_selector=q.get("labelSelector"), field_selector=q.get("fieldSelector")
            )
            return _json(
                {
                    "kind": rt.list_kind,
                    "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": str(api.store.resource_version)},
                    "items": deleted,
                }
            )
        raise method_not_allowed()
    if rt.namespaced and ns is None:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    if method == "GET":
        if not _accepts_table(request) and not _accepts_partial(request):
            return _json_text(api.get_encoded(rt, ns or "", name))
        return _json(_render_one(request, api, rt, api.get(rt, ns or "", name)))
    if method == "PUT":
        body = await _body(request, rt.kind)
        plain = _plain(request, dry_run)
        with api.stored_answers() if plain else nullcontext():  # no await within
            obj, warnings = api.update(
                rt,
                ns or "",
                name,
                body,
                subresource=sub,
                field_validation=fv,
                dry_run=dry_run,
                manager=writer,
                owned=_fresh_json(request),
            )
        return _written(request, api, rt, obj, 200, warnings, plain)
    if method == "PATCH":
        apply = request.content_type == "application/apply-patch+yaml"
        existed = apply and api.store.peek(rt.key, (ns or "") if rt.namespaced else "", name) is not None
        body = await _body(request, rt.kind)
        plain = _plain(request, dry_run)
        with api.stored_answers() if plain else nullcontext():  # no await within
            obj, warnings = api.patch(
                rt,
                ns or "",
                name,
                request.content_type,
                body,
                subresource=sub,
                field_validation=fv,
                dry_run=dry_run,
                manager=manager if apply else writer,
                force=q.get("force", "").lower() in ("1", "true"),
            )
        status = 201 if apply and not existed else 200  # an apply that creates answers as a create
        return _written(request, api, rt, obj, status, warnings, plain)
    if method == "DELETE":
        if sub:
            raise method_not_allowed()
        options = await _body(request, rt.kind)
        obj, gone = api.delete(
            rt, ns or "", name, options if isinstance(options, dict) else {}, dry_run=dry_run
        )
        return _json(obj, 200 if gone else 202)
    raise method_not_allowed()


def _requester(request: web.Request) -> rbac.User:
    return rbac.User.from_request(
        request.headers.get("Impersonate-User"), request.headers.getall("Impersonate-Group", [])
    )


def _rbac_store(api: Api) -> rbac.Store:
    def objects(plural: str) -> list[Obj]:
        return api.store.list((rbac.RBAC, plural), None)

    return rbac.Store(objects)


async def _access_review(request: web.Request) -> web.Response:
    """SelfSubjectAccessReview (`kubectl auth can-i VERB RESOURCE`), answered from the RBAC objects held
    (rbac.py) for the requester (`--as`, `--as-group`; else the admin)."""
    api = request.app[API_KEY]
    body = await _body(request, "SelfSubjectAccessReview")
    spec = (body or {}).get("spec") or {}
    res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if isinstance(res, dict):
        attrs = rbac.Attributes(
            verb=res.get("verb", ""),
            namespace=res.get("namespace", ""),
            group=res.get("group", ""),
            resource=res.get("resource", ""),
            subresource=res.get("subresource", ""),
            name=res.get("name", ""),
        )
    elif isinstance(non, dict):
        attrs = rbac.Attributes(verb=non.get("verb", ""), path=non.get("path", ""))
    else:
        raise bad_request("spec: Invalid value: exactly one of nonResourceAttributes or resourceAttributes "
                          "must be specified")
    allowed, reason = rbac.authorize(_rbac_store(api), _requester(request), attrs)
    status: Obj = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    out = {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": status,
    }
    return _json(out, 201)


async def _rules_review(request: web.Request) -> web.Response:
    """SelfSubjectRulesReview (`kubectl auth can-i --list`)."""
    api = request.app[API_KEY]
    spec = ((await _body(request, "SelfSubjectRulesReview")) or {}).get("spec") or {}
    resource, non_resource = rbac.rules_for(_rbac_store(api), _requester(request), spec.get("namespace", ""))
    out = {
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": {"resourceRules": resource, "nonResourceRules": non_resource, "incomplete": False},
    }
    return _json(out, 201)


async def _version(request: web.Request) -> web.Response:
    return _json(discovery.SERVER_VERSION)


async def _api(request: web.Request) -> web.Response:
    return _json(discovery.api_versions(request.host))


async def _api_v1(request: web.Request) -> web.Response:
    doc = discovery.resource_list(request.app[API_KEY].registry, "", "v1")
    return _json(doc)


async def _apis(request: web.Request) -> web.Response:
    return _json(discovery.api_group_list(request.app[API_KEY].registry))


async def _apis_group(request: web.Request) -> web.Response:
    doc = discovery.api_group(request.app[API_KEY].registry, request.match_info["group"])
    return _json(doc) if doc else _not_found()


async def _apis_gv(request: web.Request) -> web.Response:
    doc = discovery.resource_list(
        request.app[API_KEY].registry, request.match_info["group"], request.match_info["version"]
    )
    return _json(doc) if doc else _not_found()


async def _openapi_v2(request: web.Request) -> web.Response:
    if "protobuf" in request.headers.get("Accept", ""):
        return web.Response(
            body=discovery.OPENAPI_V2_PROTOBUF,
            content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        )
    return _json(discovery.OPENAPI_V2_JSON)


async def _openapi_v3_root(request: web.Request) -> web.Response:
    return _json(discovery.openapi_v3_root(request.app[API_KEY].registry))


async def _openapi_v3_gv(request: web.Request) -> web.Response:
    path = request.match_info["path"]
    parts = path.split("/")
    registry = request.app[API_KEY].registry
    if parts[0] == "api" and len(parts) == 2:
        doc = discovery.openapi_v3_document(registry, "", parts[1])
    elif parts[0] == "apis" and len(parts) == 3:
        doc = discovery.openapi_v3_document(registry, parts[1], parts[2])
    else:
        doc = None
    return _json(doc) if doc else _not_found()


async def _debug_requests(request: web.Request) -> web.Response:
    """Emulator only (no real server has it): how many requests each writer made, by verb and resource,
    so a benchmark counts the operator's API writes where they land."""
    counts = request.app[EMU_KEY].requests
    return _json({"requests": [{**k._asdict(), "count": n} for k, n in sorted(counts.items())]})


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(api: Api, emulator: Emulator) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=8 * 1024 * 1024)
    app[API_KEY] = api
    app[EMU_KEY] = emulator
    r = app.router
    r.add_get("/version", _version)
    r.add_get("/healthz", _ok)
    r.add_get("/livez", _ok)
    r.add_get("/readyz", _ok)
    r.add_get("/debug/requests", _debug_requests)
    r.add_get("/api", _api)
    r.add_get("/api/v1", _api_v1)
    r.add_get("/apis", _apis)
    r.add_get("/apis/{group}", _apis_group)
    r.add_get("/apis/{group}/{version}", _apis_gv)
    r.add_get("/openapi/v2", _openapi_v2)
    r.add_get("/openapi/v3", _openapi_v3_root)
    r.add_get("/openapi/v3/{path:.+}", _openapi_v3_gv)
    r.add_post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", _access_review)
    r.add_post("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", _rules_review)
    r.add_route("*", "/api/v1/{rest:.+}", _resource)
    r.add_route("*", "/apis/{group}/{version}/{rest:.+}", _resource)
    return app


class Emulator:
    """A running emulator. Use `async with Emulator.running(port=0) as emu:` in tests.

    Test hooks: `store` (the object store, e.g. `store.resource_version`), `api` (create/patch/delete
    objects without HTTP, e.g. to make a change a client must notice), `compact()` (drop watch history,
    so the next watch from an older resourceVersion gets 410), `end_watches()`, `stall_watches()`.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_interval: float = 10.0,
        history: int = 10_000,
    ) -> None:
        self.host, self.port = host, port
        self.bookmark_interval = bookmark_interval
        self.api = Api(Store(history=history))
        self.requests: Counter[RequestKey] = Counter()  # served at /debug/requests
        self._runner: web.AppRunner | None = None
        self.watches_stalled = False

    @property
    def store(self) -> Store:
        return self.api.store

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        self._runner = web.AppRunner(
            make_app(self.api, self), access_log=None, shutdown_timeout=2.0, handle_signals=False
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        if self.port == 0 and server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        log.info("emulator serving", url=self.url)

    async def stop(self) -> None:
        self.watches_stalled = False
        self.store.close_all()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @classmethod
    @asynccontextmanager
    async def running(cls, **kwargs: Any) -> AsyncIterator[Emulator]:
        emu = cls(**kwargs)
        await emu.start()
        try:
            yield emu
        finally:
            await emu.stop()

    def write_kubeconfig(self, path: str | os.PathLike[str], *, namespace: str = "default") -> Path:
        return kubeconfig.write(path, self.url, namespace=namespace)

    def kubeconfig(self, *, namespace: str = "default") -> dict[str, Any]:
        return kubeconfig.kubeconfig(self.url, namespace=namespace)

    def compact(self) -> int:
        """Forget the watch history: a watch from any earlier resourceVersion now gets the 410 event."""
        return self.store.compact()

    def end_watches(self) -> None:
        """End every open watch stream cleanly (as a real server does at its timeout): clients watch again."""
        self.store.close_all()

    def stall_watches(self, stalled: bool = True) -> None:
        """Keep open watch streams open but silent (no events, no bookmarks) until called with False;
        events made meanwhile are delivered after. For testing a client's stall detection."""
        self.watches_stalled = stalled

    def create_namespace(self, name: str) -> Obj:
        rt = self.api.resource("", "v1", "namespaces")
        return self.api.create(rt, "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})[
            0
        ]
