"""The Controller: queue, workers, periodic resync, orphan GC and health probers, run together.

The process (egress_kvm/operator, `egress-kvm run`) feeds it informer events (`on_event`), starts it
when it becomes leader (`run`), stops it on SIGTERM (`stop`) and fails /healthz when `healthy()` turns
False, so a worker or loop that dies takes the process down instead of leaving a zombie.

A reconcile is cut off after `reconcile_timeout` (retried on the transient backoff, like any error), so
no single host or call can hold a worker for longer. One still running `wedge_grace` after that (it
ignored its cancellation: a blocking call, a swallowed CancelledError) means the workers are wedged:
`healthy()` turns False and the kubelet restarts the process. A host that answers again after an outage
re-queues its Proxies at once, those waiting for it to make their instance included (`_host_back`); a GC
pass collects orphan domains (gc.py), then orphan volumes (volume_gc.py), then evicts unused URL base
images.

Shutdown: `stop` closes the queue (no key is handed out again), gives the reconciles in flight up to
`timeout` to finish, then cancels them. A cancelled reconcile is safe to abandon: status is written
before anything is created and every provider call is idempotent by name, so the next leader converges.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import cast

from egress_kvm import metrics
from egress_kvm.backoff import Backoff
from egress_kvm.kube.interfaces import FINALIZER, Key, KubeApi, Obj, ProxyStore, key_of
from egress_kvm.log import Logger, get_logger
from egress_kvm.policy.policies import EgressPolicies
from egress_kvm.providers.base import (
    AgentEvent,
    Closable,
    EventsResumed,
    EvictsImages,
    HostEvent,
    Provider,
    ReportsHostBack,
    WatchesInstances,
)

from .gc import Collected, collect_orphans
from .health import Prober
from .hostevents import agent_wakes, wakes_now
from .instanceindex import InstanceIndex
from .outcome import Result, Retry
from .queue import QUOTA_BACKOFF, TRANSIENT_BACKOFF, QueueShutDown, WorkQueue
from .reconciler import Reconciler, Timings
from .verdict import ProbeKey
from .volume_gc import VolumeClocks, collect_orphan_volumes

NAME = "proxy"
PHASES = ("Pending", "Provisioning", "Running", "Ready", "Failed", "Deleting")


class Controller:
    def __init__(self, *, kube: KubeApi, store: ProxyStore, providers: Mapping[str, Provider],
                 providers_hash: str = "", workers: int = 4, resync_period: float = 300.0,
                 gc_interval: float = 120.0, gc_grace_period: float = 600.0,
                 logger: Logger | None = None, namespace: str | None = None,
                 timings: Timings | None = None, transient_backoff: Backoff = TRANSIENT_BACKOFF,
                 quota_backoff: Backoff = QUOTA_BACKOFF, probe_time_scale: float = 1.0,
                 egress: EgressPolicies | None = None, reconcile_timeout: float = 300.0,
                 wedge_grace: float = 60.0, probe_refresh: float | None = None) -> None:
        """`namespace` (optional, beyond the contract): the watch scope, so GC never judges instances
        owned from other namespaces. The last four tune timings for tests. `probe_refresh`: how often
        a probed Proxy is re-queued only to refresh `lastProbeTime` (default: the resync period; each
        such pass writes status, so at once a minute 1,000 Proxies cost the API server ~17 writes/s;
        math.inf: never, the operator's default, `--probe-time-refresh`)."""
        if workers < 1:
            raise ValueError(f"workers: {workers} must be at least 1")
        self.kube = kube
        self.store = store
        # The informer knows its watch scope; use it when the caller did not say.
        self.namespace = namespace or getattr(store, "namespace", None) or None
        self.log = logger or get_logger("controller")
        self.workers = workers
        self.resync_period = resync_period
        self.gc_interval = gc_interval
        self.gc_grace_period = gc_grace_period
        # A delayed add (a requeue, a backoff retry) asks for a real look like any other add but the clock's.
        self.queue: WorkQueue[Key] = WorkQueue(name=NAME, transient=transient_backoff, quota=quota_backoff,
                                               on_due=self._not_routine)
        self.prober: Prober[ProbeKey] = Prober(
            kube=kube, on_change=self._enqueue_any, time_scale=probe_time_scale,
            refresh=resync_period if probe_refresh is None else probe_refresh,  # scaled by the prober
            on_refresh=self._enqueue_unless_backing_off, logger=self.log.with_name("health"),
            policies=egress)
        refresh = (resync_period if probe_refresh is None else probe_refresh) * probe_time_scale
        self.reconciler = Reconciler(kube=kube, prober=self.prober, providers=providers,
                                     providers_hash=providers_hash, timings=timings, logger=self.log,
                                     probe_refresh=refresh, cache=store)
        self._tasks: list[asyncio.Task[None]] = []
        self._died: BaseException | None = None
        self._stopping = False
        self._stopped: asyncio.Event | None = None
        self._last_gc: list[Collected] = []
        self._seen: dict[Key, tuple[object, ...]] = {}  # key -> what of metadata last triggered a reconcile
        # Which Proxies record which instance, kept from the events (instanceindex.py): a host's event
        # finds its Proxy without scanning them all.
        self._instances = InstanceIndex()
        # Keys queued only by the clock (a resync, a probe refresh) or their own probes turning healthy,
        # and by nothing since: their reconcile may trust healthy probes instead of reading the VM
        # (planner.vouched). Any other add clears it.
        self._routine: set[Key] = set()
        self.reconcile_timeout = reconcile_timeout
        self.wedge_grace = wedge_grace
        self._running_since: dict[Key, float] = {}  # key -> monotonic start of its reconcile in flight
        self._gone_mid_pass: set[Key] = set()  # DELETED while their reconcile ran: see _process
        self._gc_failing: set[tuple[str, str]] = set()  # (provider, zone) whose GC listing failed last
        self._volume_clocks: VolumeClocks = {}  # orphan volumes' grace clocks (volume_gc.py)
        self._listened: set[int] = set()  # id() of providers whose host-back events we hear
        self._watches: dict[int, tuple[Provider, Closable]] = {}  # id(provider) -> its lifecycle-event watch
        self._unwatching: set[asyncio.Task[None]] = set()
        self._listen_for_hosts(providers)

    # --- what the process calls ----------------------------------------------------------------------

    def enqueue(self, key: Key, *, urgent: bool = False) -> None:
        """`urgent`: work in flight making progress (a changed verdict, a finished import; queue.py's
        lanes), served before new work. Never for a retry: a failure's backoff comes due plain."""
        self._routine.discard(key)  # somebody asks: the reconcile looks at the VM (planner.vouched)
        self.queue.add(key, urgent=urgent)

    def on_event(self, kind: str, obj: Obj) -> None:
        key = key_of(obj)
        # First, so that nothing below (a metrics or queue bug the informer would swallow) can skip it.
        self._instances.put(key, None if kind == "DELETED" else obj)
        if kind == "DELETED":
            self._routine.discard(key)
            metrics.forget_proxy(*key)
            self.reconciler.forget(key)
            self.queue.drop(key)
            self._seen.pop(key, None)
            if key in self._running_since:
                self._gone_mid_pass.add(key)
            self._update_phase_gauge()  # now: no other reconcile may come to move it (the last Proxy)
            return
        # The per-Proxy gauge mirrors status as stored (our writes come back as MODIFIED), so it is right
        # from the first list after a restart too, also for a Failed Proxy that is not reconciled again.
        metrics.set_proxy_conditions(*key, (obj.get("status") or {}).get("conditions"))
        # Like controller-runtime's GenerationChangedPredicate (plus deletion and finalizers): a MODIFIED
        # that only changed status is almost always our own write, and reconciling it again would cost a
        # provider round trip for nothing. Anything else a status change could matter for is covered by
        # the prober's enqueues, requeues and the periodic resync.
        meta = obj.get("metadata") or {}
        fingerprint = (meta.get("uid"), meta.get("generation"), meta.get("deletionTimestamp"),
                       tuple(meta.get("finalizers") or ()))
        seen = self._seen.get(key)
        self._seen[key] = fingerprint
        if kind == "MODIFIED" and seen is not None and (seen == fingerprint
                                                         or _only_ours_added(seen, fingerprint)):
            return
        self.enqueue(key)

    def update_providers(self, providers: Mapping[str, Provider], providers_hash: str,
                         egress: EgressPolicies | None = None) -> None:
        self.log.info("providers changed; re-evaluating every Proxy", providers=sorted(providers))
        if egress is not None:  # the file's egress section, which External probes follow
            self.prober.policies = egress
        self.reconciler.set_providers(providers, providers_hash)
        self._listen_for_hosts(providers)
        if self._tasks and not self._stopping:
            self._watch_instances(providers)
        self._enqueue_all()

    def healthy(self) -> bool:
        return self._died is None and self.prober.healthy() and not self.wedged()

    def wedged(self) -> list[Key]:
        """Reconciles still running `wedge_grace` past their timeout: their workers are lost."""
        limit = time.monotonic() - self.reconcile_timeout - self.wedge_grace
        return [k for k, since in self._running_since.items() if since < limit]

    async def run(self) -> None:
        if self._tasks:
            raise RuntimeError("Controller.run: already running")
        if self._stopping:
            return  # stopped before it ever ran
        self._stopped = asyncio.Event()
        metrics.init_controller(NAME, workers=self.workers)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._worker(), name=f"reconcile worker {i}")
                       for i in range(self.workers)]
        self._tasks.append(loop.create_task(self._every(self.resync_period, self._resync), name="resync"))
        self._tasks.append(loop.create_task(self._every(self.gc_interval, self.collect_garbage), name="gc"))
        for t in self._tasks:
            t.add_done_callback(self._task_done)
        self.log.info("controller started", workers=self.workers, resyncPeriod=self.resync_period,
                      gcInterval=self.gc_interval)
        self._index_store()
        self._watch_instances(self.reconciler.providers)
        self._enqueue_all()
        try:
            await self._stopped.wait()
        finally:
            if not self._stopped.is_set():  # run() itself was cancelled (e.g. leadership lost)
                await self._shutdown(timeout=0)

    async def stop(self, *, timeout: float = 30.0) -> None:  # noqa: ASYNC109 - the contract's shape
        await self._shutdown(timeout=timeout)

    # --- loops ---------------------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            active = metrics.ACTIVE_WORKERS.labels(NAME)
            active.inc()
            try:
                await self._process(key)
            finally:
                active.dec()
                self.queue.done(key)

    async def _process(self, key: Key) -> None:
        start = self._running_since[key] = time.monotonic()
        log = self.log.with_values(proxy=f"{key[0]}/{key[1]}")
        routine = key in self._routine
        self._routine.discard(key)
        deadline = asyncio.timeout(self.reconcile_timeout)
        gone = False
        try:
            async with deadline:
                result: Result = await self.reconciler.reconcile(key, routine=routine)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug, a Kubernetes API error, the timeout: retry with backoff, never die
            metrics.RECONCILE_ERRORS.labels(NAME).inc()
            metrics.RECONCILE_TOTAL.labels(NAME, "error").inc()
            delay = self.queue.add_rate_limited(key)
            if isinstance(e, TimeoutError) and deadline.expired():
                log.error(e, "reconcile timed out; cut off", timeout=self.reconcile_timeout, retryIn=delay)
            else:
                log.error(e, "reconcile failed", retryIn=delay, errorType=type(e).__name__)
            return
        finally:
            self._running_since.pop(key, None)
            # A DELETED came while this pass ran: it went on from what it read and may have remembered the
            # key again (a phase for the gauge, a KeyState, a probe) or asked for a retry or a requeue
            # (the error path above), so all that goes once more. A Proxy re-created meanwhile is queued
            # by its ADDED and starts afresh.
            if key in self._gone_mid_pass:
                gone = True
                self._gone_mid_pass.discard(key)
                self.reconciler.forget(key)
                self.queue.drop(key)
            metrics.RECONCILE_TIME.labels(NAME).observe(time.monotonic() - start)
            self._update_phase_gauge()
        if gone:
            return
        if result.retry:
            metrics.RECONCILE_ERRORS.labels(NAME).inc()
            metrics.RECONCILE_TOTAL.labels(NAME, "error").inc()
            delay = self.queue.add_rate_limited(key, quota=result.retry is Retry.QUOTA)
            log.v(1).info("reconcile will be retried", retryIn=delay, backoff=result.retry.value)
            return
        self.queue.forget(key)
        if result.wake_on is not None:
            result.wake_on.add_done_callback(functools.partial(self._wake, key))
        if result.requeue_after is not None:
            metrics.RECONCILE_TOTAL.labels(NAME, "requeue_after").inc()
            self.queue.add_after(key, result.requeue_after)
        else:
            metrics.RECONCILE_TOTAL.labels(NAME, "success").inc()

    async def _every(self, period: float, fn: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(period)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # one failed pass must not end the loop
                self.log.error(e, "periodic task failed", task=getattr(fn, "__name__", str(fn)))

    async def _resync(self) -> None:
        keys = self.store.keys()
        self.log.v(1).info("resync: queueing every Proxy", proxies=len(keys))
        for key in keys:
            self._enqueue_routine(key)

    async def collect_garbage(self) -> list[Collected]:
        """One orphan GC pass (also run every gc_interval)."""
        self._last_gc = await collect_orphans(
            providers=self.reconciler.providers, store=self.store, kube=self.kube,
            grace_period=self.gc_grace_period, namespace=self.namespace, logger=self.log.with_name("gc"),
            failing=self._gc_failing)
        self._last_gc += await collect_orphan_volumes(
            providers=self.reconciler.providers, store=self.store, kube=self.kube,
            grace_period=self.gc_grace_period, clocks=self._volume_clocks, namespace=self.namespace,
            logger=self.log.with_name("gc"))
        for name, provider in self.reconciler.providers.items():
            if isinstance(provider, EvictsImages):
                try:
                    evicted = await provider.evict_unused_images(grace=self.gc_grace_period)
                except Exception as e:  # one provider's failure must not end the pass
                    self.log.error(e, "image eviction failed", provider=name)
                    continue
                if evicted:
                    self.log.info("unused images evicted", provider=name, volumes=evicted)
        return self._last_gc

    # --- internals -----------------------------------------------------------------------------------

    def _not_routine(self, key: Key) -> None:
        self._routine.discard(key)

    def _enqueue_any(self, key: ProbeKey) -> None:
        """A changed verdict: the Proxy turns Ready (or not) now. Its own endpoint turning healthy is
        routine (planner.vouched): the probes that just passed at status.ip vouch for the VM there, so
        the pass need not read it (a Get: four calls and an exec per Proxy on its way to Ready)."""
        health = self.prober.health(key)
        if not key.replacement and health is not None and health.healthy is True:
            self._enqueue_routine(key.proxy, urgent=True)
        else:
            self.enqueue(key.proxy, urgent=True)

    def _enqueue_routine(self, key: Key, *, urgent: bool = False) -> None:
        """Queue `key` for the clock's (or a healthy verdict's) sake: routine unless something else
        already wants it."""
        if not self.queue.wanted(key):
            self._routine.add(key)
        self.queue.add(key, urgent=urgent)

    def _enqueue_unless_backing_off(self, key: ProbeKey) -> None:
        """A probe refresh (no verdict change) for a key whose reconciles are failing waits for its
        backoff timer: reconciling it would only retry the provider (a dead host's lock) early."""
        if self.queue.failures(key.proxy) > 0:
            return
        self._enqueue_routine(key.proxy)

    def _wake(self, key: Key, _done: asyncio.Future[None]) -> None:
        self.enqueue(key, urgent=True)

    def _listen_for_hosts(self, providers: Mapping[str, Provider]) -> None:
        for provider in providers.values():
            if isinstance(provider, ReportsHostBack) and id(provider) not in self._listened:
                self._listened.add(id(provider))
                provider.on_host_back(self._host_back)

    def _host_back(self, provider: str, zone: str) -> None:
        """A host answers again: its Proxies are reconciled now (status, pending deletes), their backoff
        grown during the outage forgotten; so are those whose last pass found it down before their status
        recorded an instance there (KeyState.waits_on). The passes in flight run again once they end."""
        keys = sorted({*self._zone_keys(provider, zone, None),
                       *self.reconciler.memory.waiting_on(provider, zone)})
        self.log.info("host answers again; re-queueing its Proxies", provider=provider, zone=zone,
                      proxies=len(keys))
        for key in keys:
            self.queue.forget(key)
            self.enqueue(key)
        # A pass in flight may have found the host down and not yet recorded it (waits_on is set when the
        # pass ends, after its status write): run each again once it ends, backoff kept (it may be
        # another host's Proxy: at most one extra pass per worker), else such a Proxy waits it out.
        for key in self.queue.processing() - set(keys):
            self.enqueue(key)

    def _zone_keys(self, provider: str, zone: str, name: str | None) -> list[Key]:
        """hostevents.keys_for over the cache, from the index (instanceindex.py)."""
        return self._instances.keys(provider=provider, zone=zone, name=name)

    def _index_store(self) -> None:
        """Index what the store holds now. The informer's events index it as it fills (its first list
        included, also while a standby waits to lead); this covers a store filled before its events
        were handed to us (a test's fake store does not replay them)."""
        for key in self.store.keys():  # noqa: SIM118 - a ProxyStore, not a dict
            obj = self.store.get(key)
            if obj is not None:
                self._instances.put(key, obj)

    # --- lifecycle events (hostevents.py, providers/kvm/watch.py) -------------------------------------

    def _watch_instances(self, providers: Mapping[str, Provider]) -> None:
        """Follow the providers' instance events (one watch per provider object); stop following those
        no longer in use (a reload's replaced providers, closed later by the process)."""
        current = {id(p): p for p in providers.values()}
        for pid in [pid for pid in self._watches if pid not in current]:
            _, handle = self._watches.pop(pid)
            task = asyncio.get_running_loop().create_task(handle.close(), name="unwatch replaced provider")
            self._unwatching.add(task)
            task.add_done_callback(self._unwatching.discard)
        for pid, provider in current.items():
            if pid not in self._watches and isinstance(provider, WatchesInstances):
                self._watches[pid] = (provider, provider.watch_instances(self._instance_event))

    def _instance_event(self, event: HostEvent) -> None:
        """A host reported drift (or a gap in its reports): reconcile the Proxies concerned now. A guest
        agent that connected: look for the address of a Proxy waiting for one now, not on its timer."""
        if isinstance(event, AgentEvent):
            self._agent_event(event)
            return
        if isinstance(event, EventsResumed):
            keys = self._zone_keys(event.provider, event.zone, None)
            self.log.v(1).info("lifecycle events resumed; re-queueing the host's Proxies",
                               provider=event.provider, zone=event.zone, proxies=len(keys))
        else:
            keys = []
            for key in self._zone_keys(event.provider, event.zone, event.name):
                failures, restarts = self.queue.failures(key), self.reconciler.memory.peek(key).restarts
                woken = wakes_now(failures=failures, restarts=restarts)
                msg = "instance event; reconciling its Proxy" if woken else \
                    "instance event; its Proxy is backing off, reconciled on its schedule"
                self.log.v(1).info(msg, proxy=f"{key[0]}/{key[1]}", provider=event.provider, zone=event.zone,
                                   instance=event.name, change=event.change.value, detail=event.detail,
                                   failures=failures, restarts=restarts)
                if woken:
                    keys.append(key)
        for key in keys:
            self.enqueue(key)  # not queue.add: a pass a resync queued must look, not trust the probes

    def _agent_event(self, event: AgentEvent) -> None:
        """O(1) per event: the index's lookup by name, then per key (one, bar a replacement) its memory,
        queue and cached status."""
        for key in self._zone_keys(event.provider, event.zone, event.name):
            status = (self.store.get(key) or {}).get("status")
            ref = status.get("instance") if isinstance(status, dict) else None
            target = isinstance(ref, dict) and ref.get("name") == event.name
            ip_waits, failures = self.reconciler.memory.peek(key).ip_waits, self.queue.failures(key)
            woken = agent_wakes(state=event.state, target=target, ip_waits=ip_waits, failures=failures)
            self.log.v(1).info("guest agent connected; looking for its address now" if woken else
                               "guest agent event; its Proxy is not waiting for it",
                               proxy=f"{key[0]}/{key[1]}", provider=event.provider, zone=event.zone,
                               instance=event.name, state=event.state.value, ipWaits=ip_waits,
                               failures=failures)
            if woken:
                self._routine.discard(key)  # as enqueue: the reconcile looks at the VM
                self.queue.advance(key)  # its IP timer's look, now

    def _enqueue_all(self) -> None:
        for key in self.store.keys():  # noqa: SIM118 - a ProxyStore, not a dict
            self.enqueue(key)

    def _update_phase_gauge(self) -> None:
        counts = self.reconciler.phase_counts()
        for phase in PHASES:
            metrics.PROXIES.labels(phase).set(counts.get(phase, 0))

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if self._stopping:
            return
        if task.cancelled():
            self._died = asyncio.CancelledError(f"{task.get_name()} was cancelled")
        elif task.exception() is not None:
            self._died = task.exception()
        else:
            self._died = RuntimeError(f"{task.get_name()} ended")
        self.log.error(self._died, "controller task died", task=task.get_name())

    async def _shutdown(self, *, timeout: float) -> None:  # noqa: ASYNC109
        if self._stopping:
            if self._stopped is not None:
                await self._stopped.wait()
            return
        self._stopping = True
        self.queue.shutdown()
        watches, self._watches = list(self._watches.values()), {}
        await asyncio.gather(*(handle.close() for _, handle in watches), *self._unwatching,
                             return_exceptions=True)
        workers = [t for t in self._tasks if t.get_name().startswith("reconcile worker")]
        others = [t for t in self._tasks if t not in workers]
        for t in others:
            t.cancel()
        if workers:
            busy = len(self.queue.processing())
            self.log.info("controller stopping", inFlight=busy, timeout=timeout)
            pending = set(workers)
            if timeout > 0:
                _, pending = await asyncio.wait(workers, timeout=timeout)
            for t in pending:
                t.cancel()
            if pending:
                self.log.info("reconciles abandoned at shutdown", count=len(self.queue.processing()))
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.prober.close()
        self.log.info("controller stopped")
        if self._stopped is not None:
            self._stopped.set()


def _only_ours_added(old: tuple[object, ...], new: tuple[object, ...]) -> bool:
    """The change is our finalizer appearing, i.e. the echo of the reconciler's own first write. It is no
    reason to reconcile again: a reconcile that failed meanwhile would run again at once and count a
    second backoff step for one failure (a first quota failure waited 120 s instead of 60 s)."""
    if old[:3] != new[:3]:
        return False
    before = set(cast(tuple[str, ...], old[3]))
    after = set(cast(tuple[str, ...], new[3]))
    return after - before == {FINALIZER} and before <= after
