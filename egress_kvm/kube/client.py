"""Building the kubernetes-asyncio ApiClient: where the operator's credentials come from.

The order follows controller-runtime's `ctrl.GetConfig()`: an explicit `--kubeconfig`, then the
KUBECONFIG environment variable (a colon-separated list, merged), then the pod's service account, then
~/.kube/config. A pod never has a kubeconfig, and a developer's shell never has the service-account
files, so in practice exactly one source applies; the explicit ones win so a test or a developer can
point a process at any server regardless of where it runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    SERVICE_HOST_ENV_NAME,
    SERVICE_TOKEN_FILENAME,
    load_incluster_config,
)
from kubernetes_asyncio.config.kube_config import load_kube_config

SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULT_KUBECONFIG = "~/.kube/config"


class KubeConfigError(RuntimeError):
    """No usable credentials: the message says which source was tried and why it failed."""


@dataclass(frozen=True)
class ClientSource:
    """Where the credentials came from, for the start-up log line."""

    kind: str  # "kubeconfig" | "in-cluster"
    path: str = ""


async def new_api_client(*, kubeconfig: str | None = None,
                         environ: dict[str, str] | None = None) -> tuple[ApiClient, ClientSource]:
    """An ApiClient for the first credentials source that applies (see the module docstring)."""
    env = dict(os.environ if environ is None else environ)
    configuration = Configuration()
    if kubeconfig:
        await _load_kubeconfig(kubeconfig, configuration, what="--kubeconfig")
        return ApiClient(configuration), ClientSource("kubeconfig", kubeconfig)
    if env.get("KUBECONFIG"):
        await _load_kubeconfig(env["KUBECONFIG"], configuration, what="KUBECONFIG")
        return ApiClient(configuration), ClientSource("kubeconfig", env["KUBECONFIG"])
    if env.get(SERVICE_HOST_ENV_NAME):
        try:
            load_incluster_config(client_configuration=configuration,
                                  token_filename=SERVICE_TOKEN_FILENAME,
                                  cert_filename=SERVICE_CERT_FILENAME)
        except ConfigException as exc:
            raise KubeConfigError(f"in-cluster service account: {exc}") from None
        return ApiClient(configuration), ClientSource("in-cluster")
    default = _existing(DEFAULT_KUBECONFIG)
    if default:
        await _load_kubeconfig(default, configuration, what="default kubeconfig")
        return ApiClient(configuration), ClientSource("kubeconfig", default)
    raise KubeConfigError("no Kubernetes credentials: pass --kubeconfig, set KUBECONFIG, or run in a pod "
                          f"with a service account ({DEFAULT_KUBECONFIG} does not exist either)")


async def _load_kubeconfig(paths: str, configuration: Configuration, *, what: str) -> None:
    for path in paths.split(os.pathsep):
        if path and not _existing(path):
            raise KubeConfigError(f"{what}: {path!r} does not exist")
    try:
        await load_kube_config(config_file=paths, client_configuration=configuration,
                               persist_config=False)
    except (ConfigException, OSError, ValueError) as exc:
        raise KubeConfigError(f"{what}: {paths!r}: {exc}") from None


def _existing(path: str) -> str | None:
    """The expanded path if it exists (a sync helper: a stat is not worth a thread here)."""
    full = Path(path).expanduser()
    return str(full) if full.exists() else None


def pod_namespace(path: str = SERVICE_ACCOUNT_NAMESPACE_FILE) -> str | None:
    """The namespace this pod runs in, from its service account; None outside a pod."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return value or None
