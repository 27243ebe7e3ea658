"""Making user-supplied URLs safe to show: in logs, status, conditions, Events and error messages.

One helper for every URL a user gives us: health-check URLs, image URLs, values echoed by config errors.

A URL can carry a credential in two places: the userinfo (`https://user:token@host/`) and the query
string (a presigned `?X-Amz-Signature=...`, an `?access_token=`). Neither helps anyone reading a log,
so both are replaced by a marker; scheme, host, port and path stay, which is what identifies the URL.
"""

from __future__ import annotations

from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit, urlunsplit

REDACTED = "REDACTED"


def redact_url(url: str) -> str:
    """`url` without userinfo and query string (each replaced by a marker); the fragment is dropped too.

    Never raises: something that does not parse as a URL is reduced to its scheme (or a marker), since
    a malformed URL is exactly the one an error message would otherwise echo verbatim.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        scheme = url.split(":", 1)[0] if ":" in url else ""
        return f"{scheme}://{REDACTED}" if scheme.isalnum() else REDACTED
    if not parts.scheme or not parts.netloc:
        # Not a URL with an authority (`user:pw@host/x?sig=1` typed without a scheme): keep only what
        # follows any userinfo and precedes any query or fragment.
        bare = url.split("?", 1)[0].split("#", 1)[0].rsplit("@", 1)[-1]
        return f"{bare}?{REDACTED}" if parts.query or "?" in url else bare
    netloc = host if ":" not in host else f"[{host}]"
    if port is not None:
        netloc = f"{netloc}:{port}"
    if parts.username is not None or parts.password is not None:
        netloc = f"{REDACTED}@{netloc}"
    query = REDACTED if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _forms(secret: str) -> set[str]:
    """`secret` as a library may print it: as given, percent-decoded, percent-encoded (yarl normalises
    URLs, so `sig%2Fx` may come back as `sig/x` and the other way round), in either hex case."""
    decoded = unquote_plus(secret)
    forms = {secret, unquote(secret), decoded, quote(decoded, safe=""), quote(decoded, safe="=&"),
             quote(decoded, safe="/:=&@"), quote_plus(decoded, safe="=&")}
    forms |= {f.lower() for f in forms if "%" in f} | {f.upper() for f in forms if "%" in f}
    return {f for f in forms if f}


def scrub(text: str, url: str) -> str:
    """`text` (e.g. a library's error message) with every copy of `url`, and of its userinfo and query,
    replaced, percent-encoded or decoded too: libraries quote the URL they were given, sometimes in pieces
    and re-encoded."""
    safe = redact_url(url)
    out = text.replace(url, safe)
    try:
        parts = urlsplit(url)
    except ValueError:
        return out
    secrets = [parts.netloc.rpartition("@")[0] if "@" in parts.netloc else "", parts.query]
    # each userinfo part and query value alone too: a library may print them apart or reordered
    secrets += parts.netloc.rpartition("@")[0].split(":") if "@" in parts.netloc else []
    secrets += [v for pair in parts.query.split("&") for v in pair.split("=", 1)[1:] if len(v) >= 4]
    for form in sorted({f for s in secrets if s for f in _forms(s)}, key=len, reverse=True):
        out = out.replace(form, REDACTED)
    return out
