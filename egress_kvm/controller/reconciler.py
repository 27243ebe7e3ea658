"""The reconciler: one Proxy key in; observe (the Proxy fresh from the API server, its instances, the
probe verdicts, `memory`), plan (planner.py, pure), act (actions.py), and write what the plan composed.
How it fits the operator is docs/architecture.md. A routine pass starts from the informer's cache instead
and reads fresh only to act (cached.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from egress_kvm.kube.interfaces import FINALIZER, Key, KubeApi, Obj, ProxyGone, ProxyStore, SpecChanged
from egress_kvm.log import Logger, get_logger
from egress_kvm.providers.base import InProgress, Provider

from . import actions
from .cached import cached_copy, check_step
from .compose import Verdict, compose, providers_tag
from .context import Context, FreshReadNeeded
from .deletion import finalize
from .desired import Desired, DesiredKey, Waiting, desired_instance, provider_for, unserved
from .health import Prober
from .memory import Memory
from .outcome import Fail, Result, Retry, Trouble, outcome_for
from .planner import (
    MAX_ROUNDS,
    End,
    Importing,
    Observed,
    Planned,
    Probe,
    Probes,
    Timings,
    Unreachable,
    learn,
    plan_external,
    plan_managed,
    stored_probe,
)
from .proxyspec import EXTERNAL, ProxySpec, parse_spec
from .status import FAILED, Ref, get_condition
from .verdict import ProbeKey


class Reconciler:
    def __init__(self, *, kube: KubeApi, prober: Prober[ProbeKey], providers: Mapping[str, Provider],
                 providers_hash: str = "", timings: Timings | None = None,
                 logger: Logger | None = None, probe_refresh: float = 0.0,
                 cache: ProxyStore | None = None) -> None:
        """`probe_refresh`: seconds before a newer lastProbeTime alone is worth a status write. `cache`: the
        informer's store, which a routine pass starts from (cached.py); None: always read fresh."""
        self.kube = kube
        self.cache = cache
        self.probe_refresh = probe_refresh
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

    def phase_counts(self) -> Mapping[str, int]:
        return self.memory.phase_counts()

    # --- entry point: errors become outcomes ---------------------------------------------------------

    async def reconcile(self, key: Key, *, routine: bool = False) -> Result:
        """`routine`: queued only by the clock (a resync, a probe refresh); see planner.vouched. Such a
        pass starts from the cache and reads fresh only to act (cached.py)."""
        cached = cached_copy(self.cache, key) if routine else None
        if cached is not None:
            try:
                return await self._pass(key, cached, routine=True, cached=True)
            except FreshReadNeeded as e:
                self.log.v(1).info("a routine pass must act; reading the Proxy fresh",
                                   proxy=f"{key[0]}/{key[1]}", wants=str(e))
        proxy = await self.kube.get_proxy(*key)
        if proxy is None:
            self.forget(key)
            return Result()
        return await self._pass(key, proxy, routine=routine, cached=False)

    async def _pass(self, key: Key, proxy: Obj, *, routine: bool, cached: bool) -> Result:
        ctx = Context(key=key, proxy=proxy, log=self.log.with_values(proxy=f"{key[0]}/{key[1]}"),
                      kube=self.kube, prober=self.prober, memory=self.memory, providers=self.providers,
                      providers_hash=self.providers_hash, routine=routine,
                      probe_refresh=self.probe_refresh, cached=cached)
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
        if ctx.cached:
            return await self._cached_outcome(ctx)
        try:
            result = await self._reconcile(ctx)
        except ProxyGone:
            if await self.kube.get_proxy(*key) is not None:
                raise  # deleted and recreated under the same name: a new object, reconciled afresh
            self.forget(key)
            return Result()
        except InProgress as e:  # not from a create (that one is planned): answered the same way
            return await self._in_progress(ctx, Importing(str(e), e.wake))
        except Exception as e:
            outcome = outcome_for(e, deleting=bool(ctx.proxy["metadata"].get("deletionTimestamp")))
            if outcome is None:
                raise
            return await (self._fail(ctx, outcome) if isinstance(outcome, Fail) else
                          self._trouble(ctx, outcome))
        if not isinstance(result, Result):  # planned: as if an act had raised it
            return await self._planned(ctx, result)
        state = self.memory[key] if ctx.found_unreachable else self.memory.get(key)
        if state is not None:
            state.trouble = None  # it got through: a trouble seen again later is news
            state.importing = False
            state.waits_on = self._host_of(ctx) if ctx.found_unreachable else None
        return result

    async def _cached_outcome(self, ctx: Context) -> Result:
        """A pass from the cache ends in a plain result or starts over fresh: an error, a trouble, a
        failure or an import in progress are acted on (status, Events, memory, backoff) by a fresh pass.
        So is a pass after one that ended in a trouble or an import: getting through forgets those."""
        state = self.memory.peek(ctx.key)
        if state.trouble is not None or state.importing:
            raise FreshReadNeeded("forget the last pass's trouble or import")
        try:
            result = await self._reconcile(ctx)
        except FreshReadNeeded:
            raise
        except Exception as e:
            raise FreshReadNeeded(f"the pass ended in {type(e).__name__}") from e
        if not isinstance(result, Result):
            raise FreshReadNeeded(f"the pass ended in {type(result).__name__}")
        return result

    async def _reconcile(self, ctx: Context) -> Result | Planned:
        meta = ctx.proxy["metadata"]
        if meta.get("deletionTimestamp"):
            ctx.must_read("finalize")
            return await self._finalize(ctx)
        if FINALIZER not in (meta.get("finalizers") or []):
            ctx.must_read("add the finalizer")
            ctx.proxy = await self.kube.set_finalizer(ctx.proxy, present=True)
        if ctx.status.get("phase") == FAILED and (
                self.memory.peek(ctx.key).failed == (ctx.generation, ctx.providers_hash)
                or (ctx.status.get("observedGeneration") == ctx.generation
                    and ctx.status.get("failedProviders") == providers_tag(ctx.providers_hash))):
            # Failed stays until the spec or the providers file changes. The verdict is in status too,
            # so a restart or a new leader does not retry it (a bad image would be downloaded again).
            # Nothing is written, but the Proxy is Failed all the same: counted (the phase gauge), as
            # every pass that sees a Proxy counts its phase.
            if self.memory.phase(ctx.key) != FAILED:
                ctx.must_read("remember the phase")
                self.memory.set_phase(ctx.key, FAILED)
            return Result()
        if self.memory.peek(ctx.key).failed is not None:  # a verdict about other inputs: re-decided
            ctx.must_read("forget a Failed verdict")  # the cache's status may not show it yet
            self.memory[ctx.key].failed = None
        spec = parse_spec(ctx.proxy.get("spec"))
        if spec.mode == EXTERNAL:
            return await self._external(ctx, spec)
        return await self._managed(ctx, spec)

    # --- Managed: observe, plan, act -----------------------------------------------------------------

    async def _managed(self, ctx: Context, spec: ProxySpec) -> Result | Planned:
        """Gather the inputs, then plan and act in rounds (planner.py) until the plan says how it ends."""
        provider = provider_for(spec, ctx.providers)
        desired: Desired | None = None
        waiting: str | None = None
        try:
            desired = await self._desired(ctx, spec)
        except Waiting as e:
            waiting = str(e)
            if ctx.status.get("instance"):
                # The instance exists and its user-data is baked in: keep looking after it meanwhile.
                ctx.log.info("cannot compute the desired instance; keeping the current one", reason=waiting)
        obs = Observed(key=ctx.key, spec=spec, status=ctx.status, generation=ctx.generation,
                       namespace=ctx.namespace, waiting=waiting, routine=ctx.routine,
                       unserved=unserved(ctx.providers, spec.provider, ctx.status),
                       desired=Ref(desired.name, desired.resolved.zone, provider=spec.provider)
                       if desired else None,
                       target_connected=desired is not None
                       and desired.provider.connected(desired.resolved.zone))
        ctx.target = obs.desired
        for _ in range(MAX_ROUNDS):
            obs = replace(obs, status=ctx.status, probes=self._probes(ctx.key),
                          memory=replace(self.memory.peek(ctx.key)))
            step = plan_managed(obs, self.timings)
            check_step(ctx, step.actions)
            for act in step.actions:
                obs = learn(obs, act, await actions.run(
                    ctx, act, spec_provider_name=spec.provider, provider=provider, desired=desired,
                    progress_interval=self.timings.progress_interval))
            if step.end is not None:
                return await self._end(ctx, step.end)
        raise RuntimeError(f"no plan settled in {MAX_ROUNDS} rounds")  # a planner bug: retried as an error

    async def _desired(self, ctx: Context, spec: ProxySpec) -> Desired:
        """desired_instance, or, for a pass from the cache (which holds no inline user-data: kube/trim.py),
        the one a fresh pass computed from the same inputs (memory.KeyState.desired)."""
        if spec.user_data_ref is not None:  # from a Secret: read (and named) afresh on every pass
            return await desired_instance(proxy=ctx.proxy, spec=spec, providers=ctx.providers, kube=self.kube)
        inputs = DesiredKey(uid=ctx.uid, generation=ctx.generation, providers_hash=ctx.providers_hash,
                            instance=(ctx.status.get("instance") or {}).get("name"))
        if ctx.cached:
            known = self.memory.peek(ctx.key).desired
            if known is None or known[0] != inputs:
                raise FreshReadNeeded("the desired instance, with inline user-data not in the cache")
            return known[1]
        desired = await desired_instance(proxy=ctx.proxy, spec=spec, providers=ctx.providers, kube=self.kube)
        self.memory[ctx.key].desired = (inputs, desired.without_user_data())
        return desired

    def _probes(self, key: Key) -> Probes:
        by_key = {}
        for probe_key in (ProbeKey(key), ProbeKey(key, replacement=True)):
            target = self.prober.target(probe_key)
            if target is not None:
                by_key[probe_key] = Probe(target, self.prober.health(probe_key))
        return Probes(by_key)

    async def _end(self, ctx: Context, end: End) -> Result | Planned:
        if isinstance(end, Unreachable):
            # The host did not answer: say so, keep everything as it is; never recreate on this.
            ctx.found_unreachable = True
            await self._hold(ctx, message=end.message, reason="HostUnreachable", unreachable=end.error)
            return Result(retry=Retry.TRANSIENT)
        return end  # a Trouble or a Fail: as if an act had raised it (_outcome)

    # --- External ------------------------------------------------------------------------------------

    async def _external(self, ctx: Context, spec: ProxySpec) -> Result | Planned:
        obs = Observed(key=ctx.key, spec=spec, status=ctx.status, generation=ctx.generation, desired=None,
                       namespace=ctx.namespace, probes=self._probes(ctx.key),
                       unserved=unserved(ctx.providers, spec.provider, ctx.status))
        step = plan_external(obs, self.prober.policies)
        check_step(ctx, step.actions)
        for act in step.actions:
            await actions.run(ctx, act, spec_provider_name=spec.provider, provider=None, desired=None,
                              progress_interval=self.timings.progress_interval)
        assert step.end is not None
        return await self._end(ctx, step.end)

    # --- deletion ------------------------------------------------------------------------------------

    async def _finalize(self, ctx: Context) -> Result | Planned:
        if FINALIZER in (ctx.proxy["metadata"].get("finalizers") or []):
            blocked = await finalize(ctx)
            if blocked is not None:  # a provider entry is missing: the finalizer stays (deletion.py)
                return blocked
        self.forget(ctx.key)
        return Result()
    # --- outcomes that are not a plan ----------------------------------------------------------------

    async def _planned(self, ctx: Context, end: Planned) -> Result:
        if isinstance(end, Fail):  # an External endpoint the policy refuses
            return await self._fail(ctx, end)
        if isinstance(end, Trouble):  # a create found no capacity
            return await self._trouble(ctx, end)
        return await self._in_progress(ctx, end)  # a create waits on a background image import

    async def _in_progress(self, ctx: Context, importing: Importing) -> Result:
        """The provider works on it in the background (an image import): say how far it got, look again
        when it is done (and every `import_poll` meanwhile, for progress); no backoff, no Event."""
        state = self.memory[ctx.key]
        state.trouble = None
        state.importing = True
        state.waits_on = None  # the host answered
        try:
            await self._hold(ctx, message=importing.message, reason="Provisioning")
        except ProxyGone:
            self.forget(ctx.key)
            return Result()
        return Result(requeue_after=self.timings.import_poll, wake_on=importing.wake)

    async def _hold(self, ctx: Context, *, message: str, reason: str, unreachable: str | None = None) -> None:
        """Nothing observed: the status as it is with `message` (compose.held), the stored endpoint
        probed first if this process is not probing it yet (planner.stored_probe)."""
        watch = stored_probe(ctx.status, ctx.proxy.get("spec"), key=ctx.key, namespace=ctx.namespace,
                             probes=self._probes(ctx.key))
        if watch is not None:
            await actions.run(ctx, watch, spec_provider_name="", provider=None, desired=None,
                              progress_interval=self.timings.progress_interval)
        await ctx.write(ctx.held(message=message, reason=reason, unreachable=unreachable))

    async def _fail(self, ctx: Context, fail: Fail) -> Result:
        ctx.unwatch_all()
        if fail.event is not None:
            ctx.events.append(fail.event)
        state = self.memory[ctx.key]
        state.failed = (ctx.generation, ctx.providers_hash)
        state.waits_on = None  # waits on nothing: a Failed Proxy is retried only once its inputs change
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
        state.waits_on = self._host_of(ctx) if trouble.unreachable else None
        try:
            await self._hold(ctx, message=trouble.message, reason=trouble.reason,
                             unreachable=trouble.message if trouble.unreachable else None)
        except ProxyGone:
            self.forget(ctx.key)
            return Result()
        return Result(retry=trouble.retry)

    @staticmethod
    def _host_of(ctx: Context) -> tuple[str, str] | None:
        """The host a pass that found it unreachable waits on (KeyState.waits_on): its return wakes it."""
        target = ctx.target
        return (target.provider, target.zone) if target is not None and target.provider else None


__all__ = ["Reconciler", "Result", "Retry", "Timings", "get_condition"]
