"""The Controller with the real Kubernetes layer (KubeApiClient + ProxyInformer) against the API emulator.

What the in-memory FakeKube cannot prove: that the status the reconciler writes passes the CRD's schema on
a server, goes through the status subresource, survives real 409s, that Events land as core/v1 Events a
`kubectl describe` finds, that finalizers hold a real deletion, and that the informer's events drive the
queue. The provider is the real KvmProvider over the fake libvirt.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes import fake_kvm_provider
from kubernetes_asyncio.client import ApiClient, Configuration

from egress_kvm.controller.manager import Controller
from egress_kvm.controller.verdict import ProbeKey
from egress_kvm.kube.api import KubeApiClient, rfc3339
from egress_kvm.kube.informer import ProxyInformer
from egress_kvm.kube.interfaces import FINALIZER, GROUP, KIND, PLURAL, VERSION
from egress_kvm.kube.rest import KubeApiError, request_json
from egress_kvm.policy.secrets import USABLE
from egress_kvm.providers.kvm import addresses
from testbed.emulator import Emulator

from .conftest import FAST, LOOPBACK_POLICIES, eventually
from .proxyserver import MiniProxy

CRD = Path(__file__).resolve().parents[3] / "deploy/crd/egressproxies.io_proxies.yaml"
NS = "default"


def path(name: str = "") -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"
    return f"{base}/{name}" if name else base


class Cluster:
    """An emulator, a client for the test (playing kubectl) and the operator's pieces wired together."""

    def __init__(self, client: ApiClient, controller: Controller, informer: ProxyInformer) -> None:
        self.client = client
        self.controller = controller
        self.informer = informer
        self.proxies: dict[str, dict[str, Any]] = {}  # name -> last object the informer saw

    async def get(self, name: str) -> dict[str, Any] | None:
        try:
            return await request_json(self.client, "GET", path(name))
        except KubeApiError as e:
            if e.status == 404:
                return None
            raise

    async def status(self, name: str) -> dict[str, Any]:
        obj = await self.get(name)
        return (obj or {}).get("status") or {}

    async def until_status(self, name: str, pred: Any, *, limit: float = 15) -> dict[str, Any]:
        async with asyncio.timeout(limit):
            while True:
                st = await self.status(name)
                if pred(st):
                    return st
                await asyncio.sleep(0.02)

    async def events(self, name: str) -> list[tuple[str, str, str]]:
        out = await request_json(self.client, "GET", f"/api/v1/namespaces/{NS}/events",
                                 query={"fieldSelector": f"involvedObject.name={name}"})
        return [(e["type"], e["reason"], e["message"]) for e in out["items"]]

    async def until_events(self, name: str, pred: Any, *, limit: float = 15) -> list[tuple[str, str, str]]:
        """Events are written in the background after the pass that records them: poll for them."""
        async with asyncio.timeout(limit):
            while True:
                events = await self.events(name)
                if pred(events):
                    return events
                await asyncio.sleep(0.02)


@pytest.fixture
async def cluster(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Cluster, Any]]:
    real = addresses.usable_ipv4  # the test's "VM" proxy lives on loopback (see test_with_kvm_provider)
    monkeypatch.setattr(addresses, "usable_ipv4", lambda a: a.startswith("127.") or real(a))
    provider, hv = fake_kvm_provider(hosts=["host0"], cluster_id="c1")
    async with Emulator.running(port=0) as emu, ApiClient(Configuration(host=emu.url)) as test_client, \
            ApiClient(Configuration(host=emu.url)) as op_client:
        await request_json(test_client, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                           body=yaml.safe_load(CRD.read_text()))
        controller_ref: list[Controller] = []
        informer = ProxyInformer(op_client, namespace=None,
                                 on_event=lambda kind, obj: controller_ref[0].on_event(kind, obj))
        kube = KubeApiClient(op_client)
        controller = Controller(kube=kube, store=informer, egress=LOOPBACK_POLICIES,
                                providers={"kvm-test": provider}, resync_period=3600, gc_interval=3600,
                                **FAST)
        controller_ref.append(controller)
        informer_task = asyncio.create_task(informer.run())
        run = asyncio.create_task(controller.run())
        try:
            await eventually(informer.has_synced)
            yield Cluster(test_client, controller, informer), hv
        finally:
            await controller.stop(timeout=2)
            await run
            await kube.close()
            informer.stop()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(informer_task, 5)
            await provider.close()


def spec_for(proxy: MiniProxy, **extra: Any) -> dict[str, Any]:
    return {"mode": "Managed", "provider": "kvm-test",
            "placement": {"zone": "host0", "machineType": "small", "image": "debian-12"},
            "port": proxy.port, "healthCheck": {"intervalSeconds": 1}, **extra}


async def apply(c: Cluster, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return await request_json(c.client, "POST", path(), body={
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name, "namespace": NS},
        "spec": spec})


