"""Image downloads under the egress policy, against real HTTP servers on loopback.

Each case is a request a tenant (or a redirect) could aim where the operator must not go; each must be
refused before a byte is fetched from there, with a fixed phrase, and leave no volume behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from fakes import fake_kvm_provider, qcow2_image
from provider_helpers import create_waiting, request

from egress_kvm.config.models import EgressConfig
from egress_kvm.providers.base import PermanentError, TransientError

IMAGE = qcow2_image(64 * 1024)


@dataclass
class Server:
    port: int = 0
    hits: list[str] = field(default_factory=list)
    redirect: str | None = None  # answer every request with a 302 to this
    raw: bytes | None = None  # answer with these bytes instead of HTTP (a banner)


Servers = tuple[Server, Server]


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    """Two loopback servers: `a` serves (or redirects), `b` must never be reached."""
    made: list[tuple[Server, web.AppRunner | asyncio.Server]] = []

    async def start() -> Server:
        srv = Server()

        async def handle(req: web.Request) -> web.StreamResponse:
            srv.hits.append(req.path_qs)
            if srv.redirect is not None:
                raise web.HTTPFound(srv.redirect)
            return web.Response(body=IMAGE)

        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        srv.port = runner.addresses[0][1]
        made.append((srv, runner))
        return srv

    a, b = await start(), await start()
    try:
        yield a, b
    finally:
        for _, runner in made:
            assert isinstance(runner, web.AppRunner)
            await runner.cleanup()


def _image(srv: Server) -> dict[str, dict[str, str]]:
    return {"debian-12": {"url": f"http://127.0.0.1:{srv.port}/d.qcow2"}}


def _egress(**kw: object) -> EgressConfig:
    return EgressConfig.model_validate(kw)


async def _refused(provider, hv, req, *, match: str) -> str:  # type: ignore[no-untyped-def]
    try:
        with pytest.raises(PermanentError, match=match) as info:
            await create_waiting(provider, req)
    finally:
        await provider.close()
    assert hv["host0"].volumes == {}, "a refused download must leave no volume"
    return str(info.value)


async def test_url_images_are_off_unless_the_providers_file_allows_them(servers: Servers) -> None:
    a, _ = servers
    provider, hv = fake_kvm_provider(images={}, precache=False, egress=_egress(allowedCIDRs=["127.0.0.1/32"]))
    url = f"http://127.0.0.1:{a.port}/x.qcow2"
    await _refused(provider, hv, request(image=url), match="URL images are off")
    assert a.hits == []


async def test_a_host_allowlist_entry_does_not_admit_a_denied_address(servers: Servers) -> None:
    """`urlImages: [images.test]` admits that name, not a literal loopback address."""
    a, _ = servers
    provider, hv = fake_kvm_provider(images={}, precache=False, urlImages=["images.test"], egress=None)
    url = f"http://127.0.0.1:{a.port}/x.qcow2"
    await _refused(provider, hv, request(image=url), match="loopback address")
    assert a.hits == []


async def test_a_url_image_allowed_by_cidr_and_port_is_fetched(servers: Servers) -> None:
    a, _ = servers
    provider, _ = fake_kvm_provider(images={}, precache=False, urlImages=[f"127.0.0.1/32:{a.port}"],
                                    egress=None)
    try:
        await create_waiting(provider, request(image=f"http://127.0.0.1:{a.port}/x.qcow2"))
    finally:
        await provider.close()
    assert a.hits == ["/x.qcow2"]


@pytest.mark.parametrize("where", ["http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/x"])
async def test_a_redirect_to_the_metadata_service_is_refused(servers: Servers, where: str) -> None:
    a, _ = servers
    a.redirect = where
    provider, hv = fake_kvm_provider(images=_image(a), precache=False,
                                     egress=_egress(allowedCIDRs=[f"127.0.0.1/32:{a.port}"]))
    msg = await _refused(provider, hv, request(), match="cloud metadata address")
    # where the redirect pointed is not echoed (a tenant's server chose it)
    assert "redirect 1" in msg and "169.254" not in msg and "fd00" not in msg


async def test_a_redirect_to_another_loopback_port_is_refused(servers: Servers) -> None:
    """Only 127.0.0.1:<a> is exempted: a redirect to b (literal) or to localhost (a name, decided by the
    resolver after DNS) is refused before b sees a request."""
    a, b = servers
    for target in (f"http://127.0.0.1:{b.port}/x", f"http://localhost:{b.port}/x"):
        a.redirect = target
        provider, hv = fake_kvm_provider(images=_image(a), precache=False,
                                         egress=_egress(allowedCIDRs=[f"127.0.0.1/32:{a.port}"]))
        await _refused(provider, hv, request(), match="loopback address")
    assert b.hits == []


async def test_the_default_policy_refuses_a_configured_image_on_loopback(servers: Servers) -> None:
    a, _ = servers
    provider, hv = fake_kvm_provider(images=_image(a), precache=False, egress=None)
    await _refused(provider, hv, request(), match="loopback address")
    assert a.hits == []


async def test_a_non_http_answer_is_a_fixed_phrase_not_the_banner() -> None:
    async def banner(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.9 secret-banner-text\r\n")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(banner, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/d.qcow2?X-Amz-Signature=sig%2Fsecret"
    provider, hv = fake_kvm_provider(images={"debian-12": {"url": url}}, precache=False)
    try:
        with pytest.raises(TransientError) as info:
            await create_waiting(provider, request())
    finally:
        await provider.close()
        srv.close()
        await srv.wait_closed()
    msg = str(info.value)
    assert msg.endswith(("failed: not a valid HTTP response", "the server closed the connection")), msg
    for leak in ("secret", "SSH-2.0", "sig%2F", "sig/"):
        assert leak not in msg
    assert hv["host0"].volumes == {}
