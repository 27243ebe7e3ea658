"""Running the actions planner.py returns, one at a time, each as written: nothing here decides. An action
whose outcome the planner needs (a look, a create) returns it, for the next round's observation."""

from __future__ import annotations

import time

from egress_kvm.providers.base import (
    CreateRequest,
    HostUnreachable,
    InProgress,
    Instance,
    Provider,
    QuotaError,
    Readdresses,
    TransientError,
)

from .compose import Verdict
from .context import Context
from .desired import Desired, provider_for_ref
from .plan import create_events
from .planner import (
    Act,
    Create,
    Delete,
    HandOver,
    Look,
    Looked,
    NoProvider,
    Outcome,
    Readdress,
    Record,
    Remember,
    Start,
    Unanswered,
    Unwatch,
    Watch,
    WriteStatus,
)
from .status import PROVISIONING


def acting(ctx: Context, act: Act) -> str | None:
    """What `act` would do beyond reading the cache: a write, an Event, a provider call (a look included),
    a delete, a change of the probes or of what the reconciler remembers (KeyState); None for the acts
    that change nothing: a watch or unwatch that leaves the probes as they are, a status write `ctx.write`
    would skip with the phase remembered as it is, a Remember of what is remembered already. A pass from
    the informer's cache reads fresh before any act that is not None here. A look too: a pass that looks
    was not settled (planner.vouched); read fresh first, it neither looks twice when it then acts nor
    decides (or counts, KeyState) from a status the cache may not have caught up with."""
    if isinstance(act, Look):
        return f"look at instance {act.ref.name}"
    if isinstance(act, Delete):
        return f"delete instance {act.ref.name}"
    if isinstance(act, Create | Start | Readdress):
        return f"{type(act).__name__.lower()} instance {act.target.name}"
    if isinstance(act, Record):
        return f"record a {act.event.reason} Event"
    if isinstance(act, WriteStatus):
        return ctx.writing(act.status)
    if isinstance(act, Watch):
        return None if ctx.prober.target(act.key) == act.target else "watch a new probe target"
    if isinstance(act, Unwatch):
        return None if ctx.prober.target(act.key) is None else "stop a probe"
    if isinstance(act, HandOver):
        return "hand the probes over"
    if isinstance(act, Remember):
        state = ctx.memory.peek(ctx.key)
        changed = [name for name, new, old in (("restarts", act.restarts, state.restarts),
                                               ("ip_waits", act.ip_waits, state.ip_waits),
                                               ("stranded_looks", act.stranded_looks, state.stranded_looks))
                   if new is not None and new != old]
        return f"remember {', '.join(changed)}" if changed else None
    return None


async def run(ctx: Context, act: Act, *, spec_provider_name: str, provider: Provider | None,
              desired: Desired | None, progress_interval: float) -> Outcome:
    """Carry out `act`; returns what it observed (None for the acts that observe nothing)."""
    if ctx.cached:  # the reconciler checks a whole step first (reconciler.py); this is the last line
        what = acting(ctx, act)
        if what is not None:
            ctx.must_read(what)
        if isinstance(act, Remember):
            return None  # remembered already (acting): no KeyState made for a key forgotten meanwhile
    if isinstance(act, Look):
        return await look(ctx, act, spec_provider_name=spec_provider_name, provider=provider)
    if isinstance(act, Create):
        assert desired is not None and desired.name == act.target.name
        return await create(ctx, act, desired, progress_interval=progress_interval)
    if isinstance(act, Start):
        assert provider is not None
        await provider.start(act.target.name, act.target.zone)
        ctx.log.info("instance started", instance=act.target.name, zone=act.target.zone,
                     startsInARow=ctx.memory[ctx.key].restarts + 1)
    elif isinstance(act, Readdress):
        assert provider is not None
        if isinstance(provider, Readdresses):
            await provider.readdress(act.target.name, act.target.zone)
            ctx.log.info("instance readdressed", instance=act.target.name, zone=act.target.zone)
        else:  # nothing to do but wait: the instance stays Provisioning, polled
            ctx.log.info("instance stranded; its provider cannot readdress it", instance=act.target.name,
                         zone=act.target.zone)
    elif isinstance(act, Delete):
        await ctx.delete(spec_provider_name, act.ref)
    elif isinstance(act, Watch):
        ctx.prober.watch(act.key, act.target, seed=act.seed)
    elif isinstance(act, Unwatch):
        ctx.prober.unwatch(act.key)
    elif isinstance(act, HandOver):
        target, verdict = ctx.prober.target(act.source), ctx.prober.health(act.source)
        ctx.prober.unwatch(act.source)
        if target is not None:
            ctx.prober.watch(act.dest, target, seed=verdict)
    elif isinstance(act, Record):
        ctx.events.append(act.event)
    elif isinstance(act, WriteStatus):
        await ctx.write(act.status)
    elif isinstance(act, Remember):
        state = ctx.memory[ctx.key]
        state.restarts = state.restarts if act.restarts is None else act.restarts
        state.ip_waits = state.ip_waits if act.ip_waits is None else act.ip_waits
        state.stranded_looks = state.stranded_looks if act.stranded_looks is None else act.stranded_looks
    return None


async def look(ctx: Context, act: Look, *, spec_provider_name: str, provider: Provider | None) -> Looked:
    chosen = provider if act.spec_provider else provider_for_ref(ctx.providers, spec_provider_name, act.ref)
    if chosen is None:
        return NoProvider()
    try:
        return await chosen.get(act.ref.name, act.ref.zone, owner_uid=ctx.uid)
    except TransientError as e:
        return Unanswered(e, unreachable=isinstance(e, HostUnreachable))


async def create(ctx: Context, act: Create, desired: Desired, *,
                 progress_interval: float) -> Instance | QuotaError | InProgress:
    """Create the target; no capacity (quota_fallback) and a background image import are outcomes the
    planner decides about."""
    target = act.target
    if desired.user_data is None:  # a pass from the cache reads fresh before acting (Context.must_read)
        raise RuntimeError(f"create of {target.name} without its user-data loaded")
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
                                  instance=target, previous=act.previous), serving=act.serving)
        except Exception as e:  # progress is cosmetic: never let it fail the create
            ctx.log.v(1).info("progress status not written", error=str(e))

    try:
        instance = await desired.provider.create(request, progress=progress)
    except (QuotaError, InProgress) as e:
        return e
    ctx.log.info("instance found and kept" if instance.existed else "instance created", instance=target.name,
                 zone=target.zone)
    ctx.events.extend(create_events(act.events, target=target, existed=instance.existed))
    return instance