async def test_proxy_to_ready_replaced_and_deleted_through_the_real_kube_layer(
        cluster: tuple[Cluster, Any], proxy_server: MiniProxy) -> None:
    c, hv = cluster
    h = hv["host0"]
    await request_json(c.client, "POST", f"/api/v1/namespaces/{NS}/secrets", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ci", "namespace": NS, "labels": USABLE},
        "data": {"user-data": base64.b64encode(b"#cloud-config\n# v1\n").decode()}})
    await apply(c, "px1", spec_for(proxy_server, cloudInit={"secretRef": {"name": "ci", "key": "user-data"}}))

    st = await c.until_status("px1", lambda s: (s.get("instance") or {}).get("name") in h.domains)
    first = st["instance"]["name"]
    h.set_vm_ip(first, "127.0.0.1")
    c.controller.enqueue((NS, "px1"))  # the VM's IP appears without any Kubernetes event
    st = await c.until_status("px1", lambda s: s.get("phase") == "Ready")
    obj = await c.get("px1")
    assert obj is not None and FINALIZER in obj["metadata"]["finalizers"]
    assert st["healthy"] is True and st["ip"] == "127.0.0.1"
    assert st["observedGeneration"] == obj["metadata"]["generation"]
    assert {x["type"]: x["status"] for x in st["conditions"]} == {"Ready": "True", "Healthy": "True",
                                                                    "HostReachable": "True"}
    await c.until_events("px1", lambda evs: {"Created", "Running", "Ready"} <= {r for _, r, _ in evs})

    # A spec fix through a merge patch: replaced create-before-delete.
    await request_json(c.client, "PATCH", path("px1"), body={"spec": {"placement": {"machineType": "small",
                                                                                   "image": "debian-12",
                                                                                   "zone": "host0"},
                                                                     "cloudInit": {"userData": "#v2\n",
                                                                                   "secretRef": None}}},
                       content_type="application/merge-patch+json")
    st = await c.until_status("px1", lambda s: (s.get("previousInstance") or {}).get("name") == first)
    second = st["instance"]["name"]
    await eventually(lambda: second in h.domains)
    h.set_vm_ip(second, "127.0.0.1")
    c.controller.enqueue((NS, "px1"))
    await c.until_status("px1", lambda s: s.get("phase") == "Ready" and "previousInstance" not in s
                         and s["instance"]["name"] == second)
    assert set(h.domains) == {second}

    await request_json(c.client, "DELETE", path("px1"))
    async with asyncio.timeout(15):
        while True:
            if await c.get("px1") is None:
                break
            await asyncio.sleep(0.02)
    assert h.domains == {}
    assert not [v for v in h.volumes if v.startswith("proxy-")]
    deleted = ("Normal", "Deleted", f"deleted instance {second} on host0")
    await c.until_events("px1", lambda evs: deleted in evs)


async def test_failed_on_the_server_names_the_field_and_is_fixed_by_a_spec_change(
        cluster: tuple[Cluster, Any], proxy_server: MiniProxy) -> None:
    c, _ = cluster
    spec = spec_for(proxy_server)
    spec["placement"]["machineType"] = "xlarge"
    await apply(c, "px1", spec)
    st = await c.until_status("px1", lambda s: s.get("phase") == "Failed")
    assert "'xlarge'" in st["message"]
    await c.until_events("px1", lambda evs: any(r == "Failed" and "'xlarge'" in m for _, r, m in evs))
    await request_json(c.client, "PATCH", path("px1"),
                       body={"spec": {"placement": {"machineType": "small"}}},
                       content_type="application/merge-patch+json")
    await c.until_status("px1", lambda s: s.get("phase") == "Provisioning"
                         and s.get("observedGeneration") == 2)


async def proxy_gets(c: Cluster) -> int:
    """GETs of single Proxies the emulator served (any client; the test makes none while counting)."""
    rows = (await request_json(c.client, "GET", "/debug/requests"))["requests"]
    return sum(r["count"] for r in rows if r["method"] == "GET" and not r["watch"]
               and r["resource"] == PLURAL and not r["subresource"])


async def test_a_settled_proxys_resync_costs_the_api_server_nothing(
        cluster: tuple[Cluster, Any], proxy_server: MiniProxy) -> None:
    """The real informer's cache (inline user-data trimmed away) stands in for the GET on a routine pass
    (controller/cached.py): three resyncs of a Ready Proxy, no request. A routine pass that has something
    to write (here a lone lastProbeTime, --probe-time-refresh) reads the Proxy fresh and writes onto it."""
    c, hv = cluster
    key = (NS, "px1")
    await apply(c, "px1", spec_for(proxy_server, cloudInit={"userData": "#cloud-config\n"}))
    st = await c.until_status("px1", lambda s: (s.get("instance") or {}).get("name") in hv["host0"].domains)
    hv["host0"].set_vm_ip(st["instance"]["name"], "127.0.0.1")
    c.controller.enqueue(key)
    await c.until_status("px1", lambda s: s.get("phase") == "Ready" and s.get("healthy") is True)
    q = c.controller.queue
    await eventually(lambda: not q.wanted(key) and key not in q.processing() and not q.pending_delayed())
    passes: list[bool] = []
    real = c.controller.reconciler.reconcile

    async def counted(k: tuple[str, str], *, routine: bool = False) -> Any:
        result = await real(k, routine=routine)
        passes.append(routine)
        return result

    c.controller.reconciler.reconcile = counted  # type: ignore[method-assign]
    gets = await proxy_gets(c)
    for n in range(1, 4):
        await c.controller._resync()
        await eventually(lambda n=n: len(passes) == n)  # type: ignore[misc]
    assert passes == [True, True, True] and await proxy_gets(c) == gets

    c.controller.reconciler.probe_refresh = 0.0  # any newer lastProbeTime is worth a write
    stored = (await c.status("px1"))["lastProbeTime"]
    gets = await proxy_gets(c)
    await eventually(lambda: (h := c.controller.prober.health(ProbeKey(key))) is not None
                     and h.last_probe is not None and rfc3339(h.last_probe.timestamp()) > stored)
    await c.controller._resync()
    await eventually(lambda: len(passes) == 4)
    assert await proxy_gets(c) == gets + 1
    assert (await c.status("px1"))["lastProbeTime"] > stored
