"""The reconciler: one Proxy key in; observe (the Proxy fresh from the API server, its instances from the
provider, the probe verdicts, `memory`), decide with the pure rules (`plan`, `outcome`), act, and write
the status `compose` builds. How it fits the operator is docs/architecture.md; the rules are in plan.py.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from egress_kvm.kube.interfaces import FINALIZER, Key, KubeApi, Obj, ProxyGone, SpecChanged
from egress_kvm.log import Logger, get_logger
from egress_kvm.providers.base import (
    CreateRequest,
    HostUnreachable,
    Instance,
    PowerState,
    Provider,
    QuotaError,
    TransientError,
)

from .compose import (
    Serving,
    Verdict,
    cap_messages,
    compose,
    external_verdict,
    held,
    providers_tag,
    reason_for,
)
from .desired import Desired, Waiting, desired_instance, provider_for, provider_for_ref
from .health import Prober
from .memory import Memory
from .outcome import Fail, Result, Retry, Trouble, outcome_for
from .plan import (
    NORMAL,
    WARNING,
    Action,
    Event,
    Plan,
    ip_wait_delay,
    plan_instance,
    plan_retire,
    quota_fallback,
    restart_announced,
    restart_delay,
    transition_events,
)
from .proxyspec import EXTERNAL, ProxySpec, SpecError, parse_spec
from .status import (
    COND_HOST,
    DELETING,
    FAILED,
    PENDING,
    PROVISIONING,
    READY,
    RUNNING,
    Ref,
    get_condition,
    remove_condition,
)
from .verdict import Health, ProbeKey, ProbeTarget, stored_verdict


@dataclass(frozen=True)
class Timings:
    poll: float = 5.0  # look again at an instance that is starting or has no IP yet
    pending_retry: float = 30.0  # look again for something outside (a missing Secret)
    progress_interval: float = 2.0  # at most one status write per this many seconds for create progress
    restart_backoff_max: float = 300.0  # a VM that keeps stopping is started again at most this often
    # A VM running without an IP is looked at every `poll` this many times, then on a growing delay up
    # to ip_wait_max: a guest whose network never comes up must not cost a provider call every poll.
    ip_wait_polls: int = 60
    ip_wait_max: float = 60.0


@dataclass
class _Ctx:
    """One reconcile's working state. `generation`, `uid` and the providers are frozen when it starts:
    `proxy` is replaced by whatever a write returns, which after a conflict may carry a newer spec this
    reconcile never evaluated, and a verdict must name the inputs it was computed from."""

    key: Key
    proxy: Obj
    log: Logger
    providers: Mapping[str, Provider] = field(default_factory=dict)
    providers_hash: str = ""
    events: list[Event] = field(default_factory=list)  # recorded with the next status write
    serving: ProbeTarget | None = None  # the replaced instance while it still serves
    generation: int = field(init=False)

    def __post_init__(self) -> None:
        self.generation = int(self.proxy["metadata"].get("generation") or 0)

    @property
    def status(self) -> Obj:
        return self.proxy.get("status") or {}

    @property
    def own(self) -> ProbeKey:
        return ProbeKey(self.key)

    @property
    def probe_key(self) -> ProbeKey:
        """The instance being provisioned is probed under its own key while the replaced one serves."""
        return ProbeKey(self.key, replacement=self.serving is not None)


class Reconciler:
    def __init__(self, *, kube: KubeApi, prober: Prober[ProbeKey], providers: Mapping[str, Provider],
                 providers_hash: str = "", timings: Timings | None = None,
                 logger: Logger | None = None) -> None:
        self.kube = kube
        self.prober = prober
        self.providers: Mapping[str, Provider] = dict(providers)
        self.providers_hash = providers_hash
        self.timings = timings or Timings()
        self.log = logger or get_logger("controller")
        self.memory = Memory()

    def set_providers(self, providers: Mapping[str, Provider], providers_hash: str) -> None:
        self.providers = dict(providers)
        self.providers_hash = providers_hash
        self.memory.forget_failed()  # a config fix may cure any Failed Proxy

    def forget(self, key: Key) -> None:
        self._unwatch_all(key)
        self.memory.forget(key)

    def phase_counts(self) -> Counter[str]:
        return self.memory.phase_counts()

    def _unwatch_all(self, key: Key) -> None:
        self.prober.unwatch(ProbeKey(key))
        self.prober.unwatch(ProbeKey(key, replacement=True))

    # --- entry point: errors become outcomes ---------------------------------------------------------

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
        """One reconcile, with the provider's error kinds turned into their outcomes (outcome.py)."""
        key = ctx.key
        try:
            result = await self._reconcile(ctx)
        except ProxyGone:
            if await self.kube.get_proxy(*key) is not None:
                raise  # deleted and recreated under the same name: a new object, reconciled afresh
            self.forget(key)
            return Result()
        except Exception as e:
            outcome = outcome_for(e, deleting=bool(ctx.proxy["metadata"].get("deletionTimestamp")))
            if outcome is None:
                raise
            return await (self._fail(ctx, outcome) if isinstance(outcome, Fail) else
                          self._trouble(ctx, outcome))
        state = self.memory.get(key)
        if state is not None:
            state.trouble = None  # it got through: a trouble seen again later is news
        return result

    async def _reconcile(self, ctx: _Ctx) -> Result:
        meta = ctx.proxy["metadata"]
        if meta.get("deletionTimestamp"):
            return await self._finalize(ctx)
        if FINALIZER not in (meta.get("finalizers") or []):
            ctx.proxy = await self.kube.set_finalizer(ctx.proxy, present=True)
        if ctx.status.get("phase") == FAILED and (
                self.memory.peek(ctx.key).failed == (ctx.generation, ctx.providers_hash)
                or (ctx.status.get("observedGeneration") == ctx.generation
                    and ctx.status.get("failedProviders") == providers_tag(ctx.providers_hash))):
            # Failed stays until the spec or the providers file changes. The verdict is in status too,
            # so a restart or a new leader does not retry it (a bad image would be downloaded again).
            return Result()
        if ctx.key in self.memory:
            self.memory[ctx.key].failed = None  # a verdict about other inputs (a stale one is re-decided)
        spec = parse_spec(ctx.proxy.get("spec"))
        if spec.mode == EXTERNAL:
            return await self._external(ctx, spec)
        return await self._managed(ctx, spec)

    # --- Managed: observe, plan, act -----------------------------------------------------------------

    async def _managed(self, ctx: _Ctx, spec: ProxySpec) -> Result:
        current = Ref.from_status(ctx.status.get("instance"))
        previous = Ref.from_status(ctx.status.get("previousInstance"))
        desired: Desired | None = None
        try:
            desired = await desired_instance(proxy=ctx.proxy, spec=spec, providers=ctx.providers,
                                             kube=self.kube)
        except Waiting as e:
            if current is None:
                return await self._pending(ctx, str(e), instance=None, previous=previous)
            # The instance exists and its user-data is baked in: keep looking after it meanwhile.
            ctx.log.info("cannot compute the desired instance; keeping the current one", reason=str(e))
        provider = desired.provider if desired else provider_for(spec, ctx.providers)
        target = Ref(desired.name, desired.resolved.zone, provider=spec.provider) if desired else current
        assert target is not None
        if current is not None and current != target:
            previous = await self._replace(ctx, spec, current=current, previous=previous, target=target)
            current = target
        else:
            await self._observe_serving(ctx, spec, previous)
        try:
            instance = await provider.get(target.name, target.zone)
        except HostUnreachable as e:
            return await self._unreachable(ctx, e, target=target)
        # While the old instance serves, status.ip is its address, not the new one's.
        had_ip = current == target and bool(ctx.status.get("ip")) and ctx.serving is None
        plan = self._plan(ctx, spec, target=target, instance=instance, had_ip=had_ip, previous=previous)
        delay: float | None = None
        if plan.action is Action.CREATE:
            if desired is None:
                return await self._pending(ctx, f"instance {target.name} is gone and cannot be recreated "
                                           "until the cloud-init Secret is back (spec.cloudInit.secretRef)",
                                           instance=target, previous=previous)
            instance, previous, plan = await self._create(ctx, spec, desired, plan, previous=previous)
        elif plan.action is Action.START:
            delay = await self._start(ctx, provider, plan, target=target)
        if not plan.probe:
            self.prober.unwatch(ctx.probe_key)
        if plan.delete_previous and previous is not None:
            await self._replaced(ctx, spec, target=target, previous=previous)
            previous = None
        return await self._settle(ctx, spec, plan, target=target, previous=previous, instance=instance,
                                  delay=delay)

    def _plan(self, ctx: _Ctx, spec: ProxySpec, *, target: Ref, instance: Instance | None, had_ip: bool,
              previous: Ref | None) -> Plan:
        if instance is not None and instance.power_state is PowerState.RUNNING and instance.ip:
            self._watch(ctx, ctx.probe_key, ProbeTarget(instance.ip, spec.port, spec.health, _ns(ctx),
                                                        spec.auth_secret))
        return plan_instance(target=target, instance=instance, had_ip=had_ip,
                             health=self.prober.health(ctx.probe_key),
                             success_threshold=spec.health.success_threshold,
                             has_previous=previous is not None)

    async def _replace(self, ctx: _Ctx, spec: ProxySpec, *, current: Ref, previous: Ref | None,
                       target: Ref) -> Ref | None:
        """The inputs changed: retire what plan_retire says, then say so; returns the new previous."""
        serves = previous is None and await self._serves(ctx, spec, current) is not False
        retire = plan_retire(current=current, previous=previous, target=target, current_serves=serves)
        for ref in retire.delete:
            await self._delete_ref(ctx, spec, ref)
        ctx.events.append(Event(NORMAL, "Replacing", f"provisioning inputs changed: replacing instance "
                                                     f"{current.name} with {target.name}"))
        self.prober.unwatch(ProbeKey(ctx.key, replacement=True))  # a new replacement starts over
        await self._observe_serving(ctx, spec, retire.previous)
        if ctx.serving is None:
            self.prober.unwatch(ctx.own)
        await self._say(ctx, Verdict(PROVISIONING, f"replacing instance {current.name} with {target.name}",
                                     "Provisioning", instance=target, previous=retire.previous))
        return retire.previous

    async def _observe_serving(self, ctx: _Ctx, spec: ProxySpec, previous: Ref | None) -> None:
        """The replaced instance keeps serving (probed under the Proxy's key) while it runs with an IP."""
        inst = await self._serves(ctx, spec, previous) if previous is not None else None
        ctx.serving = None
        if inst:
            assert inst.ip is not None
            ctx.serving = ProbeTarget(inst.ip, spec.port, spec.health, _ns(ctx), spec.auth_secret)
            self._watch(ctx, ctx.own, ctx.serving)
        else:
            self.prober.unwatch(ProbeKey(ctx.key, replacement=True))

    async def _serves(self, ctx: _Ctx, spec: ProxySpec, ref: Ref) -> Instance | bool:
        """`ref` as the provider sees it if it runs with an IP; False if it does not (or its provider is
        gone); True if the provider could not tell."""
        provider = provider_for_ref(ctx.providers, spec.provider, ref)
        if provider is None:
            return False
        try:
            inst = await provider.get(ref.name, ref.zone)
        except TransientError:
            return True
        return inst if inst is not None and inst.power_state is PowerState.RUNNING and inst.ip else False

    async def _create(self, ctx: _Ctx, spec: ProxySpec, desired: Desired, plan: Plan, *,
                      previous: Ref | None) -> tuple[Instance, Ref | None, Plan]:
        target = Ref(desired.name, desired.resolved.zone, provider=spec.provider)
        self.prober.unwatch(ctx.probe_key)
        # Record the name first: from here on, deletion and GC know this instance may exist. A retry
        # after no capacity finds it recorded already: status keeps saying why it waits.
        trouble = self.memory.peek(ctx.key).trouble
        if not (trouble is not None and trouble[0] == "QuotaExceeded"
                and Ref.from_status(ctx.status.get("instance")) == target):
            await self._say(ctx, Verdict(PROVISIONING, plan.message, "Provisioning", instance=target,
                                         previous=previous))
        instance, previous = await self._provision(ctx, spec, desired, previous=previous, target=target)
        ctx.log.info("instance created", instance=target.name, zone=target.zone)
        ctx.events.extend(plan.events)
        plan = self._plan(ctx, spec, target=target, instance=instance, had_ip=False, previous=previous)
        if plan.action is not Action.NONE:
            plan = Plan(phase=PROVISIONING, message=plan.message, ip=plan.ip, poll=True)
        return instance, previous, plan

    async def _provision(self, ctx: _Ctx, spec: ProxySpec, desired: Desired, *, previous: Ref | None,
                         target: Ref) -> tuple[Instance, Ref | None]:
        """Create `target`; returns the instance and what is left of `previous` (None if it had to go)."""
        request = CreateRequest(name=desired.name, owner_uid=ctx.proxy["metadata"].get("uid", ""),
                                placement=desired.placement, user_data=desired.user_data,
                                owner_namespace=_ns(ctx), owner_name=ctx.key[1])
        last = 0.0

        async def progress(message: str) -> None:
            nonlocal last
            if time.monotonic() - last < self.timings.progress_interval:
                return
            last = time.monotonic()
            try:
                await self._say(ctx, Verdict(PROVISIONING, f"creating instance {target.name}: {message}",
                                             "Provisioning", instance=target, previous=previous))
            except Exception as e:  # progress is cosmetic: never let it fail the create
                ctx.log.v(1).info("progress status not written", error=str(e))

        try:
            return await desired.provider.create(request, progress=progress), previous
        except QuotaError as e:
            if not quota_fallback(previous=previous, target=target):
                raise
            assert previous is not None
            # No room for both on this host: give up create-before-delete for this one replacement.
            await self._delete_ref(ctx, spec, previous)
            gone, previous = previous, None  # progress() reads `previous`: it must not bring it back
            ctx.serving = None
            ctx.events.append(Event(WARNING, "ReplacingWithoutOverlap",
                                    f"no capacity for {target.name} next to {gone.name} ({e}); deleted "
                                    f"{gone.name} first"))
            await self._say(ctx, Verdict(PROVISIONING, f"deleted {gone.name} to make room; creating "
                                         f"{target.name}", "Provisioning", instance=target))
            return await desired.provider.create(request, progress=progress), None

    async def _start(self, ctx: _Ctx, provider: Provider, plan: Plan, *, target: Ref) -> float:
        self.prober.unwatch(ctx.probe_key)
        await provider.start(target.name, target.zone)
        state = self.memory[ctx.key]
        state.restarts += 1
        ctx.log.info("instance started", instance=target.name, zone=target.zone, message=plan.message,
                     startsInARow=state.restarts)
        if restart_announced(state.restarts):
            suffix = (f" (started {state.restarts} times since it was last Ready)"
                      if state.restarts > 1 else "")
            ctx.events.extend(Event(e.type_, e.reason, e.message + suffix) for e in plan.events)
        return restart_delay(state.restarts, poll=self.timings.poll, cap=self.timings.restart_backoff_max)

    async def _replaced(self, ctx: _Ctx, spec: ProxySpec, *, target: Ref, previous: Ref) -> None:
        """The replacement is Ready: the replaced instance goes, and its probes hand over."""
        probe_key = ctx.probe_key
        await self._delete_ref(ctx, spec, previous)
        ctx.events.append(Event(NORMAL, "Replaced", f"instance {target.name} is Ready; deleted the "
                                                    f"instance it replaced, {previous.name}"))
        if probe_key != ctx.own:  # the replacement takes over the Proxy's probes, verdict and all
            new_target, verdict = self.prober.target(probe_key), self.prober.health(probe_key)
            self.prober.unwatch(probe_key)
            if new_target is not None:
                self.prober.watch(ctx.own, new_target, seed=verdict)
        ctx.serving = None

    async def _settle(self, ctx: _Ctx, spec: ProxySpec, plan: Plan, *, target: Ref, previous: Ref | None,
                      instance: Instance | None, delay: float | None) -> Result:
        """Write the plan's status; when to look again."""
        health = self.prober.health(ctx.own) if plan.probe else None
        endpoint = ProbeTarget(plan.ip, spec.port, spec.health).endpoint if plan.ip else None
        await self._say(ctx, Verdict(plan.phase, plan.message, reason_for(plan.phase, health), ip=plan.ip,
                                     endpoint=endpoint, instance=target, previous=previous, health=health,
                                     probing=plan.probe, host_ok=(True, f"zone {target.zone} answered")))
        state = self.memory[ctx.key]
        if plan.phase == READY:
            state.restarts = 0
        if delay is not None:
            return Result(requeue_after=delay)
        if plan.poll and instance is not None and instance.power_state is PowerState.RUNNING \
                and not instance.ip:
            state.ip_waits += 1
            t = self.timings
            return Result(requeue_after=ip_wait_delay(state.ip_waits, poll=t.poll, polls=t.ip_wait_polls,
                                                      cap=t.ip_wait_max))
        state.ip_waits = 0
        return Result(requeue_after=self.timings.poll if plan.poll else None)

    def _watch(self, ctx: _Ctx, key: ProbeKey, target: ProbeTarget) -> None:
        """Probe `target`; a probe that starts afresh for the Proxy's own key (this process has not been
        probing it: a restart, a new leader) takes the verdict status recorded for the same endpoint."""
        seed = None
        if key == ctx.own and self.prober.target(key) is None:
            seed = stored_verdict(ctx.status, target)
        self.prober.watch(key, target, seed=seed)

    # --- External ------------------------------------------------------------------------------------

    async def _external(self, ctx: _Ctx, spec: ProxySpec) -> Result:
        for ref in (Ref.from_status(ctx.status.get("instance")),
                    Ref.from_status(ctx.status.get("previousInstance"))):
            if ref is not None:  # switched from Managed: its instances go
                await self._delete_ref(ctx, spec, ref)
        self.prober.unwatch(ProbeKey(ctx.key, replacement=True))
        assert spec.external_host is not None and spec.external_port is not None
        target = ProbeTarget(spec.external_host, spec.external_port, spec.health, _ns(ctx), spec.auth_secret)
        self._watch(ctx, ctx.own, target)
        status = compose(ctx.status, external_verdict(self.prober.health(ctx.own), host=spec.external_host,
                                                      target=target), generation=ctx.generation)
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
            names = ", ".join(r.name for r in refs) or "(no instance)"
            await self._say(ctx, Verdict(DELETING, f"deleting {names}", "Deleting", instance=instance,
                                         previous=previous))
        provider_name = str((ctx.proxy.get("spec") or {}).get("provider") or "")
        for ref in refs:
            provider = provider_for_ref(ctx.providers, provider_name, ref)
            if provider is None:
                missing = ref.provider or provider_name  # the entry that made it, where status says
                await self.kube.record_event(
                    ctx.proxy, type_=WARNING, reason="ProviderMissing",
                    message=f"provider {missing!r} is not in the providers file: instance {ref.name} "
                            f"on {ref.zone} was not deleted; removing the finalizer anyway")
                ctx.log.info("provider gone; not deleting instance", instance=ref.name, zone=ref.zone,
                             provider=missing)
                continue
            await provider.delete(ref.name, ref.zone)
            ctx.log.info("instance deleted", instance=ref.name, zone=ref.zone)
            await self.kube.record_event(ctx.proxy, type_=NORMAL, reason="Deleted",
                                         message=f"deleted instance {ref.name} on {ref.zone}")
        await self.kube.set_finalizer(ctx.proxy, present=False)
        self.forget(ctx.key)
        return Result()

    async def _delete_ref(self, ctx: _Ctx, spec: ProxySpec, ref: Ref) -> None:
        provider = provider_for_ref(ctx.providers, spec.provider, ref)
        if provider is None:
            ctx.events.append(Event(WARNING, "ProviderMissing",
                                    f"no provider serves zone {ref.zone}: instance {ref.name} not deleted"))
            return
        await provider.delete(ref.name, ref.zone)
        ctx.log.info("instance deleted", instance=ref.name, zone=ref.zone)
        ctx.events.append(Event(NORMAL, "Deleted", f"deleted instance {ref.name} on {ref.zone}"))

    # --- outcomes that are not a plan ----------------------------------------------------------------

    async def _pending(self, ctx: _Ctx, message: str, *, instance: Ref | None,
                       previous: Ref | None) -> Result:
        self.prober.unwatch(ctx.probe_key)
        await self._say(ctx, Verdict(PENDING, message, "Waiting", instance=instance, previous=previous))
        return Result(requeue_after=self.timings.pending_retry)

    async def _fail(self, ctx: _Ctx, fail: Fail) -> Result:
        self._unwatch_all(ctx.key)
        self.memory[ctx.key].failed = (ctx.generation, ctx.providers_hash)
        ctx.log.info("proxy failed", message=fail.message)
        status = compose(ctx.status, Verdict(FAILED, fail.message, "Failed",
                                             instance=Ref.from_status(ctx.status.get("instance")),
                                             previous=Ref.from_status(ctx.status.get("previousInstance"))),
                         generation=ctx.generation)
        status["failedProviders"] = providers_tag(ctx.providers_hash)
        await self._write(ctx, status)
        return Result()

    async def _trouble(self, ctx: _Ctx, trouble: Trouble) -> Result:
        """A retryable error: keep the phase, say what went wrong, back off."""
        ctx.log.info("reconcile will be retried", reason=trouble.reason, message=trouble.message)
        state = self.memory[ctx.key]
        if trouble.event is not None and state.trouble != (trouble.reason, trouble.message):
            ctx.events.append(trouble.event)
        state.trouble = (trouble.reason, trouble.message)
        try:
            await self._write(ctx, self._held(ctx, message=trouble.message, reason=trouble.reason,
                                              unreachable=trouble.message if trouble.unreachable else None))
        except ProxyGone:
            self.forget(ctx.key)
            return Result()
        return Result(retry=trouble.retry)

    async def _unreachable(self, ctx: _Ctx, err: TransientError, *, target: Ref) -> Result:
        """The host did not answer: say so, keep everything as it is; never recreate on this."""
        await self._write(ctx, self._held(ctx, message=f"zone {target.zone} unreachable: {err}",
                                          reason="HostUnreachable", unreachable=str(err)))
        return Result(retry=Retry.TRANSIENT)

    def _held(self, ctx: _Ctx, *, message: str, reason: str, unreachable: str | None) -> Obj:
        health = self.prober.health(ctx.own)
        if health is None and ctx.status.get("phase") in (RUNNING, READY):
            health = self._probe_stored(ctx)
        return held(ctx.status, message=message, reason=reason, generation=ctx.generation, health=health,
                    unreachable=unreachable)

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
        target = ProbeTarget(str(ip), spec.port, spec.health, _ns(ctx), spec.auth_secret)
        if ctx.status.get("endpoint") != target.endpoint:
            return None
        self._watch(ctx, ctx.own, target)
        return self.prober.health(ctx.own)

    # --- writing -------------------------------------------------------------------------------------

    async def _say(self, ctx: _Ctx, verdict: Verdict) -> None:
        serving = Serving(ctx.serving, self.prober.health(ctx.own)) if ctx.serving is not None else None
        await self._write(ctx, compose(ctx.status, verdict, generation=ctx.generation, serving=serving))

    async def _write(self, ctx: _Ctx, status: Obj) -> None:
        cap_messages(status)
        old = ctx.status
        events = [*ctx.events, *transition_events(
            old_phase=old.get("phase"), new_phase=status["phase"], message=status.get("message", ""),
            endpoint=status.get("endpoint"), ip=status.get("ip"))]
        ctx.events.clear()
        if status != old:
            ctx.proxy = await self.kube.update_proxy_status(ctx.proxy, status)
            if old.get("phase") != status["phase"]:
                ctx.log.info("phase changed", old=old.get("phase"), new=status["phase"],
                             message=status.get("message"))
        self.memory[ctx.key].phase = status["phase"]
        for ev in events:
            await self.kube.record_event(ctx.proxy, type_=ev.type_, reason=ev.reason, message=ev.message)


def _ns(ctx: _Ctx) -> str:
    return str(ctx.proxy["metadata"].get("namespace", ""))


__all__ = ["Reconciler", "Result", "Retry", "Timings", "get_condition"]
