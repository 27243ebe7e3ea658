"""The reconciler: one Proxy key in, the world observed fresh, at most one step of change, status out.

Level-triggered and idempotent, as controller-runtime's: it is told only a key, reads the Proxy from the
API server and the instance from the provider every time (so the IP is re-read on every reconcile), and a
reconcile cut short anywhere (crash, SIGTERM) leaves state the next one converges from. Two rules make
that hold:

- `status.instance` is written *before* the provider's create, so deletion and GC always know the name
  of anything that may exist (the name is deterministic, and create is idempotent by name).
- A replaced instance is kept in `status.previousInstance` and only this reconciler deletes it, once the
  replacement is Ready (create-before-delete). If the provider reports no capacity for the replacement
  (QuotaError) on the host the old instance runs on, the old instance is deleted first and the create
  retried (delete-before-create), since a replacement that can never start is worse than a short gap; on
  another host deleting it would free nothing, so it keeps serving and the create is retried on the
  quota backoff. While the old instance still runs with an IP it keeps serving: status shows its
  `ip`/`endpoint` and its probe verdict (so a Ready Proxy stays Ready), and the replacement is probed
  under a key of its own until it is Ready and takes over.
- A verdict recorded in status by an earlier operator process (a restart, a new leader) seeds the probes
  when the endpoint is unchanged, so a healthy Proxy is not flapped to Running by the handover; the
  probes run at once regardless, and only `failureThreshold` real failures demote it.

The phase table for the instance itself is `plan.plan_instance`; this module gathers its inputs (spec,
Secrets, provider, probe verdict) and carries out what it says. Error kinds map to outcomes:
SpecError/PermanentError -> Failed (not retried until metadata.generation or the providers file changes;
while deleting: a DeleteBlocked Warning and slow retries, since dropping the finalizer would leak the VM),
Waiting -> Pending (retried), InProgress (a background image import) -> Provisioning with its progress,
re-queued when it ends and no backoff counted, NotOwned (the host's metadata names another owner) ->
Failed with a NotOwner Event, QuotaError -> slow backoff, TransientError -> normal backoff; a host that
cannot be reached (HostUnreachable, a TransientError) sets the HostReachable condition and never leads to
a recreate; other transient errors (the host answered with an error) say "retrying" and leave it be.

A verdict names the inputs it was computed from: generation, uid and providers file are frozen when the
reconcile starts, a status write that finds a newer generation is refused (SpecChanged: start over), and
Failed records the providers file (`failedProviders`) so a restart does not retry it. Guests that never
settle cost less and less: a VM that keeps stopping is started on a doubling delay (Restarted on the 1st,
2nd, 4th... start), one that never gets an IP is polled less often after a while, and the same retryable
trouble twice records one Event.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from egress_kvm.kube.interfaces import FINALIZER, Key, KubeApi, Obj, SpecChanged
from egress_kvm.log import Logger, get_logger
from egress_kvm.providers.base import (
    CreateRequest,
    HostUnreachable,
    InProgress,
    Instance,
    NotOwned,
    PermanentError,
    PowerState,
    Provider,
    QuotaError,
    TransientError,
)

from .desired import Desired, Waiting, desired_instance, provider_for
from .health import Health, Prober, ProbeTarget
from .plan import NORMAL, WARNING, Action, Event, Plan, plan_instance, transition_events
from .proxyspec import EXTERNAL, ProxySpec, SpecError, parse_spec
from .status import (
    COND_HEALTHY,
    COND_HOST,
    COND_READY,
    DELETING,
    FAILED,
    PENDING,
    PROVISIONING,
    READY,
    RUNNING,
    Ref,
    get_condition,
    remove_condition,
    rfc3339,
    set_condition,
)


@dataclass(frozen=True)
class Timings:
    poll: float = 5.0  # look again at an instance that is starting or has no IP yet
    pending_retry: float = 30.0  # look again for something outside (a missing Secret)
    progress_interval: float = 2.0  # at most one status write per this many seconds for create progress
    import_poll: float = 10.0  # while a background import runs: refresh its progress in status
    restart_backoff_max: float = 300.0  # a VM that keeps stopping is started again at most this often
    # A VM running without an IP is looked at every `poll` this many times, then on a growing delay up
    # to ip_wait_max: a guest whose network never comes up must not cost a provider call every poll.
    ip_wait_polls: int = 60
    ip_wait_max: float = 60.0


@dataclass(frozen=True)
class Result:
    requeue_after: float | None = None
    retry: str | None = None  # "transient" or "quota": re-queue with that backoff
    wake_on: asyncio.Future[None] | None = None  # re-queue when this completes (a background import)


TRANSIENT = "transient"
QUOTA = "quota"


@dataclass
class _Ctx:
    """One reconcile's working state: the newest Proxy object and the Events to record with the next write.

    `observed_generation` and `uid` are frozen when the reconcile starts: `proxy` is replaced by whatever
    a write returns, which after a conflict may carry a newer spec this reconcile never evaluated. A
    verdict must name the inputs it was computed from, or a fix made meanwhile would be taken as seen."""

    key: Key
    proxy: Obj
    log: Logger
    # The providers file as it was when the reconcile started: a reload meanwhile is judged by a new one.
    providers: Mapping[str, Provider] = field(default_factory=dict)
    providers_hash: str = ""
    events: list[Event] = field(default_factory=list)
    # The replaced instance while it still serves (running, with an IP): status shows it, not the new one.
    serving: ProbeTarget | None = None
    observed_generation: int = field(init=False)
    uid: str = field(init=False)

    def __post_init__(self) -> None:
        self.observed_generation = int(self.proxy["metadata"].get("generation") or 0)
        self.uid = str(self.proxy["metadata"].get("uid") or "")

    @property
    def status(self) -> Obj:
        return self.proxy.get("status") or {}

    @property
    def generation(self) -> int:
        return self.observed_generation

    @property
    def namespace(self) -> str:
        return self.proxy["metadata"].get("namespace", "")


class Reconciler:
    def __init__(self, *, kube: KubeApi, prober: Prober, providers: Mapping[str, Provider],
                 providers_hash: str = "", timings: Timings | None = None,
                 logger: Logger | None = None) -> None:
        self.kube = kube
        self.prober = prober
        self.providers: Mapping[str, Provider] = dict(providers)
        self.providers_hash = providers_hash
        self.timings = timings or Timings()
        self.log = logger or get_logger("controller")
        # key -> (generation, providers hash) of a Failed verdict: not retried while both are unchanged.
        self.failed: dict[Key, tuple[int, str]] = {}
        self.phases: dict[Key, str] = {}  # last phase written, for the per-phase gauge
        # key -> starts since the instance was last Ready: a guest that keeps stopping (a crash at boot)
        # is started again on a growing delay, with an Event on the 1st, 2nd, 4th, 8th... start only.
        self.restarts: dict[Key, int] = {}
        # key -> (reason, message) of the retryable trouble the last reconcile ended in: the same trouble
        # again records no second Event, and a quota retry does not first rewrite "creating ...".
        self.troubles: dict[Key, tuple[str, str]] = {}
        self.ip_waits: dict[Key, int] = {}  # key -> looks in a row at its instance running without an IP
        self.importing: set[Key] = set()  # keys whose last reconcile waited on a background import

    def set_providers(self, providers: Mapping[str, Provider], providers_hash: str) -> None:
        self.providers = dict(providers)
        self.providers_hash = providers_hash
        self.failed.clear()  # a config fix may cure any Failed Proxy

    def forget(self, key: Key) -> None:
        self._unwatch_all(key)
        self.failed.pop(key, None)
        self.phases.pop(key, None)
        self.restarts.pop(key, None)
        self.troubles.pop(key, None)
        self.ip_waits.pop(key, None)
        self.importing.discard(key)

    def _unwatch_all(self, key: Key) -> None:
        self.prober.unwatch(key)
        self.prober.unwatch(replacement_key(key))

    # --- entry point ---------------------------------------------------------------------------------

    async def reconcile(self, key: Key) -> Result:
        proxy = await self.kube.get_proxy(*key)
        if proxy is None:
            self.forget(key)
            return Result()
        ctx = _Ctx(key=key, proxy=proxy, log=self.log.with_values(proxy=f"{key[0]}/{key[1]}"),
                   providers=self.providers, providers_hash=self.providers_hash)
        try:
            return await self._outcome(ctx)
        except SpecChanged as e:
            # The spec moved on under this reconcile (also while writing its error): its outcome is
            # moot, and not an error; start over from the new spec.
            ctx.log.v(1).info("spec changed during the reconcile; starting over", reason=str(e))
            return Result(requeue_after=0.0)

    async def _outcome(self, ctx: _Ctx) -> Result:
        """One reconcile, with the provider's error kinds turned into their outcomes."""
        key = ctx.key
        try:
            result = await self._reconcile(ctx)
            self.troubles.pop(key, None)  # it got through: a trouble seen again later is news
            self.importing.discard(key)
            return result
        except LookupError:
            if await self.kube.get_proxy(*key) is not None:
                raise  # not a vanished Proxy (a KeyError is a LookupError too): a real error
            self.forget(key)  # deleted under us
            return Result()
        except (SpecError, PermanentError) as e:
            if ctx.proxy["metadata"].get("deletionTimestamp"):
                # Removing the finalizer would leak the VM, so keep trying, slowly, and say so where
                # `kubectl describe` shows it: only a person can clear this (see the message).
                message = (f"deletion blocked: {e}; retrying. If the instance was cleaned up by hand, "
                           f"remove the finalizer {FINALIZER} to let the Proxy go")
                return await self._trouble(ctx, message, reason="DeleteBlocked", retry=QUOTA,
                                           event=Event(WARNING, "DeleteBlocked", message))
            if isinstance(e, NotOwned):
                ctx.events.append(Event(WARNING, "NotOwner", str(e)))
            return await self._fail(ctx, str(e))
        except InProgress as e:
            return await self._in_progress(ctx, e)
        except QuotaError as e:
            return await self._trouble(ctx, f"out of capacity: {e}", reason="QuotaExceeded", retry=QUOTA,
                                       event=Event(WARNING, "QuotaExceeded", str(e)))
        except HostUnreachable as e:
            return await self._trouble(ctx, f"retrying: {e}", reason="HostUnreachable", retry=TRANSIENT)
        except TransientError as e:
            return await self._trouble(ctx, f"retrying: {e}", reason="TransientError", retry=TRANSIENT)

    async def _reconcile(self, ctx: _Ctx) -> Result:
        meta = ctx.proxy["metadata"]
        if meta.get("deletionTimestamp"):
            return await self._finalize(ctx)
        if FINALIZER not in (meta.get("finalizers") or []):
            ctx.proxy = await self.kube.set_finalizer(ctx.proxy, present=True)
        if ctx.status.get("phase") == FAILED and (
                self.failed.get(ctx.key) == (ctx.generation, ctx.providers_hash)
                or (ctx.status.get("observedGeneration") == ctx.generation
                    and ctx.status.get("failedProviders") == providers_tag(ctx.providers_hash))):
            # Failed stays until the spec or the providers file changes. The verdict is in status too,
            # so a restart or a new leader does not retry it (a bad image would be downloaded again).
            return Result()
        self.failed.pop(ctx.key, None)  # a verdict about other inputs (a stale one is re-decided)
        spec = parse_spec(ctx.proxy.get("spec"))
        if spec.mode == EXTERNAL:
            return await self._external(ctx, spec)
        return await self._managed(ctx, spec)

    # --- Managed -------------------------------------------------------------------------------------

    async def _managed(self, ctx: _Ctx, spec: ProxySpec) -> Result:
        current = Ref.from_status(ctx.status.get("instance"))
        previous = Ref.from_status(ctx.status.get("previousInstance"))
        desired: Desired | None
        try:
            desired = await desired_instance(proxy=ctx.proxy, spec=spec, providers=ctx.providers,
                                             kube=self.kube)
        except Waiting as e:
            if current is None:
                self.prober.unwatch(ctx.key)
                await self._write(ctx, self._compose(ctx, phase=PENDING, message=str(e), reason="Waiting",
                                                     previous=previous))
                return Result(requeue_after=self.timings.pending_retry)
            # The instance exists and its user-data is baked in: keep looking after it meanwhile.
            desired = None
            ctx.log.info("cannot compute the desired instance; keeping the current one", reason=str(e))
        provider = desired.provider if desired else provider_for(spec, ctx.providers)
        target = Ref(desired.name, desired.resolved.zone, provider=spec.provider) if desired else current
        assert target is not None

        replacing = current is not None and current != target
        if replacing:
            assert current is not None
            previous = await self._retire(ctx, spec, current=current, previous=previous, target=target)
            ctx.events.append(Event(NORMAL, "Replacing", f"provisioning inputs changed: replacing instance "
                                                         f"{current.name} with {target.name}"))
            self.prober.unwatch(replacement_key(ctx.key))  # a new replacement starts over
        ctx.serving = await self._serving_target(ctx, spec, previous) if previous is not None else None
        # The probe key of the instance being provisioned: its own while the old one serves.
        probe_key = replacement_key(ctx.key) if ctx.serving is not None else ctx.key
        if ctx.serving is not None:
            self._watch(ctx, ctx.key, ctx.serving)
        else:
            self.prober.unwatch(replacement_key(ctx.key))
        if replacing:
            assert current is not None
            if ctx.serving is None:
                self.prober.unwatch(ctx.key)
            await self._write(ctx, self._compose(
                ctx, phase=PROVISIONING, instance=target, previous=previous, reason="Provisioning",
                message=f"replacing instance {current.name} with {target.name}"))
            current = target

        try:
            instance = await provider.get(target.name, target.zone, owner_uid=ctx.uid)
        except HostUnreachable as e:
            return await self._unreachable(ctx, e, target=target)
        # While the old instance serves, status.ip is its address, not the new one's.
        had_ip = current == target and bool(ctx.status.get("ip")) and ctx.serving is None
        plan = self._plan(ctx, spec, target=target, instance=instance, had_ip=had_ip, previous=previous,
                          probe_key=probe_key)

        restart_delay: float | None = None
        if plan.action is Action.CREATE:
            if desired is None:
                self.prober.unwatch(probe_key)
                await self._write(ctx, self._compose(
                    ctx, phase=PENDING, instance=target, previous=previous, reason="Waiting",
                    message=f"instance {target.name} is gone and cannot be recreated until the cloud-init "
                            "Secret is back (spec.cloudInit.secretRef)"))
                return Result(requeue_after=self.timings.pending_retry)
            self.prober.unwatch(probe_key)
            # Record the name first: from here on, deletion and GC know this instance may exist. A retry
            # after no capacity finds it recorded already: status keeps saying why it waits.
            retrying_quota = ((self.troubles.get(ctx.key, ("", ""))[0] == "QuotaExceeded"
                               or ctx.key in self.importing)  # status shows the import's progress
                              and Ref.from_status(ctx.status.get("instance")) == target)
            if not retrying_quota:
                await self._write(ctx, self._compose(ctx, phase=PROVISIONING, message=plan.message,
                                                     instance=target, previous=previous,
                                                     reason="Provisioning"))
            instance, previous = await self._create(ctx, desired, previous=previous, target=target)
            ctx.log.info("instance created", instance=target.name, zone=target.zone)
            ctx.events.extend(plan.events)
            plan = self._plan(ctx, spec, target=target, instance=instance, had_ip=False, previous=previous,
                              probe_key=probe_key)
            if plan.action is not Action.NONE:
                plan = Plan(phase=PROVISIONING, message=plan.message, ip=plan.ip, poll=True)
        elif plan.action is Action.START:
            self.prober.unwatch(probe_key)
            await provider.start(target.name, target.zone)
            streak = self.restarts[ctx.key] = self.restarts.get(ctx.key, 0) + 1
            ctx.log.info("instance started", instance=target.name, zone=target.zone, message=plan.message,
                         startsInARow=streak)
            if streak & (streak - 1) == 0:  # 1, 2, 4, 8...: a crash loop is told, not spammed
                suffix = f" (started {streak} times since it was last Ready)" if streak > 1 else ""
                ctx.events.extend(Event(e.type_, e.reason, e.message + suffix) for e in plan.events)
            restart_delay = min(self.timings.poll * 2 ** (streak - 1), self.timings.restart_backoff_max)

        if not plan.probe:
            self.prober.unwatch(probe_key)
        if plan.delete_previous and previous is not None:
            await self._delete_ref(ctx, spec, previous)
            ctx.events.append(Event(NORMAL, "Replaced", f"instance {target.name} is Ready; deleted the "
                                                        f"instance it replaced, {previous.name}"))
            previous = None
            if probe_key != ctx.key:  # the replacement takes over the Proxy's probes, verdict and all
                new_target, verdict = self.prober.target(probe_key), self.prober.health(probe_key)
                self.prober.unwatch(probe_key)
                if new_target is not None:
                    self.prober.watch(ctx.key, new_target, seed=verdict)
            ctx.serving = None

        health = self.prober.health(ctx.key) if plan.probe else None
        endpoint = ProbeTarget(plan.ip, spec.port, spec.health).endpoint if plan.ip else None
        await self._write(ctx, self._compose(
            ctx, phase=plan.phase, message=plan.message, ip=plan.ip, endpoint=endpoint, instance=target,
            previous=previous, health=health, probing=plan.probe, reason=_reason_for(plan.phase, health),
            host_ok=(True, f"zone {target.zone} answered")))
        if plan.phase == READY:
            self.restarts.pop(ctx.key, None)
        if restart_delay is not None:
            return Result(requeue_after=restart_delay)
        if plan.poll and instance is not None and instance.power_state is PowerState.RUNNING \
                and not instance.ip:
            waits = self.ip_waits[ctx.key] = self.ip_waits.get(ctx.key, 0) + 1
            extra = waits - self.timings.ip_wait_polls
            if extra > 0:
                return Result(requeue_after=min(self.timings.poll * 2 ** min(extra, 20),
                                                self.timings.ip_wait_max))
        else:
            self.ip_waits.pop(ctx.key, None)
        return Result(requeue_after=self.timings.poll if plan.poll else None)

    def _plan(self, ctx: _Ctx, spec: ProxySpec, *, target: Ref, instance: Instance | None, had_ip: bool,
              previous: Ref | None, probe_key: Hashable) -> Plan:
        if instance is not None and instance.power_state is PowerState.RUNNING and instance.ip:
            self._watch(ctx, probe_key, ProbeTarget(instance.ip, spec.port, spec.health, ctx.namespace,
                                                    spec.auth_secret))
        return plan_instance(target=target, instance=instance, had_ip=had_ip,
                             health=self.prober.health(probe_key),
                             success_threshold=spec.health.success_threshold,
                             has_previous=previous is not None)

    def _watch(self, ctx: _Ctx, key: Hashable, target: ProbeTarget) -> None:
        """Probe `target`; a probe that starts afresh for the Proxy's own key (this process has not been
        probing it: a restart, a new leader) takes the verdict status recorded for the same endpoint."""
        seed = None
        if key == ctx.key and self.prober.target(key) is None:
            seed = _stored_verdict(ctx.status, target)
        self.prober.watch(key, target, seed=seed)

    async def _serving_target(self, ctx: _Ctx, spec: ProxySpec, previous: Ref) -> ProbeTarget | None:
        """The replaced instance as a probe target while it still runs with an IP (it keeps serving)."""
        provider = self._provider_for_ref(ctx, spec.provider, previous)
        if provider is None:
            return None
        try:
            inst = await provider.get(previous.name, previous.zone, owner_uid=ctx.uid)
        except TransientError:
            return None  # cannot tell: show the new instance, as when the old one is gone
        if inst is None or inst.power_state is not PowerState.RUNNING or not inst.ip:
            return None
        return ProbeTarget(inst.ip, spec.port, spec.health, ctx.namespace, spec.auth_secret)

    async def _create(self, ctx: _Ctx, desired: Desired, *, previous: Ref | None,
                      target: Ref) -> tuple[Instance, Ref | None]:
        """Create `target`; returns the instance and what is left of `previous` (None if it had to go)."""
        request = CreateRequest(name=desired.name, owner_uid=ctx.proxy["metadata"].get("uid", ""),
                                placement=desired.placement, user_data=desired.user_data,
                                owner_namespace=ctx.namespace, owner_name=ctx.key[1])
        last = 0.0

        async def progress(message: str) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last < self.timings.progress_interval:
                return
            last = now
            try:
                await self._write(ctx, self._compose(ctx, phase=PROVISIONING, instance=target,
                                                     previous=previous, reason="Provisioning",
                                                     message=f"creating instance {target.name}: {message}"))
            except Exception as e:  # progress is cosmetic: never let it fail the create
                ctx.log.v(1).info("progress status not written", error=str(e))

        try:
            return await desired.provider.create(request, progress=progress), previous
        except QuotaError as e:
            if previous is None or previous.zone != target.zone:
                raise  # deleting a VM on another host frees nothing here: keep it serving, retry slowly
            # No room for both on this host: give up create-before-delete for this one replacement.
            spec = parse_spec(ctx.proxy.get("spec"))
            await self._delete_ref(ctx, spec, previous)
            gone, previous = previous, None  # progress() reads `previous`: it must not bring it back
            ctx.serving = None
            ctx.events.append(Event(WARNING, "ReplacingWithoutOverlap",
                                    f"no capacity for {target.name} next to {gone.name} ({e}); deleted "
                                    f"{gone.name} first"))
            await self._write(ctx, self._compose(ctx, phase=PROVISIONING, instance=target, previous=None,
                                                 reason="Provisioning",
                                                 message=f"deleted {gone.name} to make room; creating "
                                                         f"{target.name}"))
            return await desired.provider.create(request, progress=progress), None

    async def _retire(self, ctx: _Ctx, spec: ProxySpec, *, current: Ref, previous: Ref | None,
                      target: Ref) -> Ref | None:
        """The inputs changed: decide what happens to the instance being replaced; returns the new
        previousInstance."""
        if previous is not None:
            # A replacement is already under way and `current` never became Ready (it would have retired
            # `previous`): drop it, keep the one that served. Back to `previous` itself: nothing to keep.
            await self._delete_ref(ctx, spec, current)
            return None if previous == target else previous
        if await self._serving(ctx, spec, current):
            return current
        await self._delete_ref(ctx, spec, current)  # it never worked: nothing to keep
        return None

    async def _serving(self, ctx: _Ctx, spec: ProxySpec, ref: Ref) -> bool:
        provider = self._provider_for_ref(ctx, spec.provider, ref)
        if provider is None:
            return False
        try:
            inst = await provider.get(ref.name, ref.zone, owner_uid=ctx.uid)
        except TransientError:
            return True  # cannot tell: keep it, so it is deleted (and not leaked) once the new one is Ready
        return inst is not None and inst.power_state is PowerState.RUNNING and bool(inst.ip)

    async def _unreachable(self, ctx: _Ctx, err: TransientError, *, target: Ref) -> Result:
        """The host did not answer: say so, keep everything as it is; never recreate on this."""
        status = self._held_status(ctx, message=f"zone {target.zone} unreachable: {err}",
                                   reason="HostUnreachable")
        set_condition(status, type_=COND_HOST, value="False", reason="Unreachable", message=str(err),
                      generation=ctx.generation)
        await self._write(ctx, status)
        return Result(retry=TRANSIENT)

    def _held_status(self, ctx: _Ctx, *, message: str, reason: str) -> Obj:
        """The current status with a new message: nothing observed, so the phase stays, except that
        Running/Ready still follow the probes (which reach the VM directly), so Ready stays == Healthy."""
        status = dict(ctx.status)
        phase = status.get("phase") or PROVISIONING
        health = self.prober.health(ctx.key)
        if phase in (RUNNING, READY) and health is None:
            health = self._probe_stored(ctx)
        if phase in (RUNNING, READY) and health is not None:
            phase = READY if health.healthy else RUNNING
            status = self._probe_fields(status, health, probing=True)
        status["phase"] = phase
        status["message"] = message
        status["observedGeneration"] = ctx.generation
        self._ready_condition(status, phase=phase, reason=reason, message=message, generation=ctx.generation)
        return status

    def _probe_stored(self, ctx: _Ctx) -> Health | None:
        """Nothing observed (the host did not answer) and this process is not probing yet (a restart):
        probe the endpoint status names, which the VM serves without its host's help, seeded with the
        recorded verdict. Without it a stale Ready would stand with no probe behind it."""
        ip = ctx.status.get("ip")
        try:
            spec = parse_spec(ctx.proxy.get("spec"))
        except SpecError:
            return None
        if not ip or spec.mode == EXTERNAL:
            return None
        target = ProbeTarget(str(ip), spec.port, spec.health, ctx.namespace, spec.auth_secret)
        if ctx.status.get("endpoint") != target.endpoint:
            return None
        self._watch(ctx, ctx.key, target)
        return self.prober.health(ctx.key)

    # --- External ------------------------------------------------------------------------------------

    async def _external(self, ctx: _Ctx, spec: ProxySpec) -> Result:
        for ref in (Ref.from_status(ctx.status.get("instance")),
                    Ref.from_status(ctx.status.get("previousInstance"))):
            if ref is not None:  # switched from Managed: its instances go
                await self._delete_ref(ctx, spec, ref)
        self.prober.unwatch(replacement_key(ctx.key))
        assert spec.external_host is not None and spec.external_port is not None
        target = ProbeTarget(spec.external_host, spec.external_port, spec.health, ctx.namespace,
                             spec.auth_secret)
        self._watch(ctx, ctx.key, target)
        health = self.prober.health(ctx.key)
        if health is not None and health.healthy:
            phase, message = READY, f"healthy: {health.message}"
        elif health is not None and health.healthy is False:
            phase, message = RUNNING, f"unhealthy: {health.message}"
        else:
            phase, message = RUNNING, "waiting for health probes"
        status = self._compose(ctx, phase=phase, message=message, ip=spec.external_host,
                               endpoint=target.endpoint, health=health, probing=True,
                               reason=_reason_for(phase, health))
        remove_condition(status, COND_HOST)  # no host of ours is involved
        await self._write(ctx, status)
        return Result()

    # --- deletion ------------------------------------------------------------------------------------

    async def _finalize(self, ctx: _Ctx) -> Result:
        if FINALIZER not in (ctx.proxy["metadata"].get("finalizers") or []):
            self.forget(ctx.key)
            return Result()
        self._unwatch_all(ctx.key)
        instance = Ref.from_status(ctx.status.get("instance"))
        previous = Ref.from_status(ctx.status.get("previousInstance"))
        refs = [r for r in (instance, previous) if r is not None]
        if ctx.status.get("phase") != DELETING:  # a retry keeps the message that says why it is retried
            await self._write(ctx, self._compose(ctx, phase=DELETING, reason="Deleting",
                                                 message="deleting " + (", ".join(r.name for r in refs)
                                                                        or "(no instance)"),
                                                 instance=instance, previous=previous))
        provider_name = str((ctx.proxy.get("spec") or {}).get("provider") or "")
        for ref in refs:
            provider = self._provider_for_ref(ctx, provider_name, ref)
            if provider is None:
                missing = ref.provider or provider_name  # the entry that made it, where status says
                await self.kube.record_event(
                    ctx.proxy, type_=WARNING, reason="ProviderMissing",
                    message=f"provider {missing!r} is not in the providers file: instance {ref.name} "
                            f"on {ref.zone} was not deleted; removing the finalizer anyway")
                ctx.log.info("provider gone; not deleting instance", instance=ref.name, zone=ref.zone,
                             provider=missing)
                continue
            try:
                await provider.delete(ref.name, ref.zone, owner_uid=ctx.uid)
            except NotOwned as e:  # not this Proxy's: nothing of its own is left there
                await self.kube.record_event(ctx.proxy, type_=WARNING, reason="NotOwner", message=str(e))
                ctx.log.info("instance not deleted: not this Proxy's", instance=ref.name, error=str(e))
                continue
            ctx.log.info("instance deleted", instance=ref.name, zone=ref.zone)
            await self.kube.record_event(ctx.proxy, type_=NORMAL, reason="Deleted",
                                         message=f"deleted instance {ref.name} on {ref.zone}")
        await self.kube.set_finalizer(ctx.proxy, present=False)
        self.forget(ctx.key)
        return Result()

    async def _delete_ref(self, ctx: _Ctx, spec: ProxySpec, ref: Ref) -> None:
        provider = self._provider_for_ref(ctx, spec.provider, ref)
        if provider is None:
            ctx.events.append(Event(WARNING, "ProviderMissing",
                                    f"no provider serves zone {ref.zone}: instance {ref.name} not deleted"))
            return
        try:
            await provider.delete(ref.name, ref.zone, owner_uid=ctx.uid)
        except NotOwned as e:
            ctx.events.append(Event(WARNING, "NotOwner", str(e)))
            ctx.log.info("instance not deleted: not this Proxy's", instance=ref.name, error=str(e))
            return
        ctx.log.info("instance deleted", instance=ref.name, zone=ref.zone)
        ctx.events.append(Event(NORMAL, "Deleted", f"deleted instance {ref.name} on {ref.zone}"))

    @staticmethod
    def _provider_for_ref(ctx: _Ctx, provider_name: str, ref: Ref) -> Provider | None:
        """The provider that made `ref`, as status records it (None if that entry is gone: never another
        provider's same-named host). Status from before it was recorded has name and zone only: the
        spec's provider if it serves the zone, else the one provider that does (the spec's provider may
        have changed since the instance was made)."""
        if ref.provider:
            return ctx.providers.get(ref.provider)
        named = ctx.providers.get(provider_name)
        if named is not None and ref.zone in named.zones():
            return named
        serving = [p for p in ctx.providers.values() if ref.zone in p.zones()]
        if len(serving) == 1:
            return serving[0]
        return None

    # --- outcomes that are not a plan ----------------------------------------------------------------

    async def _fail(self, ctx: _Ctx, message: str) -> Result:
        self._unwatch_all(ctx.key)
        self.failed[ctx.key] = (ctx.generation, ctx.providers_hash)
        ctx.log.info("proxy failed", message=message)
        status = self._compose(ctx, phase=FAILED, message=message, reason="Failed",
                               instance=Ref.from_status(ctx.status.get("instance")),
                               previous=Ref.from_status(ctx.status.get("previousInstance")))
        status["failedProviders"] = providers_tag(ctx.providers_hash)
        await self._write(ctx, status)
        return Result()

    async def _in_progress(self, ctx: _Ctx, e: InProgress) -> Result:
        """The provider works on it in the background: say how far it got, look again when it is done
        (and every `poll` meanwhile, for progress); no backoff, no Event, not a trouble."""
        self.troubles.pop(ctx.key, None)
        self.importing.add(ctx.key)
        status = self._held_status(ctx, message=str(e), reason="Provisioning")
        try:
            await self._write(ctx, status)
        except LookupError:
            self.forget(ctx.key)
            return Result()
        return Result(requeue_after=self.timings.import_poll, wake_on=e.wake)

    async def _trouble(self, ctx: _Ctx, message: str, *, reason: str, retry: str,
                       event: Event | None = None) -> Result:
        """A retryable error: keep the phase, say what went wrong, back off."""
        ctx.log.info("reconcile will be retried", reason=reason, message=message)
        changed = self.troubles.get(ctx.key) != (reason, message)
        self.troubles[ctx.key] = (reason, message)
        status = self._held_status(ctx, message=message, reason=reason)
        if reason == "HostUnreachable":  # a host that answered with an error is reachable: say nothing
            set_condition(status, type_=COND_HOST, value="False", reason="Unreachable", message=message,
                          generation=ctx.generation)
        if event is not None and changed:
            ctx.events.append(event)
        try:
            await self._write(ctx, status)
        except LookupError:
            self.forget(ctx.key)
            return Result()
        return Result(retry=retry)

    # --- status --------------------------------------------------------------------------------------

    def _compose(self, ctx: _Ctx, *, phase: str, message: str, reason: str, ip: str | None = None,
                 endpoint: str | None = None, instance: Ref | None = None, previous: Ref | None = None,
                 health: Health | None = None, probing: bool = False,
                 host_ok: tuple[bool, str] | None = None) -> Obj:
        """A complete status; only the conditions carry over from the old one (for transition times).

        While a replaced instance still serves (`ctx.serving`), an instance-in-progress phase describes
        the replacement only in `message`: ip, endpoint, probe verdict and phase are the serving one's."""
        if ctx.serving is not None and previous is not None and phase in (PROVISIONING, RUNNING, READY):
            health = self.prober.health(ctx.key)
            phase = READY if health is not None and health.healthy else RUNNING
            ip, endpoint, probing = ctx.serving.host, ctx.serving.endpoint, True
            verdict = "healthy" if phase == READY else (
                f"unhealthy: {health.message}" if health is not None and health.healthy is False
                else "waiting for health probes")
            message = f"serving from {previous.name} ({verdict}) while replacing it with " \
                      f"{instance.name if instance else '?'}: {message}"
            reason = _reason_for(phase, health)
        status: Obj = {"phase": phase, "message": message, "observedGeneration": ctx.generation}
        if ctx.status.get("conditions"):
            status["conditions"] = [dict(c) for c in ctx.status["conditions"]]
        if ip:
            status["ip"] = ip
        if endpoint:
            status["endpoint"] = endpoint
        if instance is not None:
            status["instance"] = instance.to_dict()
        if previous is not None:
            status["previousInstance"] = previous.to_dict()
        status = self._probe_fields(status, health, probing=probing)
        if host_ok is not None:
            set_condition(status, type_=COND_HOST, value="True" if host_ok[0] else "False",
                          reason="Reachable" if host_ok[0] else "Unreachable", message=host_ok[1],
                          generation=ctx.generation)
        elif phase in (FAILED, PENDING):
            remove_condition(status, COND_HOST)  # says nothing about a host we are not talking to
        self._ready_condition(status, phase=phase, reason=reason, message=message, generation=ctx.generation)
        return status

    @staticmethod
    def _probe_fields(status: Obj, health: Health | None, *, probing: bool) -> Obj:
        status = dict(status)
        generation = status.get("observedGeneration")
        status["healthy"] = bool(probing and health is not None and health.healthy)
        if probing and health is not None and health.last_probe is not None:
            status["lastProbeTime"] = rfc3339(health.last_probe)
        else:
            status.pop("lastProbeTime", None)
        if not probing or health is None or health.healthy is None:
            # No verdict, no condition: the HEALTHY column (this condition's status) stays blank until
            # the probes have one, as `kubectl get px -w` in the spec shows. Progress is in `message`.
            remove_condition(status, COND_HEALTHY)
        elif health.healthy:
            set_condition(status, type_=COND_HEALTHY, value="True", reason="ProbeSucceeded",
                          message=health.message, generation=generation)
        else:
            set_condition(status, type_=COND_HEALTHY, value="False", reason="ProbeFailed",
                          message=health.message, generation=generation)
        return status

    @staticmethod
    def _ready_condition(status: Obj, *, phase: str, reason: str, message: str, generation: int) -> None:
        if phase == READY:
            set_condition(status, type_=COND_READY, value="True", reason="Ready",
                          message=f"proxy is healthy at {status.get('endpoint')}", generation=generation)
        else:
            set_condition(status, type_=COND_READY, value="False", reason=reason, message=message,
                          generation=generation)

    async def _write(self, ctx: _Ctx, status: Obj) -> None:
        _cap_messages(status)
        old = ctx.status
        events = transition_events(old_phase=old.get("phase"), new_phase=status["phase"],
                                   message=status.get("message", ""), endpoint=status.get("endpoint"),
                                   ip=status.get("ip"))
        events = [*ctx.events, *events]
        ctx.events.clear()
        if status != old:
            ctx.proxy = await self.kube.update_proxy_status(ctx.proxy, status)
            if old.get("phase") != status["phase"]:
                ctx.log.info("phase changed", old=old.get("phase"), new=status["phase"],
                             message=status.get("message"))
        self.phases[ctx.key] = status["phase"]
        for ev in events:
            await self.kube.record_event(ctx.proxy, type_=ev.type_, reason=ev.reason, message=ev.message)


