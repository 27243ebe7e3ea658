"""One reconcile pass: the Proxy as last read or written, what it has observed so far, and its writes.

Status is written whole (composed by compose.py), with the transition Events (plan.py) and the ones the
pass gathered, and the phase written is remembered for the gauge. `generation` and the providers are
frozen when the pass starts: `proxy` is replaced by whatever a write returns, which after a conflict may
carry a newer spec this pass never evaluated, and a verdict must name the inputs it was computed from.

A routine pass may start from the informer's cache (`cached`, see the reconciler): such a pass never
writes, records, deletes or changes what the reconciler remembers; it raises `FreshReadNeeded` instead,
and the reconciler starts over from a fresh read of the Proxy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from egress_kvm.kube.interfaces import Key, KubeApi, Obj
from egress_kvm.log import Logger
from egress_kvm.providers.base import NotOwned, Provider

from .compose import Serving, Verdict, cap_messages, compose, held, worth_writing
from .desired import provider_for_ref
from .health import Prober
from .memory import Memory
from .plan import NORMAL, WARNING, Event, transition_events
from .status import Ref
from .verdict import ProbeKey, ProbeTarget


class FreshReadNeeded(Exception):
    """A pass started from the informer's cache is about to act (a status write, an Event, a provider call
    that changes something, a delete) or to end in anything but a plain result: nothing is done on the
    strength of the cache alone, the pass starts over from a fresh read. The message says what it wanted."""


@dataclass
class Context:
    key: Key
    proxy: Obj
    log: Logger
    kube: KubeApi
    prober: Prober[ProbeKey]
    memory: Memory
    providers: Mapping[str, Provider] = field(default_factory=dict)
    providers_hash: str = ""
    events: list[Event] = field(default_factory=list)  # recorded with the next status write
    routine: bool = False  # queued only by the clock: a settled Proxy's probes may vouch for its VM
    probe_refresh: float = 0.0  # a newer lastProbeTime alone is written once the stored one is this old
    cached: bool = False  # `proxy` is the informer's copy, not a fresh read: acting raises FreshReadNeeded
    target: Ref | None = None  # the desired instance, once this pass knows it (a Managed Proxy)
    found_unreachable: bool = False  # the pass ended holding status because the host did not answer
    generation: int = field(init=False)

    def __post_init__(self) -> None:
        self.generation = int(self.proxy["metadata"].get("generation") or 0)

    @property
    def status(self) -> Obj:
        return self.proxy.get("status") or {}

    @property
    def uid(self) -> str:
        """The Proxy's uid: every provider call names it, so the host refuses another owner's instance."""
        return str(self.proxy["metadata"].get("uid") or "")

    @property
    def namespace(self) -> str:
        return str(self.proxy["metadata"].get("namespace", ""))

    @property
    def own(self) -> ProbeKey:
        return ProbeKey(self.key)

    # --- probes --------------------------------------------------------------------------------------

    def unwatch_all(self) -> None:
        self.prober.unwatch(ProbeKey(self.key))
        self.prober.unwatch(ProbeKey(self.key, replacement=True))

    # --- acting --------------------------------------------------------------------------------------

    def must_read(self, what: str) -> None:
        """Before an act that changes something: a pass from the cache starts over from a fresh read."""
        if self.cached:
            raise FreshReadNeeded(what)

    async def delete(self, provider_name: str, ref: Ref) -> None:
        """Delete an instance status names (`provider_name`: the spec's, for status that lacks one)."""
        self.must_read(f"delete instance {ref.name}")
        provider = provider_for_ref(self.providers, provider_name, ref)
        if provider is None:
            self.events.append(Event(WARNING, "ProviderMissing",
                                     f"no provider serves zone {ref.zone}: instance {ref.name} not deleted"))
            return
        try:
            await provider.delete(ref.name, ref.zone, owner_uid=self.uid)
        except NotOwned as e:  # status named another Proxy's instance: leave it alone
            self.events.append(Event(WARNING, "NotOwner", str(e)))
            self.log.info("instance not deleted: not this Proxy's", instance=ref.name, error=str(e))
            return
        self.log.info("instance deleted", instance=ref.name, zone=ref.zone)
        self.events.append(Event(NORMAL, "Deleted", f"deleted instance {ref.name} on {ref.zone}"))

    # --- writing -------------------------------------------------------------------------------------

    def held(self, *, message: str, reason: str, unreachable: str | None = None) -> Obj:
        """The status as it is with a new message (nothing observed): see compose.held."""
        health = self.prober.health(self.own)
        return held(self.status, message=message, reason=reason, generation=self.generation, health=health,
                    unreachable=unreachable)

    async def say(self, verdict: Verdict, *, serving: ProbeTarget | None = None) -> None:
        """Write `verdict` composed; `serving`: the replaced instance while it still serves (compose.py)."""
        backing = Serving(serving, self.prober.health(self.own)) if serving is not None else None
        await self.write(compose(self.status, verdict, generation=self.generation, serving=backing))

    def writing(self, status: Obj) -> str | None:
        """What `write(status)` would change beyond the cache's copy (None: nothing): write status, record
        an Event, or move the phase gauge, which a status behind the server may have wrong. Leaves `status`
        as it is."""
        capped = copy.deepcopy(status)
        cap_messages(capped)
        if worth_writing(self.status, capped, now=datetime.now(UTC), refresh=self.probe_refresh):
            return "write status"
        if self.events:  # a phase change (a transition Event) is a status worth writing too
            return "record an Event"
        return "remember the phase" if self.memory.phase(self.key) != status["phase"] else None

    async def write(self, status: Obj) -> None:
        if self.cached and (what := self.writing(status)) is not None:
            self.must_read(what)
        cap_messages(status)
        old = self.status
        events = [*self.events, *transition_events(
            old_phase=old.get("phase"), new_phase=status["phase"], message=status.get("message", ""),
            endpoint=status.get("endpoint"), ip=status.get("ip"))]
        worth = worth_writing(old, status, now=datetime.now(UTC), refresh=self.probe_refresh)
        self.events.clear()
        if worth:
            self.proxy = await self.kube.update_proxy_status(self.proxy, status)
            if old.get("phase") != status["phase"]:
                self.log.info("phase changed", old=old.get("phase"), new=status["phase"],
                              message=status.get("message"))
        self.memory.set_phase(self.key, status["phase"])
        for ev in events:
            await self.kube.record_event(self.proxy, type_=ev.type_, reason=ev.reason, message=ev.message)
