"""Health probes: one asyncio task per Proxy, on the Proxy's own schedule, never holding a worker.

A probe is an HTTP GET of `healthCheck.url` through the proxy at the endpoint (with Proxy-Authorization
from the auth Secret when the Proxy names one), or, without a URL, a TCP connect to the endpoint. A proxy
becomes healthy after `successThreshold` consecutive successes and unhealthy after `failureThreshold`
consecutive failures: one good probe proves little while cloud-init is still restarting the proxy
(docs/lab.md, quirk 3), and one lost probe should not page anyone.

The prober owns no status: it keeps the latest `Health` per key and enqueues the key when the verdict
changes (and, when `refresh` is finite, every `refresh` seconds, so `status.lastProbeTime` stays
roughly current without a status write per probe: the operator's `--probe-time-refresh`). The
reconciler reads the verdict and decides the phase.

Credentials travel only in the Proxy-Authorization header, never in a URL we build. A user's
`healthCheck.url` may still carry some (userinfo, a signed query string): every message shows it through
`redact_url`, since probe messages end up in status, conditions, Events and logs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Callable, Hashable
from datetime import UTC, datetime
from typing import Generic, TypeVar

import aiohttp

from egress_kvm import metrics
from egress_kvm.kube.interfaces import KubeApi
from egress_kvm.log import Logger, get_logger
from egress_kvm.policy.connect import resolve_checked
from egress_kvm.policy.egress import Purpose, decide, explain, precheck
from egress_kvm.policy.phrases import failure_phrase
from egress_kvm.policy.policies import EgressPolicies
from egress_kvm.policy.secrets import SecretNotUsable, read_usable_secret
from egress_kvm.redact import redact_url

from .probe_rate import ProbeRate
from .verdict import Health, ProbeTarget, next_health

AUTH_CACHE_SECONDS = 30.0


class _ProbeFailed(Exception):
    pass


K = TypeVar("K", bound=Hashable)


class Prober(Generic[K]):
    """Probes per key `K` (the controller's: `ProbeKey`)."""

    def __init__(self, *, kube: KubeApi, on_change: Callable[[K], None], time_scale: float = 1.0,
                 refresh: float = 60.0, on_refresh: Callable[[K], None] | None = None,
                 logger: Logger | None = None, policies: EgressPolicies | None = None,
                 rate: ProbeRate | None = None) -> None:
        self._kube = kube
        self.policies = policies or EgressPolicies.from_config()  # replaced when the providers file changes
        self._rate = rate or ProbeRate()
        self._on_change = on_change
        # The periodic nudge that only refreshes lastProbeTime: the manager lets a backing-off key wait.
        self._on_refresh = on_refresh or on_change
        self._scale = time_scale
        self._refresh = refresh
        self._log = logger or get_logger("controller.health")
        self._targets: dict[K, ProbeTarget] = {}
        self._tasks: dict[K, asyncio.Task[None]] = {}
        self._running: set[asyncio.Task[None]] = set()  # includes cancelled ones not yet finished
        self._health: dict[K, Health] = {}
        self._auth_cache: dict[tuple[str, str], tuple[float, str | None, str | None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._died: BaseException | None = None
        self._closed = False

    # --- what the reconciler calls -------------------------------------------------------------------

    def watch(self, key: K, target: ProbeTarget, *, seed: Health | None = None) -> None:
        """Probe `target` for `key`; a new target (IP, port or check changed) starts over from `seed`
        (default: unknown). The reconciler seeds a verdict it trusts, e.g. the one a previous operator
        process recorded in status for the same endpoint, so a restart does not flap a Ready Proxy; the
        probes still run at once and `failureThreshold` real failures demote it."""
        if self._closed:
            return
        task = self._tasks.get(key)
        if self._targets.get(key) == target and task is not None and not task.done():
            return
        self.unwatch(key)
        self._targets[key] = target
        self._health[key] = seed or Health()
        task = asyncio.get_running_loop().create_task(self._loop(key, target), name=f"probe {key}")
        self._tasks[key] = task
        self._running.add(task)
        task.add_done_callback(self._task_done)

    def unwatch(self, key: K) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()
        self._targets.pop(key, None)
        self._health.pop(key, None)

    def health(self, key: K) -> Health | None:
        return self._health.get(key)

    def target(self, key: K) -> ProbeTarget | None:
        return self._targets.get(key)

    def keys(self) -> list[K]:
        return list(self._targets)

    def healthy(self) -> bool:
        return self._died is None

    async def close(self) -> None:
        self._closed = True
        for key in list(self._tasks):
            self.unwatch(key)
        for t in list(self._running):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- the probe loop ------------------------------------------------------------------------------

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._died = task.exception()
            self._log.error(task.exception(), "health probe loop died")

    async def _loop(self, key: K, target: ProbeTarget) -> None:
        log = self._log.with_values(proxy=str(key), endpoint=target.endpoint)
        last_notify = time.monotonic()
        while True:
            await self._rate.acquire()  # the global cap on probes per second (probe_rate.py)
            ok, message = await self.probe(target)
            metrics.PROBES_TOTAL.labels("success" if ok else "failure").inc()
            before = self._health.get(key, Health())
            after = next_health(before, ok=ok, message=message, at=datetime.now(UTC), check=target.check)
            if self._targets.get(key) != target:
                return  # retargeted or unwatched while probing
            self._health[key] = after
            log.v(1).info("health probe", ok=ok, message=message, successes=after.successes,
                          failures=after.failures)
            now = time.monotonic()
            if after.healthy != before.healthy or now - last_notify >= self._refresh * self._scale:
                last_notify = now
                if after.healthy != before.healthy:
                    log.info("health changed", healthy=after.healthy, message=message)
                    self._on_change(key)
                else:
                    self._on_refresh(key)
            await asyncio.sleep(target.check.interval_seconds * self._scale)

    async def probe(self, target: ProbeTarget) -> tuple[bool, str]:
        """One probe: (ok, a message that says what was tried and what happened)."""
        check = target.check
        what = f"GET {redact_url(check.url)} through {target.endpoint}" if check.url else \
            f"TCP connect to {target.host}:{target.port}"
        try:
            address = await self._address(target)
            if check.url is None:
                await self._tcp(target, address)
                return True, f"{what} succeeded"
            status = await self._http(target, address)
            return status < 400, f"{what}: HTTP {status}"
        except _ProbeFailed as e:
            return False, str(e)
        except TimeoutError:
            return False, f"{what}: timed out after {check.timeout_seconds}s"
        except Exception as e:  # any failure is a failed probe, never a dead loop
            # A fixed phrase: the library's text can quote the URL or the first bytes the peer sent.
            return False, f"{what}: {failure_phrase(e)}"

    async def _address(self, target: ProbeTarget) -> str:
        """Where to connect: for an External endpoint, the resolved address the egress policy admits
        (connected to as is, so the name cannot resolve elsewhere in between); a VM's IP as it is."""
        if not target.external:
            # The guest reports its own IP: one naming loopback, link-local or the metadata service
            # would turn the operator's probe into a request there.
            verdict = precheck(self.policies.vm_probe, host=target.host, port=target.port)
            if not verdict.allowed:
                raise _ProbeFailed(f"not probing {target.host}: "
                                   f"{explain(verdict, purpose=Purpose.VM_PROBE, shown='the VM address')}")
            return target.host
        async with asyncio.timeout(target.check.timeout_seconds):
            address = await resolve_checked(self.policies.external_probe, host=target.host, port=target.port)
        if target.auth_secret:
            verdict = decide(self.policies.external_auth, host=target.host, port=target.port, address=address)
            if not verdict.allowed:
                raise _ProbeFailed(
                    f"credentials withheld (spec.auth.secretRef): "
                    f"{explain(verdict, purpose=Purpose.EXTERNAL_AUTH, shown='this endpoint')}")
        return str(address)

    async def _tcp(self, target: ProbeTarget, address: str) -> None:
        async with asyncio.timeout(target.check.timeout_seconds):
            _, writer = await asyncio.open_connection(address, target.port)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    async def _http(self, target: ProbeTarget, address: str) -> int:
        auth = await self._auth(target)
        proxy = f"http://[{address}]:{target.port}" if ":" in address else f"http://{address}:{target.port}"
        if self._session is None:
            # A fresh connection per probe (force_close): a kept-alive socket could hide a dead listener.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                                  trust_env=False)
        timeout = aiohttp.ClientTimeout(total=target.check.timeout_seconds)
        url = target.check.url or ""
        auth_header = {"Proxy-Authorization": auth} if auth else None
        # Plain http goes to the proxy as an absolute-form request: the header rides on that request. For
        # https only the CONNECT carries it; on the request it would travel through the tunnel to the site.
        https = url.startswith("https://")
        async with self._session.get(url, proxy=proxy, timeout=timeout, allow_redirects=False,
                                     headers=None if https else auth_header,
                                     proxy_headers=auth_header if https else None) as resp:
            await resp.content.read(64 * 1024)  # enough to see it answer; a huge page is not our business
            return resp.status

    async def _auth(self, target: ProbeTarget) -> str | None:
        """The Proxy-Authorization value from the auth Secret (cached briefly: one read per probe would
        cost the API server a request every interval per Proxy)."""
        if not target.auth_secret:
            return None
        cache_key = (target.namespace, target.auth_secret)
        cached = self._auth_cache.get(cache_key)
        if cached is not None and time.monotonic() - cached[0] < AUTH_CACHE_SECONDS * self._scale:
            auth, refusal = cached[1], cached[2]
        else:
            auth, refusal = None, None
            try:
                data = await read_usable_secret(self._kube, namespace=target.namespace,
                                                name=target.auth_secret, field="spec.auth.secretRef")
            except SecretNotUsable as e:
                refusal = str(e)
            else:
                if data is not None and "username" in data and "password" in data:
                    creds = data["username"] + b":" + data["password"]
                    auth = "Basic " + base64.b64encode(creds).decode("ascii")
                else:
                    refusal = (f"auth Secret {target.namespace}/{target.auth_secret} is missing or lacks "
                               "keys username and password (spec.auth.secretRef)")
            self._auth_cache[cache_key] = (time.monotonic(), auth, refusal)
        if auth is None:
            raise _ProbeFailed(refusal or "no credentials (spec.auth.secretRef)")
        return auth

