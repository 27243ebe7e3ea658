"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules.

Only the leader runs the controller: two replicas reconciling the same Proxy would race on creating
and deleting VMs. The rules are client-go's leaderelection package, so a Go and a Python operator would
even respect each other's lease:
- A lease is free when its holderIdentity is empty (released) or when it has not changed for
  leaseDurationSeconds as measured on OUR clock since we first saw that record. The holder's renewTime is
  never compared with our clock, so skew between machines cannot make two leaders.
- Every write is a PUT carrying the resourceVersion we read; whoever loses the race gets 409 and tries
  again next round.
- The leader renews every retry_period; if it cannot renew for renew_deadline (< lease_duration; an
  attempt is cut off when renew_deadline runs out, however its requests are going) it stops leading
  before anyone else may take over. The process then exits (as controller-runtime does)
  and the kubelet restarts it as a candidate.
- On shutdown the leader releases the lease (empty holder), so the next replica takes over at once
  instead of after a lease duration.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import uuid
from dataclasses import dataclass

from prometheus_client import Gauge

from ..log import Logger, get_logger
from ..metrics import REGISTRY
from .api import micro_time
from .interfaces import Obj
from .k8s import ApiClient
from .rest import KubeApiError, request_json

DEFAULT_LEASE_NAME = "egress-kvm.egressproxies.io"
RECOVERABLE = (KubeApiError, OSError, TimeoutError)

LEADER_STATUS = Gauge("leader_election_master_status",
                      "1 while this process holds the leader lease.", ["name"], registry=REGISTRY)


class LeadershipLost(RuntimeError):
    """The lease could not be renewed within renew_deadline, or another process took it."""


