"""The thin I/O half of the egress policy: resolve, decide (egress.py), connect to what was decided.

Two ways in:
- `resolve_checked` for a bare host:port (the External probe): resolves once, keeps the first address
  the policy admits, and the caller connects to that address, not to the name again.
- `checked_session` + `open_checked` for HTTP (image downloads): the session's resolver hands aiohttp
  only admitted addresses (aiohttp then connects to exactly those), literal addresses (which aiohttp
  never resolves) are decided before the request, and redirects are followed here, one hop at a time,
  each decided like the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urljoin

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from .egress import Address, Policy, Purpose, Verdict, decide, explain, ip_literal, precheck, url_target

MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class EgressDenied(Exception):
    """A destination the policy refuses. The message is fixed text: no remote or library words."""

    def __init__(self, verdict: Verdict, *, purpose: Purpose, hop: int = 0) -> None:
        self.verdict = verdict
        self.purpose = purpose
        self.hop = hop
        where = f"redirect {hop}" if hop else "destination"
        super().__init__(explain(verdict, purpose=purpose, shown=f"the {purpose.value} {where}"))


class NameNotResolved(Exception):
    """The host name has no address (fixed text, unlike the resolver's own messages)."""


async def _addresses(host: str, port: int) -> list[tuple[Address, int]]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise NameNotResolved(f"{host} does not resolve") from None
    out: list[tuple[Address, int]] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            address = ip_literal(str(sockaddr[0]).split("%", 1)[0])
            if address is not None and (address, family) not in out:
                out.append((address, family))
    return out


async def resolve_checked(policy: Policy, *, host: str, port: int) -> Address:
    """The address to connect to for host:port under `policy`; EgressDenied or NameNotResolved."""
    first = precheck(policy, host=host, port=port)
    if not first.allowed:
        raise EgressDenied(first, purpose=policy.purpose)
    literal = ip_literal(host)
    if literal is not None:
        return literal
    found = await _addresses(host, port)
    if not found:
        raise NameNotResolved(f"{host} does not resolve")
    verdicts = [(decide(policy, host=host, port=port, address=a), a) for a, _ in found]
    for verdict, address in verdicts:
        if verdict.allowed:
            return address
    raise EgressDenied(verdicts[0][0], purpose=policy.purpose)


class PolicyResolver(AbstractResolver):
    """aiohttp resolver that returns only addresses the policy admits (all of them denied: EgressDenied,
    which is not an OSError, so aiohttp passes it up unwrapped)."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        try:
            results = await self._inner.resolve(host, port, family)
        except OSError:
            raise NameNotResolved(f"{host} does not resolve") from None
        admitted: list[ResolveResult] = []
        first_denial: Verdict | None = None
        for r in results:
            address = ip_literal(r["host"])
            verdict = Verdict.UNSPECIFIED if address is None else decide(self._policy, host=host, port=port,
                                                                        address=address)
            if verdict.allowed:
                admitted.append(r)
            elif first_denial is None:
                first_denial = verdict
        if not admitted:
            raise EgressDenied(first_denial or Verdict.UNSPECIFIED, purpose=self._policy.purpose)
        return admitted

    async def close(self) -> None:
        await self._inner.close()


def checked_session(policy: Policy, *, timeout: aiohttp.ClientTimeout | None = None) -> aiohttp.ClientSession:
    """A session whose every connection goes to an address `policy` admits (no proxy from the env)."""
    connector = aiohttp.TCPConnector(resolver=PolicyResolver(policy), use_dns_cache=False)
    # No transparent decoding: the bytes counted against size caps and free space are the bytes sent.
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False,
                                 auto_decompress=False)


@contextlib.asynccontextmanager
async def open_checked(session: aiohttp.ClientSession, url: str, policy: Policy, **kwargs: Any
                       ) -> AsyncIterator[aiohttp.ClientResponse]:
    """GET `url`, following up to MAX_REDIRECTS redirects, each hop decided by `policy` before it is
    requested. The session must come from `checked_session(policy)` (names are decided by its resolver)."""
    current = url
    for hop in range(MAX_REDIRECTS + 1):
        try:
            target = url_target(current)
        except ValueError:
            raise EgressDenied(Verdict.NOT_ALLOWED, purpose=policy.purpose, hop=hop) from None
        verdict = precheck(policy, host=target.host, port=target.port)
        if not verdict.allowed:
            raise EgressDenied(verdict, purpose=policy.purpose, hop=hop)
        try:
            resp = await session.get(current, allow_redirects=False, **kwargs)
        except EgressDenied as exc:
            raise EgressDenied(exc.verdict, purpose=policy.purpose, hop=hop) from None
        location = resp.headers.get("Location") if resp.status in _REDIRECTS else None
        if location is None:
            try:
                yield resp
            finally:
                resp.release()
            return
        resp.release()
        current = urljoin(current, location)
    raise TooManyRedirects(f"more than {MAX_REDIRECTS} redirects")


class TooManyRedirects(Exception):
    pass
