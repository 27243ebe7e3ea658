"""The shapes a Proxy's string fields must have: one table, mirrored by the CRD's `pattern`s.

The CRD refuses these at admission (deploy/crd; a test checks each pattern against this table), and
`proxyspec` refuses them again for objects the API server did not check (written before the CRD had the
pattern, or by a server that does not validate). Every shape refuses control characters: they end up in
libvirt's XML (where lxml refuses them only after volumes exist), in names and in messages.
"""

from __future__ import annotations

import enum
import re


class Shape(enum.Enum):
    TEXT = "text"  # anything printable (machineType keys, region)
    NAME = "name"  # provider and zone names: the providers file's own rule for them
    IMAGE = "image"  # an image key or an http(s) URL: no spaces either
    URL = "url"  # healthCheck.url
    ADDRESS = "address"  # host:port or [v6]:port
    SECRET_NAME = "secret name"  # a DNS subdomain (RFC 1123)
    SECRET_KEY = "secret key"  # a Secret data key


#: Each pattern is written for both engines that apply it: Python's `re` (operator, emulator) and Go's
#: RE2 (the Kubernetes API server), so only their common syntax is used.
PATTERNS: dict[Shape, str] = {
    Shape.TEXT: r"^[^\x00-\x1F\x7F]*$",
    Shape.NAME: r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$",
    Shape.IMAGE: r"^[^\x00-\x20\x7F]*$",
    Shape.URL: r"^https?://[^\x00-\x20\x7F]+$",
    Shape.ADDRESS: r"^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$",
    Shape.SECRET_NAME: r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    Shape.SECRET_KEY: r"^[-._a-zA-Z0-9]+$",
}

#: The longest value of each shape, the CRD's `maxLength` at most (a field may be tighter there). Values
#: are echoed in status, Events and logs, and a tenant's megabyte there would make each of them fail.
MAX_LENGTH: dict[Shape, int] = {
    Shape.TEXT: 253,
    Shape.NAME: 253,
    Shape.IMAGE: 2048,
    Shape.URL: 2048,
    Shape.ADDRESS: 261,  # a 253-character name, ':' and a port; or [IPv6]:port
    Shape.SECRET_NAME: 253,
    Shape.SECRET_KEY: 253,
}

_RULES: dict[Shape, str] = {
    Shape.TEXT: "must not contain control characters",
    Shape.NAME: "must be 1-63 letters, digits, '.', '_' or '-', starting and ending alphanumeric",
    Shape.IMAGE: "must not contain spaces or control characters",
    Shape.URL: "is not an http(s) URL without spaces or control characters",
    Shape.ADDRESS: "is not host:port",
    Shape.SECRET_NAME: "is not a Secret name (lowercase letters, digits, '-' and '.')",
    Shape.SECRET_KEY: "is not a Secret key (letters, digits, '-', '_' and '.')",
}

_COMPILED = {shape: re.compile(p) for shape, p in PATTERNS.items()}


def shape_problem(value: str, shape: Shape) -> str | None:
    """None when `value` has the shape, else what is wrong (for a message after the field path)."""
    if len(value) > MAX_LENGTH[shape]:
        return f"is longer than {MAX_LENGTH[shape]} characters"
    if _COMPILED[shape].search(value) and "\n" not in value:  # `$` also matches before a final newline
        return None
    return _RULES[shape]
