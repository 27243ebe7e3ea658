"""Delete trusts the host's metadata, not status (issue 13 item 4): a Proxy whose status names another
Proxy's instance (written by hand, or by anyone who may patch proxies/status) deletes nothing of it;
a Warning Event (NotOwner) says so and the Proxy itself goes."""

from __future__ import annotations

from fakes import FakeHypervisors

from .conftest import eventually
from .fakekube import FakeKube
from .proxyserver import MiniProxy
from .test_lifecycle import phase
from .test_with_kvm_provider import PROVIDER, instance_volumes, kvm, kvm_spec, volumes_of

_ = kvm  # the fixture


async def test_a_forged_status_instance_is_not_deleted(
        kube: FakeKube, kvm, proxy_server: MiniProxy, make_controller) -> None:
    provider, hv = kvm
    h = hv["host0"]
    assert isinstance(hv, FakeHypervisors)
    make_controller({PROVIDER: provider})
    kube.create_proxy("victim", kvm_spec(proxy_server))
    await eventually(lambda: (kube.status(("default", "victim")).get("instance") or {}).get("name")
                     in h.domains, what="victim's VM defined")
    victim = kube.status(("default", "victim"))["instance"]
    # The attacker's Proxy fails (unknown zone) so it holds no instance of its own, then its status is
    # pointed at the victim's instance.
    bad = kvm_spec(proxy_server, placement={"zone": "nowhere", "machineType": "small", "image": "debian-12"})
    kube.create_proxy("attacker", bad)
    await eventually(lambda: phase(kube, ("default", "attacker")) == "Failed", what="attacker Failed")
    kube.objects[("default", "attacker")]["status"]["instance"] = dict(victim)
    kube.delete(("default", "attacker"))
    await eventually(lambda: ("default", "attacker") not in kube.objects, what="attacker gone")
    assert victim["name"] in h.domains and h.domains[victim["name"]].id != -1
    assert instance_volumes(h, victim["name"]) == volumes_of(victim["name"])
    warnings = [e for e in kube.events_for("attacker") if e[1] == "NotOwner"]
    assert warnings and warnings[0][0] == "Warning" and "belongs to another Proxy" in warnings[0][2]
