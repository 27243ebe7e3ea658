"""Leader election's renew deadline, with the Lease requests scripted (slow and hung) in-process."""

from __future__ import annotations

import asyncio

import pytest

from egress_kvm.kube.leader import LeaderElector, LeadershipLost

pytestmark = pytest.mark.timeout(30)
NS = "egress-proxies-operator-system"


async def test_a_renew_attempt_is_cut_off_at_renew_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow GET followed by a hung PUT: each within its own request timeout, together past the lease
    duration. The renew attempt as a whole is bounded by renew_deadline, so the PUT is abandoned (not
    waited out) and leadership given up before a standby may take the lease."""
    from egress_kvm.kube import leader as leader_mod

    held = {"spec": {"holderIdentity": "a", "leaseDurationSeconds": 2, "acquireTime": "t",
                     "renewTime": "t", "leaseTransitions": 0}}
    state = {"slow": False, "put": ""}

    async def fake_request_json(api_client, method, path, *, body=None,  # type: ignore[no-untyped-def]
                                timeout=30.0, **kw):  # noqa: ASYNC109 - request_json's own signature
        if not state["slow"]:
            return held if method == "GET" else {**held, **(body or {})}
        if method == "GET":
            await asyncio.sleep(timeout * 0.6)  # slow, but within its own timeout
            return held
        try:
            await asyncio.sleep(timeout)  # hung until its own timeout
        except asyncio.CancelledError:
            state["put"] = "abandoned"
            raise
        state["put"] = "timed out by itself"
        raise TimeoutError("PUT timed out")

    monkeypatch.setattr(leader_mod, "request_json", fake_request_json)
    e = LeaderElector(None, namespace=NS, identity="a",  # type: ignore[arg-type]
                      lease_duration=2.0, renew_deadline=1.0, retry_period=0.2)
    await e.acquire()
    assert e.is_leader
    state["slow"] = True
    with pytest.raises(LeadershipLost):
        await e.hold()
    assert state["put"] == "abandoned"
    assert not e.is_leader