MAX_MESSAGE = 1024


def _cap_messages(status: Obj) -> None:
    """Provider errors can be long (a libvirt XML error, a stack of causes): keep status readable."""
    def cap(text: str) -> str:
        return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."

    if isinstance(status.get("message"), str):
        status["message"] = cap(status["message"])
    for c in status.get("conditions") or []:
        if isinstance(c.get("message"), str):
            c["message"] = cap(c["message"])


def providers_tag(providers_hash: str) -> str:
    """A short tag of the providers file for status: enough to tell files apart, and not the file's own
    digest (status is readable by every Proxy user; the file is the operator's)."""
    return hashlib.sha256(f"egress-kvm providers {providers_hash}".encode()).hexdigest()[:16]


def replacement_key(key: Key) -> tuple[str, str, str]:
    """The probe key of an instance being provisioned while the one it replaces serves."""
    return (key[0], key[1], "replacement")


def _stored_verdict(status: Obj, target: ProbeTarget) -> Health | None:
    """The healthy verdict status records for `target`'s endpoint, as probe state (None if there is none:
    not Ready, another endpoint). The message and probe time are the recorded ones, so seeding alone
    changes nothing in status."""
    if status.get("phase") != READY or status.get("healthy") is not True:
        return None
    if status.get("endpoint") != target.endpoint:
        return None
    cond = get_condition(status, COND_HEALTHY) or {}
    last = None
    if isinstance(status.get("lastProbeTime"), str):
        try:
            last = datetime.strptime(status["lastProbeTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            last = None
    return Health(healthy=True, message=str(cond.get("message") or "healthy"), last_probe=last,
                  successes=target.check.success_threshold)


def _reason_for(phase: str, health: Health | None) -> str:
    if phase == RUNNING:
        if health is not None and health.healthy is False:
            return "Unhealthy"
        return "WaitingForProbes"
    return {PROVISIONING: "Provisioning", READY: "Ready", PENDING: "Waiting", FAILED: "Failed",
            DELETING: "Deleting"}.get(phase, phase)


__all__ = ["QUOTA", "TRANSIENT", "Reconciler", "Result", "Timings", "get_condition", "replacement_key"]
