"""Fixed phrases for network failures, so status, Events, logs and metrics never echo remote text.

Library exceptions quote what they were given or received: aiohttp's messages carry the URL (signed
queries, userinfo) and, for a bad status line, the first bytes the peer sent (a banner: the port-scan
answer a tenant must not read back from status). So a failure is shown as one of these phrases, chosen
by the exception's type and errno, never by its text.
"""

from __future__ import annotations

import errno
import ssl

import aiohttp

from .connect import EgressDenied, NameNotResolved, TooManyRedirects

_ERRNO = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.ETIMEDOUT: "timed out",
    errno.EPIPE: "connection closed",
}


def failure_phrase(exc: BaseException) -> str:
    """A short fixed description of `exc` (its type decides, its text never does)."""
    if isinstance(exc, EgressDenied):
        return str(exc)  # built from fixed phrases only
    if isinstance(exc, NameNotResolved | aiohttp.ClientConnectorDNSError):
        return "the host name does not resolve"
    if isinstance(exc, TooManyRedirects):
        return "too many redirects"
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError | ssl.SSLError):
        return "TLS handshake failed"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return _ERRNO.get(exc.os_error.errno or 0, "connection failed")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the response body was cut off or malformed"
    if isinstance(exc, aiohttp.ClientResponseError | aiohttp.http_exceptions.HttpProcessingError):
        return "not a valid HTTP response"
    if isinstance(exc, aiohttp.InvalidURL):
        return "invalid URL"
    if isinstance(exc, OSError):
        return _ERRNO.get(exc.errno or 0, "connection failed")
    if isinstance(exc, aiohttp.ClientError):
        return "HTTP client error"
    return f"failed ({type(exc).__name__})"
