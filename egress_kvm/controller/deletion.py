"""Deleting a Proxy (it carries deletionTimestamp): its instances go, then our finalizer.

A provider entry that is gone from the providers file cannot delete what it made: that is said in a
Warning Event and the finalizer goes anyway (keeping it would block the Proxy forever). A provider that
refuses (PermanentError) keeps the finalizer: outcome.py retries it slowly (DeleteBlocked). An instance
the host's metadata says is another Proxy's (NotOwned) is skipped with a NotOwner Warning: nothing of
this Proxy's is there to leak.
"""

from __future__ import annotations

from egress_kvm.providers.base import NotOwned

from .compose import Verdict
from .context import Context
from .desired import provider_for_ref
from .plan import NORMAL, WARNING
from .status import DELETING, Ref


async def finalize(ctx: Context) -> None:
    ctx.unwatch_all()
    instance = Ref.from_status(ctx.status.get("instance"))
    previous = Ref.from_status(ctx.status.get("previousInstance"))
    refs = [r for r in (instance, previous) if r is not None]
    if ctx.status.get("phase") != DELETING:  # a retry keeps the message that says why it is retried
        names = ", ".join(r.name for r in refs) or "(no instance)"
        await ctx.say(Verdict(DELETING, f"deleting {names}", "Deleting", instance=instance,
                              previous=previous))
    provider_name = str((ctx.proxy.get("spec") or {}).get("provider") or "")
    for ref in refs:
        provider = provider_for_ref(ctx.providers, provider_name, ref)
        if provider is None:
            missing = ref.provider or provider_name  # the entry that made it, where status says
            await ctx.kube.record_event(
                ctx.proxy, type_=WARNING, reason="ProviderMissing",
                message=f"provider {missing!r} is not in the providers file: instance {ref.name} "
                        f"on {ref.zone} was not deleted; removing the finalizer anyway")
            ctx.log.info("provider gone; not deleting instance", instance=ref.name, zone=ref.zone,
                         provider=missing)
            continue
        try:
            await provider.delete(ref.name, ref.zone, owner_uid=ctx.uid)
        except NotOwned as e:  # not this Proxy's (status was wrong or forged): nothing of its own there
            await ctx.kube.record_event(ctx.proxy, type_=WARNING, reason="NotOwner", message=str(e))
            ctx.log.info("instance not deleted: not this Proxy's", instance=ref.name, error=str(e))
            continue
        ctx.log.info("instance deleted", instance=ref.name, zone=ref.zone)
        await ctx.kube.record_event(ctx.proxy, type_=NORMAL, reason="Deleted",
                                    message=f"deleted instance {ref.name} on {ref.zone}")
    await ctx.kube.set_finalizer(ctx.proxy, present=False)
