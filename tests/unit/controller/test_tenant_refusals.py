"""A tenant who may create Proxies tries each hole of issue 13 (items 1, 2): each is refused with a clear
status, and nothing reaches the place it aimed at."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from egress_kvm.config.models import EgressConfig
from egress_kvm.policy.policies import EgressPolicies
from egress_kvm.policy.secrets import USABLE, USABLE_LABEL

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy, TargetServer
from .test_lifecycle import KEY, phase, spec_for

PASSWORD = "TENANT-PASSWORD-5e1f"


def _policies(**egress: object) -> EgressPolicies:
    return EgressPolicies.from_config(EgressConfig.model_validate(egress))


async def test_a_secret_without_the_opt_in_label_is_not_placed_on_a_seed(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    kube.put_secret("default", "db-password", {"user-data": b"not-for-vms"})  # no label
    make_controller({"kvm-home": provider})
    kube.create_proxy("px1", spec_for(proxy_server, cloudInit={
        "secretRef": {"name": "db-password", "key": "user-data"}}))
    await eventually(lambda: phase(kube) == "Pending")
    message = kube.status(KEY)["message"]
    assert "default/db-password is not usable by Proxies" in message and USABLE_LABEL in message
    assert "spec.cloudInit.secretRef" in message
    assert provider.calls == []  # nothing created: the Secret's bytes went nowhere
    # the owner (or an admin) opts the Secret in: the Proxy goes on
    kube.put_secret("default", "db-password", {"user-data": b"#cloud-config\n"}, labels=USABLE)
    await eventually(lambda: phase(kube) == "Ready")


async def test_auth_credentials_from_an_unlabelled_secret_are_never_sent(
        kube: FakeKube, provider: FakeProvider, target: TargetServer, make_controller) -> None:
    proxy = MiniProxy(username="u", password=PASSWORD)
    await proxy.start()
    try:
        kube.put_secret("default", "basic", {"username": b"u", "password": PASSWORD.encode()})  # no label
        make_controller({"kvm-home": provider})
        spec = spec_for(proxy, target, auth={"secretRef": {"name": "basic"}})
        kube.create_proxy("px1", spec)
        await eventually(lambda: USABLE_LABEL in kube.status(KEY).get("message", ""))
        assert "spec.auth.secretRef" in kube.status(KEY)["message"]
        await asyncio.sleep(1.5)  # more probe intervals: still nothing sent
        assert all(a is None for a in proxy.auth_seen) and PASSWORD not in json.dumps(kube.status(KEY))
    finally:
        await proxy.stop()


async def test_external_credentials_go_only_to_allowed_endpoints(
        kube: FakeKube, provider: FakeProvider, target: TargetServer, make_controller) -> None:
    """A tenant names a listener of their own as External endpoint with a (labelled) basic-auth Secret:
    without an egress.authEndpoints entry the Proxy is Failed and the listener sees nothing."""
    listener = MiniProxy()
    await listener.start()
    try:
        kube.put_secret("default", "basic", {"username": b"u", "password": PASSWORD.encode()}, labels=USABLE)
        make_controller({}, egress=_policies(allowedCIDRs=["127.0.0.0/8"]))
        spec = {"mode": "External", "external": {"address": f"127.0.0.1:{listener.port}"},
                "auth": {"secretRef": {"name": "basic"}},
                "healthCheck": {"url": target.url, "intervalSeconds": 1}}
        kube.create_proxy("px1", spec)
        await eventually(lambda: phase(kube) == "Failed")
        message = kube.status(KEY)["message"]
        assert message.startswith("spec.auth.secretRef: credentials are sent only to endpoints the admin")
        assert "egress.authEndpoints" in message
        assert listener.requests == 0 and listener.auth_seen == []
    finally:
        await listener.stop()


async def test_external_credentials_reach_an_allowed_endpoint(
        kube: FakeKube, provider: FakeProvider, target: TargetServer, make_controller) -> None:
    proxy = MiniProxy(username="u", password=PASSWORD)
    await proxy.start()
    try:
        kube.put_secret("default", "basic", {"username": b"u", "password": PASSWORD.encode()}, labels=USABLE)
        make_controller({}, egress=_policies(allowedCIDRs=["127.0.0.0/8"],
                                             authEndpoints=[f"127.0.0.1:{proxy.port}"]))
        kube.create_proxy("px1", {"mode": "External", "external": {"address": f"127.0.0.1:{proxy.port}"},
                                  "auth": {"secretRef": {"name": "basic"}},
                                  "healthCheck": {"url": target.url, "intervalSeconds": 1}})
        await eventually(lambda: phase(kube) == "Ready")
        assert any(a and a.startswith("Basic ") for a in proxy.auth_seen)
    finally:
        await proxy.stop()


async def test_external_endpoints_in_denied_ranges_are_refused(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The default policy: loopback (the operator's own pod), metadata, cluster ranges."""
    make_controller({}, egress=EgressPolicies.from_config())
    cases = {"lo": (f"127.0.0.1:{proxy_server.port}", "is a loopback address"),
             "md": ("169.254.169.254:80", "is a cloud metadata address"),
             "svc": ("10.96.0.1:443", "is in a cluster range")}
    for name, (address, _) in cases.items():
        kube.create_proxy(name, {"mode": "External", "external": {"address": address},
                                 "healthCheck": {"intervalSeconds": 1}})
    for name, (_, phrase) in cases.items():
        await eventually(lambda n=name: phase(kube, ("default", n)) == "Failed")
        message = kube.status(("default", name))["message"]
        assert message.startswith("spec.external.address:") and phrase in message
    assert proxy_server.requests == 0


