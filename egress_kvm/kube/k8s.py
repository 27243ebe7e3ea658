"""The kubernetes-asyncio names the kube layer uses, imported after `lazyclient.install` (lazyclient.py says
why). Every module of this package takes them from here, so the packages are lazy wherever the operator
runs; importing `egress_kvm.kube` alone (the controller's pure modules do, for its interfaces) loads none."""

from egress_kvm.kube import lazyclient

lazyclient.install()

# ruff: noqa: E402 (the install must come first)
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.config.incluster_config import SERVICE_HOST_ENV_NAME, InClusterConfigLoader
from kubernetes_asyncio.config.kube_config import load_kube_config

__all__ = ["SERVICE_HOST_ENV_NAME", "ApiClient", "ApiException", "ConfigException", "Configuration",
           "CoreV1Api", "CustomObjectsApi", "InClusterConfigLoader", "load_kube_config"]
