"""Plain-JSON requests through kubernetes-asyncio's ApiClient, and one error type for API failures.

The generated typed APIs turn Leases and Events into model objects whose datetimes are re-serialised
by Python's isoformat, which drops the fraction when it is zero; the API server parses MicroTime with
exactly six fraction digits. Sending and receiving dicts keeps those fields as the server wrote them, and
it still goes through the same ApiClient (same auth, TLS and token refresh) as the typed calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from .interfaces import Obj

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
    body: Any = exc.body
    message = ""
    reason = str(exc.reason or "")
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
    return KubeApiError(int(exc.status or 0), reason, message)


async def request_json(api_client: ApiClient, method: str, path: str, *,
                       query: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
                       body: Obj | None = None, content_type: str = "application/json",
                       timeout: float = DEFAULT_TIMEOUT) -> Obj:  # noqa: ASYNC109 (per-request, passed to aiohttp)
    """`method path` with a JSON body; the decoded JSON answer, or KubeApiError."""
    params = list(query.items()) if isinstance(query, Mapping) else list(query or [])
    try:
        result = await api_client.call_api(
            path, method,
            query_params=params,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            response_types_map={200: "object", 201: "object", 202: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=True,
            _request_timeout=timeout,
        )
    except ApiException as exc:
        raise from_api_exception(exc) from None
    return result if isinstance(result, dict) else {}
