"""Shared set-up for kube-layer tests against the API emulator: a running emulator with the Proxy CRD
installed (through HTTP, as kubectl would), and helpers that write objects as another client would."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import ApiClient, Configuration

from egress_kvm.kube.interfaces import GROUP, KIND, PLURAL, VERSION
from egress_kvm.kube.rest import request_json
from testbed.emulator import Emulator

ROOT = Path(__file__).resolve().parents[3]
CRD_PATH = ROOT / "deploy/crd/egressproxies.io_proxies.yaml"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@functools.cache
def _parsed_crd() -> dict[str, Any]:
    """Parsed once: yaml.safe_load of the CRD takes ~50 ms of CPU, and emulators need it per test."""
    parsed: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return parsed


def proxy_crd() -> dict[str, Any]:
    """The Proxy CRD as deploy/ has it, a fresh copy each call (the emulator or a test may change it)."""
    return copy.deepcopy(_parsed_crd())


@contextlib.asynccontextmanager
async def emulator_with_crd(**kw: Any) -> AsyncIterator[tuple[Emulator, ApiClient]]:
    async with Emulator.running(port=0, **kw) as emu, ApiClient(Configuration(host=emu.url)) as client:
        await request_json(client, "POST", CRDS, body=proxy_crd())
        yield emu, client


def proxies_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    return f"{base}/{name}" if name else base


async def create_proxy(client: ApiClient, name: str, namespace: str = "default",
                       **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"mode": "Managed", "provider": "kvm-home", **spec}}
    return await request_json(client, "POST", proxies_path(namespace), body=body)


async def patch_proxy(client: ApiClient, name: str, patch: dict[str, Any],
                      namespace: str = "default") -> dict[str, Any]:
    return await request_json(client, "PATCH", proxies_path(namespace, name), body=patch,
                              content_type="application/merge-patch+json")


async def delete_proxy(client: ApiClient, name: str, namespace: str = "default") -> dict[str, Any]:
    return await request_json(client, "DELETE", proxies_path(namespace, name))


async def create_namespace(client: ApiClient, name: str) -> None:
    await request_json(client, "POST", "/api/v1/namespaces",
                       body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


async def create_secret(client: ApiClient, name: str, data: dict[str, bytes],
                        namespace: str = "default", labels: dict[str, str] | None = None) -> None:
    meta = {"name": name, "namespace": namespace, **({"labels": labels} if labels else {})}
    await request_json(client, "POST", f"/api/v1/namespaces/{namespace}/secrets", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": meta,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()}})


async def until(pred: Callable[[], bool], within: float = 10) -> None:
    """Poll a condition on state the test cannot subscribe to."""
    async with asyncio.timeout(within):
        while True:
            if pred():
                return
            await asyncio.sleep(0.01)
