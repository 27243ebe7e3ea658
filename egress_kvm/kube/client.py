"""Building the kubernetes-asyncio ApiClient: where the operator's credentials come from.

The order follows controller-runtime's `ctrl.GetConfig()`: an explicit `--kubeconfig`, then the
KUBECONFIG environment variable (a colon-separated list, merged), then the pod's service account, then
~/.kube/config. A pod never has a kubeconfig, and a developer's shell never has the service-account
files, so in practice exactly one source applies; the explicit ones win so a test or a developer can
point a process at any server regardless of where it runs.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from egress_kvm.kube.envproxy import env_proxy

from .k8s import (
    SERVICE_HOST_ENV_NAME,
    ApiClient,
    ConfigException,
    Configuration,
    InClusterConfigLoader,
    load_kube_config,
)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_ACCOUNT_NAMESPACE_FILE = f"{SERVICE_ACCOUNT_DIR}/namespace"
DEFAULT_KUBECONFIG = "~/.kube/config"


class KubeConfigError(RuntimeError):
    """No usable credentials: the message says which source was tried and why it failed."""


@dataclass(frozen=True)
class ClientSource:
    """Where the credentials came from, for the start-up log line."""

    kind: str  # "kubeconfig" | "in-cluster"
    path: str = ""


async def new_api_client(*, kubeconfig: str | None = None, environ: dict[str, str] | None = None,
                         service_account_dir: str = SERVICE_ACCOUNT_DIR,
                         ) -> tuple[ApiClient, ClientSource]:
    """An ApiClient for the first credentials source that applies (see the module docstring)."""
    env = dict(os.environ if environ is None else environ)
    configuration = Configuration()
    if kubeconfig:
        await _load_kubeconfig(kubeconfig, configuration, what="--kubeconfig")
        return _client(configuration, ClientSource("kubeconfig", kubeconfig), env)
    if env.get("KUBECONFIG"):
        await _load_kubeconfig(env["KUBECONFIG"], configuration, what="KUBECONFIG")
        return _client(configuration, ClientSource("kubeconfig", env["KUBECONFIG"]), env)
    if env.get(SERVICE_HOST_ENV_NAME):
        try:
            InClusterConfigLoader(token_filename=f"{service_account_dir}/token",
                                  cert_filename=f"{service_account_dir}/ca.crt",
                                  environ=env).load_and_set(configuration)
        except ConfigException as exc:
            raise KubeConfigError(f"in-cluster service account: {exc}") from None
        return _client(configuration, ClientSource("in-cluster", service_account_dir), env)
    default = _existing(DEFAULT_KUBECONFIG)
    if default:
        await _load_kubeconfig(default, configuration, what="default kubeconfig")
        return _client(configuration, ClientSource("kubeconfig", default), env)
    raise KubeConfigError("no Kubernetes credentials: pass --kubeconfig, set KUBECONFIG, or run in a pod "
                          f"with a service account ({DEFAULT_KUBECONFIG} does not exist either)")


def _client(configuration: Configuration, source: ClientSource,
            env: Mapping[str, str]) -> tuple[ApiClient, ClientSource]:
    # The TLS context (CA bundle, client certificate) is built here: a bad file must name itself.
    try:
        client = ApiClient(configuration)
    except (ssl.SSLError, OSError) as exc:
        raise KubeConfigError(f"{source.kind} {source.path}: TLS material unusable "
                              f"(ca {configuration.ssl_ca_cert!r}, cert {configuration.cert_file!r}): "
                              f"{exc}") from None
    # kubernetes-asyncio's session trusts the environment, so aiohttp reads ~/.netrc and scans the
    # proxy variables in a thread on every request: at 1,000 Proxies that was a fifth of the operator's
    # samples. The proxy is the same for every request to one server: resolved once here instead
    # (by client-go's rules, envproxy.py; client-go reads no netrc). A kubeconfig's proxy-url wins, as
    # in client-go.
    rest = client.rest_client
    if not rest.proxy:
        rest.proxy = env_proxy(configuration.host, env)
    rest.pool_manager._trust_env = False  # aiohttp has no setter; the attribute is stable across 3.x
    return client, source


def own_pool(client: ApiClient) -> ApiClient:
    """A client for the same server, credentials and proxy with a connection pool of its own.

    kubernetes-asyncio's pool holds `connection_pool_maxsize` (100) connections and queues requests past
    that; hundreds of reconcile workers fill it while a fleet comes up. The Lease renewals get their own
    pool, so they never wait behind the workers' requests for longer than the renew deadline."""
    other = ApiClient(client.configuration)
    other.rest_client.proxy = client.rest_client.proxy
    other.rest_client.pool_manager._trust_env = False  # as _client: the proxy is resolved already
    return other


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
