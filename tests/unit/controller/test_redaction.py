"""A healthCheck.url with credentials in it (userinfo, a signed query) is never published verbatim:
not in status, conditions, Events, logs, nor in a Failed message about the URL itself."""

from __future__ import annotations

import io

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy, TargetServer
from .test_lifecycle import KEY, phase, spec_for

SECRETS = ("s3cret", "SiGnAtUrE")


def _published(kube: FakeKube, logs: io.StringIO) -> str:
    return repr(kube.objects[KEY].get("status")) + repr(kube.events_for("px1")) + logs.getvalue()


async def test_probe_messages_redact_the_health_check_url(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, target: TargetServer,
        make_controller, logs: io.StringIO) -> None:
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    spec["healthCheck"].update(failureThreshold=1)
    spec["healthCheck"]["url"] = f"http://bob:s3cret@127.0.0.1:{target.port}/healthz?sig=SiGnAtUrE"
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Ready")
    assert f"GET http://REDACTED@127.0.0.1:{target.port}/healthz?REDACTED" in kube.status(KEY)["message"]
    await proxy_server.stop()  # failures: their messages (with the library's error text) go to Events
    await eventually(lambda: "Unhealthy" in kube.reasons("px1"))
    published = _published(kube, logs)
    assert "REDACTED" in published
    for secret in SECRETS:
        assert secret not in published


async def test_a_bad_health_check_url_fails_without_echoing_its_credentials(
        kube: FakeKube, provider: FakeProvider, proxy_server: MiniProxy, make_controller,
        logs: io.StringIO) -> None:
    make_controller({"kvm-home": provider})
    spec = spec_for(proxy_server)
    spec["healthCheck"]["url"] = "ftp://bob:s3cret@files.example/x?sig=SiGnAtUrE"
    kube.create_proxy("px1", spec)
    await eventually(lambda: phase(kube) == "Failed")
    assert kube.status(KEY)["message"].startswith("spec.healthCheck.url: 'ftp://REDACTED@files.example/x")
    for secret in SECRETS:
        assert secret not in _published(kube, logs)
