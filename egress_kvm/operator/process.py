"""The operator process: wiring, probes, leader election, providers-file polling, and shutdown.

Data flows one way: informer (list+watch) -> controller.on_event -> queue -> reconcile -> provider, with
status written back through KubeApiClient. This module owns only lifetimes:

- Start-up fails fast (non-zero exit, message naming the path or field) on a bad providers file, a
  missing SSH key or known_hosts, or no usable credentials: a crash loop in `kubectl get pods` is found
  at once, a controller that fails every Proxy an hour later is not.
- The informer runs from the start on every replica, so a standby has a warm cache and /readyz turns
  ok once it has listed. Only the leader runs the controller.
- /healthz fails when the informer, the controller or the providers poller died (never a zombie that
  answers probes but does nothing); /readyz fails until the first full list.
- SIGTERM (or SIGINT): the controller stops taking keys and gets --graceful-shutdown-timeout to finish
  what is in flight, then queued Events get a couple of seconds to be written, the watch stops, the lease
  is released (a successor takes over at once), the providers' SSH connections close, and the process
  exits 0. Losing the lease exits 1, as controller-runtime does (no grace: queued Events are dropped):
  the kubelet restarts us as a fresh candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import platform
import signal
import sys
from collections.abc import Mapping
from typing import Any

from .. import log
from ..backoff import Backoff
from ..config import ConfigError
from ..controller.naming import set_name_key
from ..kube.api import KubeApiClient, namespace_uid
from ..kube.client import KubeConfigError, new_api_client, own_pool, pod_namespace
from ..kube.informer import ProxyInformer
from ..kube.interfaces import Obj
from ..kube.leader import LeaderElector, lease_namespace
from ..kube.recorder import DRAIN_TIMEOUT as EVENT_DRAIN_TIMEOUT
from ..kube.rest import KubeApiError
from ..metrics import REGISTRY, version
from ..policy import namekey
from ..policy.policies import EgressPolicies
from ..providers.base import Provider
from .flags import Options
from .http import HttpServer, health_app, metrics_app
from .providers_file import LoadedProviders, build, close_all, file_digest, read_providers

OLD_PROVIDERS_CLOSE_DELAY = 60.0  # reconciles still using replaced providers get this long
CLUSTER_ID_PATIENCE = 30.0  # how long start-up waits for an API server that is not answering yet
CONTROLLER_EXIT_GRACE = 5.0  # after controller.stop's own timeout, for its task to end
INFORMER_EXIT_GRACE = 5.0  # for the watch to stop


def shutdown_budget(graceful_shutdown_timeout: float) -> float:
    """The longest a SIGTERM keeps the process up through its bounded steps (lease release and SSH closes
    come on top): the Deployment's terminationGracePeriodSeconds must exceed it, or the kubelet's SIGKILL
    cuts the shutdown short (test_operator_deploy checks the manifest against it)."""
    return graceful_shutdown_timeout + CONTROLLER_EXIT_GRACE + EVENT_DRAIN_TIMEOUT + INFORMER_EXIT_GRACE


class Operator:
    def __init__(self, options: Options, *, logger: log.Logger | None = None) -> None:
        self.options = options
        self.log = logger or log.get_logger("setup")
        self.informer: ProxyInformer | None = None
        self.controller: Any = None
        self.elector: LeaderElector | None = None
        self.kube: KubeApiClient | None = None
        self.providers: Mapping[str, Provider] = {}
        self.loaded: LoadedProviders | None = None
        self._stop = asyncio.Event()
        self._stopping = False
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self.health_server: HttpServer | None = None
        self.metrics_server: HttpServer | None = None

    def request_stop(self) -> None:
        self._stop.set()

    # --- probes --------------------------------------------------------------------------------------

    def _task_failure(self, name: str) -> str | None:
        task = self._tasks.get(name)
        if task is None or not task.done() or self._stopping:
            return None
        if task.cancelled():
            return f"{name} was cancelled"
        exc = task.exception()
        return f"{name} exited: {exc}" if exc else f"{name} exited"

    def _informer_check(self) -> str | None:
        if self.informer is not None and not self.informer.healthy():
            return "the Proxy watch died"
        return self._task_failure("informer")

    def _controller_check(self) -> str | None:
        if self.controller is not None and not self.controller.healthy():
            return "a controller loop died"
        return self._task_failure("controller")

    def _providers_check(self) -> str | None:
        return self._task_failure("providers-poller")

    def _synced_check(self) -> str | None:
        if self.informer is None or not self.informer.has_synced():
            return "Proxies not listed yet"
        return None

    # --- run -----------------------------------------------------------------------------------------

    async def run(self) -> int:
        opts = self.options
        self.log.info("egress-kvm starting", version=version(), python=platform.python_version())
        try:
            self.loaded = read_providers(opts.providers_config)
        except ConfigError as exc:
            return self._fatal(exc, "invalid providers config", path=opts.providers_config)
        self.log.info("providers config loaded", path=opts.providers_config,
                      providers=[p.name for p in self.loaded.config.providers])
        try:
            api_client, source = await new_api_client(kubeconfig=opts.kubeconfig or None)
        except KubeConfigError as exc:
            return self._fatal(exc, "no Kubernetes API access")
        self.log.info("using Kubernetes credentials", source=source.kind, path=source.path,
                      host=api_client.configuration.host)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(api_client.close)
            try:
                cluster_id = opts.cluster_id or await self._cluster_id(api_client)
            except (KubeApiError, OSError, TimeoutError) as exc:
                return self._fatal(exc, "cannot determine the cluster id (the kube-system Namespace uid); "
                                        "pass --cluster-id")
            try:
                key = namekey.load(opts.instance_name_key_file, cluster_id=cluster_id)
            except OSError as exc:
                return self._fatal(exc, "cannot read the instance-name key", path=opts.instance_name_key_file)
            set_name_key(key.key)
            if not key.from_file:
                self.log.info("no instance-name key file: instance names are keyed with the cluster id only "
                              "(see docs/security.md)", path=opts.instance_name_key_file)
            try:
                self.providers = await build(self.loaded, cluster_id=cluster_id)
            except ConfigError as exc:
                return self._fatal(exc, "invalid providers config", path=opts.providers_config)
            stack.push_async_callback(self._close_providers)
            self.log.info("operator starting", version=version(), clusterID=cluster_id,
                          namespace=opts.namespace or "(all)", leaderElect=opts.leader_elect,
                          workers=opts.max_concurrent_reconciles)
            return await self._serve(api_client, stack, cluster_id=cluster_id)
        return 1  # unreachable; keeps type checkers content

    async def _cluster_id(self, api_client: Any) -> str:
        """The kube-system Namespace's uid. An API server still starting (connection refused, 5xx) is
        retried for a while; a refusal (403: RBAC, 404) is final at once, as retrying cannot fix it."""
        backoff = Backoff(0.5, 5.0, jitter=0.5)
        deadline = asyncio.get_running_loop().time() + CLUSTER_ID_PATIENCE
        while True:
            try:
                return await namespace_uid(api_client)
            except (KubeApiError, OSError, TimeoutError) as exc:
                final = isinstance(exc, KubeApiError) and 400 <= exc.status < 500 and exc.status != 429
                if final or asyncio.get_running_loop().time() >= deadline:
                    raise
                self.log.error(exc, "reading the cluster id failed, retrying")
            await asyncio.sleep(backoff.next())

    async def _serve(self, api_client: Any, stack: contextlib.AsyncExitStack, *, cluster_id: str) -> int:
        opts = self.options
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
            stack.callback(loop.remove_signal_handler, sig)

        kube = self.kube = KubeApiClient(api_client)
        # Its Event senders stop before the ApiClient closes (the stack unwinds in reverse); _shutdown
        # normally drains them first, this covers a return before it.
        stack.push_async_callback(kube.close)
        self.informer = ProxyInformer(api_client, namespace=opts.namespace or None, on_event=self._on_event)
        from ..controller.manager import Controller  # the controller's own imports stay off start-up errors

        assert self.loaded is not None
        self.controller = Controller(
            kube=kube, store=self.informer, providers=self.providers, providers_hash=self.loaded.digest,
            workers=opts.max_concurrent_reconciles, resync_period=opts.resync_period,
            probe_refresh=opts.probe_time_refresh or math.inf,  # 0: a lone lastProbeTime is never written
            gc_interval=opts.gc_interval, gc_grace_period=opts.gc_grace_period,
            logger=log.get_logger("controller"), namespace=opts.namespace or None,
            egress=EgressPolicies.from_config(self.loaded.config.egress))

        try:
            await self._start_http(stack)
        except OSError as exc:
            return self._fatal(exc, "cannot listen")

        self._tasks["informer"] = asyncio.create_task(self.informer.run(), name="informer")
        self._tasks["providers-poller"] = asyncio.create_task(self._poll_providers(cluster_id=cluster_id),
                                                              name="providers-poller")
        exit_code = 0
        stop_wait = asyncio.create_task(self._stop.wait(), name="stop-signal")
        try:
            if opts.leader_elect:
                lease_client = own_pool(api_client)
                stack.push_async_callback(lease_client.close)
                self.elector = LeaderElector(
                    lease_client, name=opts.leader_election_id,
                    namespace=lease_namespace(opts.leader_election_namespace, pod_namespace=pod_namespace()))
                acquire = asyncio.create_task(self.elector.acquire(), name="leader-acquire")
                await asyncio.wait({stop_wait, acquire}, return_when=asyncio.FIRST_COMPLETED)
                if not acquire.done():
                    acquire.cancel()
                    await asyncio.gather(acquire, return_exceptions=True)
                    return 0  # stopped while a standby: the finally block cleans up
                if acquire.exception() is not None:  # a bug, not a lost race: never lead after it
                    self.log.error(acquire.exception(), "leader election failed, exiting")
                    exit_code = 1
                    return exit_code
                self._tasks["leader"] = asyncio.create_task(self.elector.hold(), name="leader-renew")
            self._tasks["controller"] = asyncio.create_task(self.controller.run(), name="controller")
            self.log.info("starting controller", leader=self.elector.identity if self.elector else "")
            for key in list(self.informer.keys()):  # a standby's cache was filled before it could reconcile
                self.controller.enqueue(key)
            waiting: set[asyncio.Task[Any]] = {stop_wait}
            if "leader" in self._tasks:
                waiting.add(self._tasks["leader"])
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            leader = self._tasks.get("leader")
            if leader is not None and leader.done() and not leader.cancelled():
                exc = leader.exception()
                self.log.error(exc if exc else "renewal ended", "leader election lost, exiting")
                exit_code = 1
            else:
                self.log.info("stop signal received, shutting down")
        finally:
            stop_wait.cancel()
            await self._shutdown(lost=exit_code != 0)
        return exit_code

    async def _start_http(self, stack: contextlib.AsyncExitStack) -> None:
        opts = self.options
        if opts.health_probe_bind_address is not None:
            self.health_server = HttpServer(
                health_app(healthz={"informer": self._informer_check, "controller": self._controller_check,
                                    "providers": self._providers_check},
                           readyz={"informer-synced": self._synced_check}),
                opts.health_probe_bind_address)
            await self.health_server.start()
            stack.push_async_callback(self.health_server.close)
            self.log.info("serving health probes", address=str(opts.health_probe_bind_address))
        if opts.metrics_bind_address is not None:
            self.metrics_server = HttpServer(metrics_app(REGISTRY), opts.metrics_bind_address)
            await self.metrics_server.start()
            stack.push_async_callback(self.metrics_server.close)
            self.log.info("serving metrics", address=str(opts.metrics_bind_address))

    async def _shutdown(self, *, lost: bool) -> None:
        """Stop in dependency order. The lease is renewed until the controller has stopped, so no
        successor reconciles while our in-flight work finishes; after a lost lease there is no grace
        (someone else may already lead) and nothing to release."""
        self._stopping = True
        controller_task = self._tasks.get("controller")
        if controller_task is not None and self.controller is not None:
            try:
                await self.controller.stop(timeout=0 if lost else self.options.graceful_shutdown_timeout)
            except Exception as exc:
                self.log.error(exc, "controller stop failed")
            await _finish(controller_task, grace=CONTROLLER_EXIT_GRACE)
        if self.kube is not None:
            # Nothing records Events any more: the queued ones get a short bound, then the senders stop.
            # After a lost lease none: a successor may already be writing Events about the same Proxies,
            # and ours, landing after theirs, would tell their story out of order.
            await self.kube.close(timeout=0 if lost else EVENT_DRAIN_TIMEOUT)
        leader = self._tasks.get("leader")
        if leader is not None:
            await _finish(leader, grace=0)
        poller = self._tasks.get("providers-poller")
        if poller is not None:
            await _finish(poller, grace=0)
        if self.informer is not None:
            self.informer.stop()
        informer_task = self._tasks.get("informer")
        if informer_task is not None:
            await _finish(informer_task, grace=INFORMER_EXIT_GRACE)
        if self.elector is not None and not lost:
            await self.elector.release()
        self.log.info("operator stopped")

    def _on_event(self, kind: str, obj: Obj) -> None:
        if self.controller is not None:
            self.controller.on_event(kind, obj)

    # --- providers file ------------------------------------------------------------------------------

    async def _poll_providers(self, *, cluster_id: str) -> None:
        """Re-read the providers file when its bytes change; a bad new file keeps the old providers."""
        path = self.options.providers_config
        assert self.loaded is not None
        current = self.loaded.digest
        last_error = ""
        while True:
            await asyncio.sleep(max(0.5, self.options.providers_poll_interval))
            try:
                digest = file_digest(path)
                if digest == current:
                    last_error = ""
                    continue
                loaded = read_providers(path)
                providers = await build(loaded, cluster_id=cluster_id)
            except Exception as exc:  # ConfigError, or a provider refusing its config: keep the old ones
                # Retried every poll (a key file may appear after the file that names it, e.g. a Secret
                # created after the ConfigMap edit), but logged once per distinct problem.
                if str(exc) != last_error:
                    self.log.error(exc, "providers config changed but is invalid; keeping the current "
                                        "providers", path=path)
                    last_error = str(exc)
                continue
            last_error = ""
            old, self.providers, self.loaded, current = self.providers, providers, loaded, loaded.digest
            self.controller.update_providers(providers, loaded.digest,
                                             egress=EgressPolicies.from_config(loaded.config.egress))
            self.log.info("providers config reloaded", path=path,
                          providers=[p.name for p in loaded.config.providers])
            task = asyncio.create_task(self._retire(old), name="retire-providers")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, providers: Mapping[str, Provider]) -> None:
        """Close replaced providers once reconciles that picked them up had time to finish."""
        try:
            await asyncio.sleep(OLD_PROVIDERS_CLOSE_DELAY)
        finally:
            await close_all(providers)

    async def _close_providers(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        await close_all(self.providers)

    def _fatal(self, exc: BaseException, msg: str, **fields: Any) -> int:
        self.log.error(exc, msg, **fields)
        print(f"egress-kvm: {msg}: {exc}", file=sys.stderr)
        return 1


async def _finish(task: asyncio.Task[Any], *, grace: float) -> None:
    """Let a task end by itself for `grace` seconds, then cancel it; never raise its error here."""
    if not task.done() and grace > 0:
        await asyncio.wait({task}, timeout=grace)
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def run(options: Options) -> int:
    log.configure(options=options.zap_options())
    return await Operator(options).run()
