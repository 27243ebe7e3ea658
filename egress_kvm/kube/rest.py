"""Plain-JSON requests over kubernetes-asyncio's ApiClient, and one error type for API failures.

The generated typed APIs turn Leases and Events into model objects whose datetimes are re-serialised
by Python's isoformat, which drops the fraction when it is zero; the API server parses MicroTime with
exactly six fraction digits. Sending and receiving dicts keeps those fields as the server wrote them.

`send_json` builds the request kubernetes-asyncio's `ApiClient.call_api` would (the same headers, auth
through `update_params_for_auth`, so a token refresh hook still runs per request, the same URL, JSON body,
proxy and TLS session), without its generic machinery: walking the body to sanitise it, walking the
answer to deserialise it, a regex per request. call_api was a fifth of the operator's samples while 400
Proxies came up (docs/performance.md, "The operator's CPU per Proxy").
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from .interfaces import Obj
from .k8s import ApiClient, ApiException

MERGE_PATCH = "application/merge-patch+json"
DEFAULT_TIMEOUT = 30.0


class KubeApiError(Exception):
    """A non-2xx answer, reduced to what callers branch on (status) and what a human reads (message).

    kubernetes-asyncio's ApiException prints the response headers and body; this prints only the
    Status message, so an error never carries a whole object into a log line or an Event."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}" + (f": {message}" if message else ""))

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


def from_api_exception(exc: ApiException) -> KubeApiError:
    return api_error(int(exc.status or 0), str(exc.reason or ""), exc.body)


def api_error(status: int, reason: str, body: Any) -> KubeApiError:
    """A non-2xx answer: the Status object's reason and message when the body is one."""
    message = ""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        try:
            status_obj = json.loads(body)
        except ValueError:
            status_obj = None
        if isinstance(status_obj, dict):
            message = str(status_obj.get("message", ""))
            reason = str(status_obj.get("reason") or reason)
    return KubeApiError(status, reason, message)


def path_of(template: str, **params: str) -> str:
    """A path with its parameters quoted as the generated APIs quote them (nothing is safe)."""
    return template.format(**{k: quote(str(v), safe="") for k, v in params.items()})


async def request_json(api_client: ApiClient, method: str, path: str, *,
                       query: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
                       body: Obj | None = None, content_type: str = "application/json",
                       timeout: float = DEFAULT_TIMEOUT) -> Obj:  # noqa: ASYNC109 (per-request, passed to aiohttp)
    """`method path` with a JSON body; the decoded JSON answer, or KubeApiError."""
    result = await send_json(api_client, method, path, query=query, body=body, timeout=timeout,
                             headers={"Accept": "application/json", "Content-Type": content_type})
    return result if isinstance(result, dict) else {}


async def send_json(api_client: ApiClient, method: str, path: str, *,
                    query: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
                    body: Obj | None = None, headers: dict[str, str] | None = None,
                    timeout: float = DEFAULT_TIMEOUT) -> Any:  # noqa: ASYNC109 (per-request, passed to aiohttp)
    """The request `api_client.call_api(path, method, ...)` sends, in the order it builds it (`headers`
    first, then the client's defaults, its cookie, the auth header, and Content-Type if still unset), and
    the answer's JSON (its text if it is not JSON, as call_api); KubeApiError for a non-2xx answer.
    Transport errors (aiohttp's, a timeout) are raised as they are, as through call_api."""
    # Serialised first: nothing the caller holds can change under the awaits below.
    data = None if method == "GET" or body is None else json.dumps(body, default=_iso)
    params = list(query.items()) if isinstance(query, Mapping) else list(query or [])
    header_params = dict(headers or {})
    header_params.update(api_client.default_headers)
    if api_client.cookie:
        header_params["Cookie"] = api_client.cookie
    await api_client.update_params_for_auth(header_params, params, ["BearerToken"])
    header_params.setdefault("Content-Type", "application/json")
    rest = api_client.rest_client
    url = api_client.configuration.host + path
    if params:
        url += "?" + urlencode(params)
    extra: dict[str, Any] = {}
    if rest.proxy:
        extra["proxy"] = rest.proxy
    if rest.proxy_headers:
        extra["proxy_headers"] = rest.proxy_headers
    if rest.server_hostname:
        extra["server_hostname"] = rest.server_hostname
    async with rest.pool_manager.request(method, url, headers=header_params, data=data,
                                         timeout=aiohttp.ClientTimeout(total=timeout), **extra) as resp:
        raw = await resp.read()
        if not 200 <= resp.status <= 299:
            raise api_error(resp.status, str(resp.reason or ""), raw)
        text = raw.decode(resp.charset or "utf-8")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _iso(value: object) -> str:
    """What call_api's sanitiser does with a date in a body (json.dumps knows no dates)."""
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