def default_identity() -> str:
    """Unique per process: the pod name (hostname) plus a random suffix, as client-go advises."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    duration: int
    acquire_time: str
    renew_time: str
    transitions: int

    @classmethod
    def of(cls, lease: Obj) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(holder=str(spec.get("holderIdentity") or ""),
                   duration=int(spec.get("leaseDurationSeconds") or 0),
                   acquire_time=str(spec.get("acquireTime") or ""),
                   renew_time=str(spec.get("renewTime") or ""),
                   transitions=int(spec.get("leaseTransitions") or 0))


class LeaderElector:
    def __init__(self, api_client: ApiClient, *, namespace: str, name: str = DEFAULT_LEASE_NAME,
                 identity: str | None = None, lease_duration: float = 15.0, renew_deadline: float = 10.0,
                 retry_period: float = 2.0, logger: Logger | None = None) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError(f"leader election needs 0 < retry_period ({retry_period}) < renew_deadline "
                             f"({renew_deadline}) < lease_duration ({lease_duration})")
        self._api = api_client
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._log = (logger or get_logger("kube")).with_name("leader").with_values(
            lease=f"{namespace}/{name}", identity=self.identity)
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._last: Obj | None = None
        self._leading = False

    @property
    def is_leader(self) -> bool:
        return self._leading

    async def acquire(self) -> None:
        """Block until this process holds the lease."""
        self._log.info("attempting to acquire leader lease")
        while True:
            if await self._try_acquire_or_renew():
                self._set_leading(True)
                self._log.info("successfully acquired lease")
                return
            await asyncio.sleep(self.retry_period * (1 + 0.2 * random.random()))

    async def hold(self) -> None:
        """Renew until cancelled; raise LeadershipLost when renewing failed for renew_deadline."""
        loop = asyncio.get_running_loop()
        last_renew = loop.time()
        while True:
            await asyncio.sleep(self.retry_period)
            # The whole attempt (GET and PUT, each with its own request timeout) is bounded by what is
            # left of renew_deadline, as client-go does: otherwise a slow GET plus a hung PUT outlast
            # lease_duration and a standby takes the lease while we still reconcile.
            try:
                async with asyncio.timeout(max(0.0, self.renew_deadline - (loop.time() - last_renew))):
                    renewed = await self._try_acquire_or_renew()
            except TimeoutError:
                self._log.error(TimeoutError("renew attempt ran past renew_deadline"),
                                "leader lease request failed")
                renewed = False
            if renewed:
                last_renew = loop.time()
                continue
            if loop.time() - last_renew >= self.renew_deadline or self._held_by_other():
                self._set_leading(False)
                self._log.info("leader lease lost")
                raise LeadershipLost(f"lost leader lease {self.namespace}/{self.name}")

    async def release(self) -> None:
        """Give the lease up (only if we hold it), so a successor need not wait for it to expire."""
        if not self._leading:
            return
        self._set_leading(False)
        try:
            lease = await request_json(self._api, "GET", self._path)
            if LeaseRecord.of(lease).holder != self.identity:
                return
            spec = dict(lease.get("spec") or {})
            now = micro_time()
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=now, acquireTime=now)
            await request_json(self._api, "PUT", self._path, body={**lease, "spec": spec})
            self._log.info("released leader lease")
        except RECOVERABLE as exc:
            self._log.error(exc, "releasing leader lease failed; a successor waits for it to expire")

    # --- one round -----------------------------------------------------------------------------------

    async def _try_acquire_or_renew(self) -> bool:
        loop = asyncio.get_running_loop()
        now = micro_time()
        try:
            try:
                lease: Obj | None = await request_json(self._api, "GET", self._path,
                                                       timeout=self.renew_deadline)
            except KubeApiError as err:
                if not err.not_found:
                    raise
                lease = None
            if lease is None:
                await request_json(self._api, "POST", self._path.rsplit("/", 1)[0], body={
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(acquire_time=now, renew_time=now, transitions=0)},
                    timeout=self.renew_deadline)
                self._observe(LeaseRecord(self.identity, int(self.lease_duration), now, now, 0), loop.time())
                return True
            record = LeaseRecord.of(lease)
            if record != self._observed:
                self._observe(record, loop.time())
            self._last = lease
            if record.holder and record.holder != self.identity and not self._expired(loop.time()):
                return False
            if record.holder == self.identity:
                spec = self._spec(acquire_time=record.acquire_time or now, renew_time=now,
                                  transitions=record.transitions)
            else:
                spec = self._spec(acquire_time=now, renew_time=now, transitions=record.transitions + 1)
            updated = await request_json(self._api, "PUT", self._path, body={**lease, "spec": spec},
                                         timeout=self.renew_deadline)
            self._observe(LeaseRecord.of(updated), loop.time())
            return True
        except KubeApiError as err:
            if err.conflict:
                self._log.v(1).info("lease changed under us, retrying next round")
            else:
                self._log.error(err, "leader lease request failed")
            return False
        except RECOVERABLE as exc:
            self._log.error(exc, "leader lease request failed")
            return False

    def _spec(self, *, acquire_time: str, renew_time: str, transitions: int) -> Obj:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": round(self.lease_duration),
                "acquireTime": acquire_time, "renewTime": renew_time, "leaseTransitions": transitions}

    def _observe(self, record: LeaseRecord, at: float) -> None:
        self._observed = record
        self._observed_at = at

    def _expired(self, now: float) -> bool:
        if self._observed is None:
            return True
        duration = self._observed.duration or self.lease_duration
        return now >= self._observed_at + duration

    def _held_by_other(self) -> bool:
        return self._observed is not None and self._observed.holder not in ("", self.identity)

    def _set_leading(self, leading: bool) -> None:
        self._leading = leading
        LEADER_STATUS.labels(name=self.name).set(1 if leading else 0)


def lease_namespace(flag_value: str | None, *, pod_namespace: str | None,
                    fallback: str = "egress-proxies-operator-system") -> str:
    """--leader-election-namespace, else the pod's own namespace, else the deploy/ namespace."""
    return flag_value or pod_namespace or os.environ.get("POD_NAMESPACE") or fallback
