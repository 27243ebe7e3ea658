"""Deleting a Proxy (it carries deletionTimestamp): its instances go, then our finalizer.

Which instance goes to which provider is decided first (`plan_deletion`, pure): an instance whose
providers-file entry is gone cannot be deleted, and dropping the finalizer then would leak its VM (a
`kubectl apply` that reset the providers ConfigMap is enough to get there). So the finalizer stays:
the Proxy is `DeleteBlocked` (a Warning Event naming the missing entry, slow backoff), and every change
of the providers file re-evaluates it (the manager enqueues every Proxy), so putting the entry back lets
the delete proceed. The way out for a VM already removed by hand is the documented `kubectl patch` that
drops the finalizer (`escape_hatch`). What the remaining entries can delete is deleted meanwhile.

A provider that refuses (PermanentError) keeps the finalizer too: outcome.py retries it slowly
(DeleteBlocked). An instance the host's metadata says is another Proxy's (NotOwned) is skipped with a
NotOwner Warning: nothing of this Proxy's is there to leak.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from egress_kvm.kube.interfaces import FINALIZER
from egress_kvm.providers.base import NotOwned, Provider

from .compose import Verdict
from .context import Context
from .desired import provider_for_ref
from .outcome import Retry, Trouble
from .plan import NORMAL, WARNING, Event
from .status import DELETING, Ref


@dataclass(frozen=True)
class Missing:
    """An instance whose providers-file entry is gone: `entry` is the name it was made by."""

    ref: Ref
    entry: str


@dataclass(frozen=True)
class DeletionPlan:
    delete: tuple[tuple[Ref, Provider], ...]  # each instance with the provider that made it
    missing: tuple[Missing, ...]  # non-empty: the finalizer stays (DeleteBlocked)


def plan_deletion(refs: Sequence[Ref], *, spec_provider: str,
                  providers: Mapping[str, Provider]) -> DeletionPlan:
    """Each instance status names goes to the entry that made it (`provider_for_ref`: never another
    entry's same-named host); one whose entry is gone is `missing`."""
    delete: list[tuple[Ref, Provider]] = []
    missing: list[Missing] = []
    for ref in refs:
        provider = provider_for_ref(providers, spec_provider, ref)
        if provider is None:
            missing.append(Missing(ref, ref.provider or spec_provider))
        else:
            delete.append((ref, provider))
    return DeletionPlan(tuple(delete), tuple(missing))


def escape_hatch(*, namespace: str, name: str) -> str:
    """The command that lets a blocked Proxy go (docs/operator.md, Troubleshooting): only for a VM that
    is already gone, since nothing deletes it afterwards."""
    return (f"kubectl patch px {name} -n {namespace} --type=json "
            """-p '[{"op":"remove","path":"/metadata/finalizers"}]'""")


def blocked(missing: Sequence[Missing], *, namespace: str, name: str) -> Trouble:
    """DeleteBlocked naming each missing entry and its instance, and both ways out."""
    entries = sorted({m.entry for m in missing})
    what = "; ".join(f"instance {m.ref.name} on {m.ref.zone or '?'} was made by provider {m.entry!r}"
                     for m in missing)
    message = (f"deletion blocked: provider {', '.join(repr(e) for e in entries)} "
               f"{'is' if len(entries) == 1 else 'are'} not in the providers file ({what}); the VM is "
               f"kept and the finalizer {FINALIZER} stays until the entry is back, then the delete "
               f"proceeds. If the VM was removed by hand, let the Proxy go with: "
               f"{escape_hatch(namespace=namespace, name=name)}")
    return Trouble("DeleteBlocked", message, Retry.QUOTA, Event(WARNING, "DeleteBlocked", message))


async def finalize(ctx: Context) -> Trouble | None:
    """Delete what status names; None once the finalizer is removed, or the DeleteBlocked trouble."""
    ctx.unwatch_all()
    instance = Ref.from_status(ctx.status.get("instance"))
    previous = Ref.from_status(ctx.status.get("previousInstance"))
    refs = [r for r in (instance, previous) if r is not None]
    if ctx.status.get("phase") != DELETING:  # a retry keeps the message that says why it is retried
        names = ", ".join(r.name for r in refs) or "(no instance)"
        await ctx.say(Verdict(DELETING, f"deleting {names}", "Deleting", instance=instance,
                              previous=previous))
    plan = plan_deletion(refs, spec_provider=str((ctx.proxy.get("spec") or {}).get("provider") or ""),
                         providers=ctx.providers)
    for ref, provider in plan.delete:
        try:
            await provider.delete(ref.name, ref.zone, owner_uid=ctx.uid)
        except NotOwned as e:  # not this Proxy's (status was wrong or forged): nothing of its own there
            await ctx.kube.record_event(ctx.proxy, type_=WARNING, reason="NotOwner", message=str(e))
            ctx.log.info("instance not deleted: not this Proxy's", instance=ref.name, error=str(e))
            continue
        ctx.log.info("instance deleted", instance=ref.name, zone=ref.zone)
        await ctx.kube.record_event(ctx.proxy, type_=NORMAL, reason="Deleted",
                                    message=f"deleted instance {ref.name} on {ref.zone}")
    if plan.missing:
        if plan.delete:  # status names only what is left: a retry neither deletes nor announces it again
            left = [m.ref for m in plan.missing]
            await ctx.say(Verdict(DELETING, f"deleting {', '.join(r.name for r in left)}", "Deleting",
                                  instance=left[0], previous=left[1] if len(left) > 1 else None))
        ctx.log.info("deletion blocked: provider entry missing; keeping the finalizer",
                     providers=sorted({m.entry for m in plan.missing}),
                     instances=[m.ref.name for m in plan.missing])
        meta = ctx.proxy["metadata"]
        return blocked(plan.missing, namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")))
    await ctx.kube.set_finalizer(ctx.proxy, present=False)
    return None
