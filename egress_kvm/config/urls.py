"""URLs as they may be shown: in logs, errors, events and status.

An image URL may carry credentials (`https://user:token@host/...`) or be pre-signed (a signature in its
query string). Whatever is printed drops both; the full URL is only ever used to fetch.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def display_url(url: str) -> str:
    """`url` without userinfo, query or fragment; `?...` marks a dropped query string."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    if not parts.scheme or not parts.netloc:
        # Not a URL with an authority: show only what precedes any query (a query may be a signature).
        return url.split("?", 1)[0].split("#", 1)[0].rsplit("@", 1)[-1]
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    shown = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return shown + ("?..." if parts.query else "")
