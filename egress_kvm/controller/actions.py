"""The provider-facing acts of a Managed reconcile: create (with the quota fallback), start, and the
hand-over once a replacement is Ready. Each carries out what a rule in plan.py decided."""

from __future__ import annotations

import time

from egress_kvm.providers.base import CreateRequest, Instance, Provider, QuotaError

from .compose import Verdict
from .context import Context
from .desired import Desired
from .plan import NORMAL, WARNING, Event, Plan, quota_fallback, restart_announced
from .status import PROVISIONING, Ref


async def create(ctx: Context, desired: Desired, *, target: Ref, previous: Ref | None,
                 progress_interval: float) -> tuple[Instance, Ref | None]:
    """Create `target`; returns the instance and what is left of `previous` (None if it had to go)."""
    request = CreateRequest(name=desired.name, owner_uid=ctx.proxy["metadata"].get("uid", ""),
                            placement=desired.resolved, user_data=desired.user_data,
                            owner_namespace=ctx.namespace, owner_name=ctx.key[1])
    last = 0.0

    async def progress(message: str) -> None:
        nonlocal last
        if time.monotonic() - last < progress_interval:
            return
        last = time.monotonic()
        try:
            await ctx.say(Verdict(PROVISIONING, f"creating instance {target.name}: {message}", "Provisioning",
                                  instance=target, previous=previous))
        except Exception as e:  # progress is cosmetic: never let it fail the create
            ctx.log.v(1).info("progress status not written", error=str(e))

    try:
        return await desired.provider.create(request, progress=progress), previous
    except QuotaError as e:
        if previous is None or not quota_fallback(previous=previous, target=target):
            raise
        # No room for both on this host: give up create-before-delete for this one replacement.
        await ctx.delete(target.provider, previous)
        gone, previous = previous, None  # progress() reads `previous`: it must not bring it back
        ctx.serving = None
        ctx.events.append(Event(WARNING, "ReplacingWithoutOverlap",
                                f"no capacity for {target.name} next to {gone.name} ({e}); deleted "
                                f"{gone.name} first"))
        await ctx.say(Verdict(PROVISIONING, f"deleted {gone.name} to make room; creating {target.name}",
                              "Provisioning", instance=target))
        return await desired.provider.create(request, progress=progress), None


async def start(ctx: Context, provider: Provider, plan: Plan, *, target: Ref) -> int:
    """Start a stopped instance; returns how many times in a row it has been started."""
    ctx.prober.unwatch(ctx.probe_key)
    await provider.start(target.name, target.zone)
    state = ctx.memory[ctx.key]
    state.restarts += 1
    ctx.log.info("instance started", instance=target.name, zone=target.zone, message=plan.message,
                 startsInARow=state.restarts)
    if restart_announced(state.restarts):
        suffix = f" (started {state.restarts} times since it was last Ready)" if state.restarts > 1 else ""
        ctx.events.extend(Event(e.type_, e.reason, e.message + suffix) for e in plan.events)
    return state.restarts


async def hand_over(ctx: Context, *, provider_name: str, target: Ref, previous: Ref) -> None:
    """The replacement is Ready: the replaced instance goes, and the replacement's probes, verdict and
    all, take over the Proxy's key. `provider_name`: the spec's (see Context.delete)."""
    probe_key = ctx.probe_key
    await ctx.delete(provider_name, previous)
    ctx.events.append(Event(NORMAL, "Replaced", f"instance {target.name} is Ready; deleted the "
                                                f"instance it replaced, {previous.name}"))
    if probe_key != ctx.own:
        new_target, verdict = ctx.prober.target(probe_key), ctx.prober.health(probe_key)
        ctx.prober.unwatch(probe_key)
        if new_target is not None:
            ctx.prober.watch(ctx.own, new_target, seed=verdict)
    ctx.serving = None
