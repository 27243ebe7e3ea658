"""The reconciler: one Proxy key in; observe (the Proxy fresh from the API server, its instances from the
provider, the probe verdicts, `memory`), decide with the pure rules (`plan`, `outcome`), act, and write
the status `compose` builds. How it fits the operator is docs/architecture.md; the rules are in plan.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from egress_kvm.kube.interfaces import FINALIZER, Key, KubeApi, ProxyGone, SpecChanged
from egress_kvm.log import Logger, get_logger
from egress_kvm.policy.external import external_refusal
from egress_kvm.providers.base import (
    HostUnreachable,
    InProgress,
    Instance,
    PowerState,
    Provider,
    TransientError,
)

from . import actions
from . import plan as rules
from .compose import Verdict, compose, external_verdict, providers_tag, reason_for
from .context import Context
from .deletion import finalize
from .desired import Desired, Waiting, desired_instance, provider_for, provider_for_ref
from .health import Prober
from .memory import Memory
from .outcome import Fail, Result, Retry, Trouble, outcome_for
from .plan import NORMAL, Action, Event, Plan
from .proxyspec import EXTERNAL, ProxySpec, SpecError, parse_spec
from .status import COND_HOST, FAILED, PENDING, PROVISIONING, READY, Ref, get_condition, remove_condition
from .verdict import ProbeKey, ProbeTarget


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
        self.prober.unwatch(ProbeKey(key))
        self.prober.unwatch(ProbeKey(key, replacement=True))
        self.memory.forget(key)

    def phase_counts(self) -> Counter[str]:
        return self.memory.phase_counts()

    # --- entry point: errors become outcomes ---------------------------------------------------------

    async def reconcile(self, key: Key) -> Result:
        proxy = await self.kube.get_proxy(*key)
        if proxy is None:
            self.forget(key)
            return Result()
        ctx = Context(key=key, proxy=proxy, log=self.log.with_values(proxy=f"{key[0]}/{key[1]}"),
                      kube=self.kube, prober=self.prober, memory=self.memory, providers=self.providers,
                      providers_hash=self.providers_hash)
        try:
            return await self._outcome(ctx)
        except SpecChanged as e:
            # The spec moved on under this reconcile (also while writing its error): its outcome is
            # moot, and not an error; start over from the new spec.
            ctx.log.v(1).info("spec changed during the reconcile; starting over", reason=str(e))
            return Result(requeue_after=0.0)

    async def _outcome(self, ctx: Context) -> Result:
        """One reconcile, with the provider's error kinds turned into their outcomes (outcome.py)."""
        key = ctx.key
        try:
            result = await self._reconcile(ctx)
        except ProxyGone:
            if await self.kube.get_proxy(*key) is not None:
                raise  # deleted and recreated under the same name: a new object, reconciled afresh
            self.forget(key)
            return Result()
        except InProgress as e:
            return await self._in_progress(ctx, e)
        except Exception as e:
            outcome = outcome_for(e, deleting=bool(ctx.proxy["metadata"].get("deletionTimestamp")))
            if outcome is None:
                raise
            return await (self._fail(ctx, outcome) if isinstance(outcome, Fail) else
                          self._trouble(ctx, outcome))
        state = self.memory.get(key)
        if state is not None:
            state.trouble = None  # it got through: a trouble seen again later is news
            state.importing = False
        return result

    async def _reconcile(self, ctx: Context) -> Result:
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

    async def _managed(self, ctx: Context, spec: ProxySpec) -> Result:
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
            instance = await provider.get(target.name, target.zone, owner_uid=ctx.uid)
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
            starts = await actions.start(ctx, provider, plan, target=target)
            delay = rules.restart_delay(starts, poll=self.timings.poll, cap=self.timings.restart_backoff_max)
        if not plan.probe:
            self.prober.unwatch(ctx.probe_key)
        if plan.delete_previous and previous is not None:
            await actions.hand_over(ctx, provider_name=spec.provider, target=target, previous=previous)
            previous = None
        return await self._settle(ctx, spec, plan, target=target, previous=previous, instance=instance,
                                  delay=delay)

    def _plan(self, ctx: Context, spec: ProxySpec, *, target: Ref, instance: Instance | None, had_ip: bool,
              previous: Ref | None) -> Plan:
        if instance is not None and instance.power_state is PowerState.RUNNING and instance.ip:
            ctx.watch(ctx.probe_key, ProbeTarget(instance.ip, spec.port, spec.health, ctx.namespace,
                                                        spec.auth_secret))
        return rules.plan_instance(target=target, instance=instance, had_ip=had_ip,
                             health=self.prober.health(ctx.probe_key),
                             success_threshold=spec.health.success_threshold,
                             has_previous=previous is not None)

    async def _replace(self, ctx: Context, spec: ProxySpec, *, current: Ref, previous: Ref | None,
                       target: Ref) -> Ref | None:
        """The inputs changed: retire what plan_retire says, then say so; returns the new previous."""
        serves = previous is None and await self._serves(ctx, spec, current) is not False
        retire = rules.plan_retire(current=current, previous=previous, target=target, current_serves=serves)
        for ref in retire.delete:
            await ctx.delete(spec.provider, ref)
        ctx.events.append(Event(NORMAL, "Replacing", f"provisioning inputs changed: replacing instance "
                                                     f"{current.name} with {target.name}"))
        self.prober.unwatch(ProbeKey(ctx.key, replacement=True))  # a new replacement starts over
        await self._observe_serving(ctx, spec, retire.previous)
        if ctx.serving is None:
            self.prober.unwatch(ctx.own)
        await ctx.say(Verdict(PROVISIONING, f"replacing instance {current.name} with {target.name}",
                                     "Provisioning", instance=target, previous=retire.previous))
        return retire.previous

    async def _observe_serving(self, ctx: Context, spec: ProxySpec, previous: Ref | None) -> None:
        """The replaced instance keeps serving (probed under the Proxy's key) while it runs with an IP."""
        inst = await self._serves(ctx, spec, previous) if previous is not None else None
        ctx.serving = None
        if isinstance(inst, Instance) and inst.ip:
            ctx.serving = ProbeTarget(inst.ip, spec.port, spec.health, ctx.namespace, spec.auth_secret)
            ctx.watch(ctx.own, ctx.serving)
        else:
            self.prober.unwatch(ProbeKey(ctx.key, replacement=True))

    async def _serves(self, ctx: Context, spec: ProxySpec, ref: Ref) -> Instance | bool:
        """`ref` as the provider sees it if it runs with an IP; False if it does not (or its provider is
        gone); True if the provider could not tell."""
        provider = provider_for_ref(ctx.providers, spec.provider, ref)
        if provider is None:
            return False
        try:
            inst = await provider.get(ref.name, ref.zone, owner_uid=ctx.uid)
        except TransientError:
            return True
        return inst if inst is not None and inst.power_state is PowerState.RUNNING and inst.ip else False

    async def _create(self, ctx: Context, spec: ProxySpec, desired: Desired, plan: Plan, *,
                      previous: Ref | None) -> tuple[Instance, Ref | None, Plan]:
        target = Ref(desired.name, desired.resolved.zone, provider=spec.provider)
        self.prober.unwatch(ctx.probe_key)
        # Record the name first: from here on, deletion and GC know this instance may exist. A retry
        # after no capacity finds it recorded already: status keeps saying why it waits.
        state = self.memory.peek(ctx.key)
        waiting = (state.trouble is not None and state.trouble[0] == "QuotaExceeded") or state.importing
        if not (waiting and Ref.from_status(ctx.status.get("instance")) == target):
            await ctx.say(Verdict(PROVISIONING, plan.message, "Provisioning", instance=target,
                                         previous=previous))
        instance, previous = await actions.create(ctx, desired, target=target, previous=previous,
                                                 progress_interval=self.timings.progress_interval)
        ctx.log.info("instance created", instance=target.name, zone=target.zone)
        ctx.events.extend(plan.events)
        plan = self._plan(ctx, spec, target=target, instance=instance, had_ip=False, previous=previous)
        if plan.action is not Action.NONE:
            plan = Plan(phase=PROVISIONING, message=plan.message, ip=plan.ip, poll=True)
        return instance, previous, plan

    async def _settle(self, ctx: Context, spec: ProxySpec, plan: Plan, *, target: Ref, previous: Ref | None,
                      instance: Instance | None, delay: float | None) -> Result:
        """Write the plan's status; when to look again."""
        health = self.prober.health(ctx.own) if plan.probe else None
        endpoint = ProbeTarget(plan.ip, spec.port, spec.health).endpoint if plan.ip else None
        await ctx.say(Verdict(plan.phase, plan.message, reason_for(plan.phase, health), ip=plan.ip,
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
            return Result(requeue_after=rules.ip_wait_delay(state.ip_waits, poll=t.poll,
                                                            polls=t.ip_wait_polls, cap=t.ip_wait_max))
        state.ip_waits = 0
        return Result(requeue_after=self.timings.poll if plan.poll else None)

    # --- External ------------------------------------------------------------------------------------

    async def _external(self, ctx: Context, spec: ProxySpec) -> Result:
        for ref in (Ref.from_status(ctx.status.get("instance")),
                    Ref.from_status(ctx.status.get("previousInstance"))):
            if ref is not None:  # switched from Managed: its instances go
                await ctx.delete(spec.provider, ref)
        self.prober.unwatch(ProbeKey(ctx.key, replacement=True))
        assert spec.external_host is not None and spec.external_port is not None
        refused = external_refusal(self.prober.policies, host=spec.external_host, port=spec.external_port,
                                   auth=bool(spec.auth_secret))
        if refused is not None:
            raise SpecError(refused)
        target = ProbeTarget(spec.external_host, spec.external_port, spec.health, ctx.namespace,
                             spec.auth_secret, external=True)
        ctx.watch(ctx.own, target)
        status = compose(ctx.status, external_verdict(self.prober.health(ctx.own), host=spec.external_host,
                                                      target=target), generation=ctx.generation)
        remove_condition(status, COND_HOST)  # no host of ours is involved
        await ctx.write(status)
        return Result()

    # --- deletion ------------------------------------------------------------------------------------

    async def _finalize(self, ctx: Context) -> Result:
        if FINALIZER in (ctx.proxy["metadata"].get("finalizers") or []):
            await finalize(ctx)
        self.forget(ctx.key)
        return Result()
    # --- outcomes that are not a plan ----------------------------------------------------------------

    async def _pending(self, ctx: Context, message: str, *, instance: Ref | None,
                       previous: Ref | None) -> Result:
        self.prober.unwatch(ctx.probe_key)
        await ctx.say(Verdict(PENDING, message, "Waiting", instance=instance, previous=previous))
        return Result(requeue_after=self.timings.pending_retry)

    async def _in_progress(self, ctx: Context, e: InProgress) -> Result:
        """The provider works on it in the background (an image import): say how far it got, look again
        when it is done (and every `import_poll` meanwhile, for progress); no backoff, no Event."""
        state = self.memory[ctx.key]
        state.trouble = None
        state.importing = True
        try:
            await ctx.write(ctx.held(message=str(e), reason="Provisioning"))
        except ProxyGone:
            self.forget(ctx.key)
            return Result()
        return Result(requeue_after=self.timings.import_poll, wake_on=e.wake)

    async def _fail(self, ctx: Context, fail: Fail) -> Result:
        ctx.unwatch_all()
        if fail.event is not None:
            ctx.events.append(fail.event)
        self.memory[ctx.key].failed = (ctx.generation, ctx.providers_hash)
        ctx.log.info("proxy failed", message=fail.message)
        status = compose(ctx.status, Verdict(FAILED, fail.message, fail.reason,
                                             instance=Ref.from_status(ctx.status.get("instance")),
                                             previous=Ref.from_status(ctx.status.get("previousInstance"))),
                         generation=ctx.generation)
        status["failedProviders"] = providers_tag(ctx.providers_hash)
        await ctx.write(status)
        return Result()

    async def _trouble(self, ctx: Context, trouble: Trouble) -> Result:
        """A retryable error: keep the phase, say what went wrong, back off."""
        ctx.log.info("reconcile will be retried", reason=trouble.reason, message=trouble.message)
        state = self.memory[ctx.key]
        if trouble.event is not None and state.trouble != (trouble.reason, trouble.message):
            ctx.events.append(trouble.event)
        state.trouble = (trouble.reason, trouble.message)
        try:
            await ctx.write(ctx.held(message=trouble.message, reason=trouble.reason,
                                              unreachable=trouble.message if trouble.unreachable else None))
        except ProxyGone:
            self.forget(ctx.key)
            return Result()
        return Result(retry=trouble.retry)

    async def _unreachable(self, ctx: Context, err: TransientError, *, target: Ref) -> Result:
        """The host did not answer: say so, keep everything as it is; never recreate on this."""
        await ctx.write(ctx.held(message=f"zone {target.zone} unreachable: {err}",
                                          reason="HostUnreachable", unreachable=str(err)))
        return Result(retry=Retry.TRANSIENT)


__all__ = ["Reconciler", "Result", "Retry", "Timings", "get_condition"]
