"""Secrets never leave their Secret: not in status, Events, logs or exception text, whatever happens."""

from __future__ import annotations

import json

from egress_kvm.controller.desired import Desired
from egress_kvm.policy.secrets import USABLE
from egress_kvm.providers.base import CreateRequest, ResolvedPlacement

from .conftest import eventually
from .fakekube import FakeKube
from .fakeprovider import FakeProvider
from .proxyserver import MiniProxy, TargetServer
from .test_lifecycle import KEY, phase, spec_for

INLINE = "INLINE-USERDATA-7f3a"
FROM_SECRET = b"SECRET-USERDATA-91bc"
PASSWORD = "PROXY-PASSWORD-4d2e"
WRONG_PASSWORD = "WRONG-PASSWORD-0a0a"


async def test_user_data_and_proxy_password_never_leak(
        kube: FakeKube, provider: FakeProvider, target: TargetServer, make_controller, logs) -> None:
    proxy = MiniProxy(username="crawler", password=PASSWORD)
    await proxy.start()
    statuses: list[str] = []
    kube.watch(lambda kind, obj: statuses.append(json.dumps(obj.get("status") or {})))
    try:
        kube.put_secret("default", "ci", {"user-data": FROM_SECRET}, labels=USABLE)
        kube.put_secret("default", "auth", {"username": b"crawler", "password": WRONG_PASSWORD.encode()},
                        labels=USABLE)
        make_controller({"kvm-home": provider})
        spec = spec_for(proxy, target, cloudInit={"userData": f"#cloud-config\n# {INLINE}\n"})
        spec["auth"] = {"secretRef": {"name": "auth"}}
        spec["healthCheck"]["failureThreshold"] = 1
        kube.create_proxy("px1", spec)
        # wrong password: 407 through the proxy, unhealthy, and the message says so without the password
        await eventually(lambda: "HTTP 407" in json.dumps(kube.status(KEY)))
        kube.put_secret("default", "auth", {"username": b"crawler", "password": PASSWORD.encode()},
                        labels=USABLE)
        await eventually(lambda: phase(kube) == "Ready", limit=20)
        assert any(a and a.startswith("Basic ") for a in proxy.auth_seen)
        # user-data from a Secret, a replacement, a failure, a deletion: more text to leak into
        spec["cloudInit"] = {"secretRef": {"name": "ci", "key": "user-data"}}
        kube.set_spec(KEY, spec)
        await eventually(lambda: phase(kube) == "Ready" and "previousInstance" not in kube.status(KEY),
                         limit=20)
        spec["placement"]["zone"] = "nowhere"
        kube.set_spec(KEY, spec)
        await eventually(lambda: phase(kube) == "Failed")
        kube.delete(KEY)
        await eventually(lambda: KEY not in kube.objects)
    finally:
        await proxy.stop()
    assert provider.user_data  # the provider did get them
    everything = "\n".join([*statuses, json.dumps(kube.events), logs.getvalue()])
    assert logs.getvalue().count("\n") > 20  # the log was on, verbosely
    for secret in (INLINE, FROM_SECRET.decode(), PASSWORD, WRONG_PASSWORD):
        assert secret not in everything


def test_user_data_is_not_in_reprs() -> None:
    req = CreateRequest(name="proxy-x", owner_uid="u", placement=ResolvedPlacement("z", "m", "i"),
                        user_data=FROM_SECRET)
    assert FROM_SECRET.decode() not in repr(req)
    d = Desired(provider=None, resolved=None, name="n", user_data=FROM_SECRET)  # type: ignore[arg-type]
    assert FROM_SECRET.decode() not in repr(d)
