"""Fixtures: an in-process Api (no HTTP) and a served Emulator with the project's Proxy CRD applied."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kube.kube_emulator_fixtures import proxy_crd

from testbed.emulator import Api, Emulator
from testbed.emulator.resources import ResourceType

GROUP, VERSION, PLURAL = "egressproxies.io", "v1alpha1", "proxies"


def proxy(name: str = "p1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Proxy",
        "metadata": {"name": name},
        "spec": {"provider": "lab", **spec},
    }


def widget_crd(*, scope: str = "Namespaced", status: bool = False) -> dict[str, Any]:
    """A second CRD, owned by these tests: no status subresource (or with one), any scope."""
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "properties": {
                            "size": {"type": "integer", "default": 1},
                            "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    },
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            }
        },
    }
    if status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": scope,
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [version],
        },
    }


def crd_type(api: Api) -> ResourceType:
    return api.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")


@pytest.fixture
def api() -> Api:
    a = Api()
    a.create(crd_type(a), "", proxy_crd())
    return a


@pytest.fixture
def proxies(api: Api) -> ResourceType:
    return api.resource(GROUP, VERSION, PLURAL)


@pytest.fixture
async def emu() -> AsyncIterator[Emulator]:
    async with Emulator.running(host="127.0.0.1", port=0, bookmark_interval=0.2) as e:
        e.api.create(crd_type(e.api), "", proxy_crd())
        yield e