async def test_a_name_resolving_into_a_denied_range_is_refused_at_probe_time(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """`localhost` passes the spec check (a name), and the probe refuses the address it resolves to."""
    make_controller({}, egress=EgressPolicies.from_config())
    kube.create_proxy("px1", {"mode": "External", "external": {"address": f"localhost:{proxy_server.port}"},
                              "healthCheck": {"intervalSeconds": 1, "failureThreshold": 1}})
    await eventually(lambda: "loopback address" in kube.status(KEY).get("message", ""))
    assert kube.status(KEY)["phase"] == "Running" and proxy_server.requests == 0


async def test_a_probe_reports_a_fixed_phrase_never_the_banner(
        kube: FakeKube, provider: FakeProvider, target: TargetServer, make_controller) -> None:
    """An External endpoint that answers with a non-HTTP banner (a port scan's answer)."""
    async def banner(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.9 internal-host-banner\r\n")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(banner, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        make_controller({})
        kube.create_proxy("px1", {"mode": "External", "external": {"address": f"127.0.0.1:{port}"},
                                  "healthCheck": {"url": target.url, "intervalSeconds": 1,
                                                  "failureThreshold": 1}})
        await eventually(lambda: "unhealthy" in kube.status(KEY).get("message", ""))
        message = kube.status(KEY)["message"]
        assert "SSH-2.0" not in message and "banner" not in message
        assert message.endswith(("not a valid HTTP response", "the server closed the connection")), message
        for event in kube.events:
            assert "SSH-2.0" not in event["message"]
    finally:
        srv.close()
        await srv.wait_closed()


async def test_a_guest_reported_metadata_address_is_not_probed(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller) -> None:
    """The guest controls the IP its agent reports: naming the metadata service (or loopback) must not
    make the operator send its probes there. (Cluster ranges do not apply: VMs live on private LANs.)"""
    c = make_controller({"kvm-home": provider}, egress=EgressPolicies.from_config())
    kube.create_proxy("px1", spec_for(proxy_server))
    await eventually(lambda: bool(kube.status(KEY).get("instance")))
    name = kube.status(KEY)["instance"]["name"]
    await eventually(lambda: ("nas1", name) in provider.vms)
    provider.vms[("nas1", name)] = dataclasses.replace(provider.vms[("nas1", name)], ip="169.254.169.254")
    c.enqueue(KEY)
    await eventually(lambda: "not probing 169.254.169.254" in kube.status(KEY).get("message", ""))
    assert "cloud metadata address" in kube.status(KEY)["message"]
    assert kube.status(KEY)["phase"] != "Ready"


async def test_an_admin_allowing_the_endpoint_in_the_providers_file_un_fails_the_proxy(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, target: TargetServer,
        make_controller) -> None:
    c = make_controller({}, egress=EgressPolicies.from_config())
    kube.create_proxy("px1", {"mode": "External", "external": {"address": f"127.0.0.1:{proxy_server.port}"},
                              "healthCheck": {"url": target.url, "intervalSeconds": 1}})
    await eventually(lambda: phase(kube) == "Failed")
    assert proxy_server.requests == 0
    allowed = _policies(allowedCIDRs=[f"127.0.0.1/32:{proxy_server.port}"])
    c.update_providers({}, "hash-with-egress", egress=allowed)
    await eventually(lambda: phase(kube) == "Ready")
