"""Orphan volumes on the real lab host (and the simulated one): a create that dies between its volumes
and its domain, the Proxy gone, and the orphan-volume GC pass; two clusters share the host's pool.

The crash is injected at the provider's define call (the host answers it with an error, exactly where a
killed operator would have stopped): the overlay and the seed are in the pool, no domain names them.
Cluster A's GC then runs with no Proxy in its cluster (the Proxy was deleted with its finalizer removed
by hand): its volumes survive the first pass (the grace clock starts) and go on the pass a grace period
later; cluster B's volumes, left the same way for the same instance name and namespace, and a volume
with the old untagged name, are never touched by A. B's own GC then collects B's. No VM boots here.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from test_kvm_provider import Logs, create_waiting, provider_for, request, virsh_ok, volumes
from test_kvm_provider import logs as logs_fixture  # noqa: F401 - the provider tests' log capture

from egress_kvm.controller.volume_gc import VolumeClocks, collect_orphan_volumes
from egress_kvm.providers.base import TransientError
from egress_kvm.providers.kvm import KvmProvider, naming
from rpc.constants import ErrorCode
from rpc.errors import LibvirtError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

GRACE = 600.0
T0 = 10_000.0


class EmptyCluster:
    """The cluster as GC sees it after the Proxy was deleted: listed (synced), and no Proxy in it."""

    def has_synced(self) -> bool:
        return True

    def keys(self) -> list[tuple[str, str]]:
        return []

    def get(self, key: tuple[str, str]) -> None:
        return None

    async def list_proxies(self, namespace: str | None) -> list[dict[str, Any]]:
        return []


async def crash_before_define(provider: KvmProvider, info: Any, name: str) -> set[str]:
    """Create `name` with the host refusing the define (a create cut off right there); returns the
    volumes it left in the pool."""
    host = provider.host("host0")
    real_call = host.call

    async def call(what: str, op: Any) -> Any:
        if what == "domain_define_xml":
            raise LibvirtError(ErrorCode.INTERNAL_ERROR, "INTERNAL_ERROR", 0, "injected: crash before define")
        return await real_call(what, op)

    before = volumes(info)
    host.call = call  # type: ignore[method-assign]
    try:
        with pytest.raises(TransientError, match="crash before define"):
            await create_waiting(provider, request(provider, name, info))
    finally:
        host.call = real_call  # type: ignore[method-assign]
    left = {v for v in volumes(info) - before if v.startswith(f"{name}.")}  # (a first create imports a base)
    assert len(left) == 2, left
    assert not virsh_ok(info, "dominfo", name)  # no domain names them
    return left


async def gc_pass(provider: KvmProvider, clocks: VolumeClocks, now: float) -> set[str]:
    cluster = EmptyCluster()
    done = await collect_orphan_volumes(providers={provider.name: provider}, store=cluster,  # type: ignore[arg-type]
                                        kube=cluster, grace_period=GRACE, clocks=clocks, now=now)  # type: ignore[arg-type]
    return {c.name for c in done}


async def test_volumes_of_a_create_cut_before_define_go_after_grace_not_another_clusters(
        lab: Any, logs_fixture: Logs) -> None:  # noqa: F811 - the imported fixture
    info, logs = lab, logs_fixture
    run = uuid.uuid4().hex[:8]
    mine = provider_for(info, cluster_id=f"it-vol-a-{run}")
    theirs = provider_for(info, cluster_id=f"it-vol-b-{run}")
    name = f"proxy-it-orph-{run}"  # the same instance name and namespace in both clusters
    legacy = f"proxy-it-orph-legacy-{run}.qcow2"
    try:
        my_left = await crash_before_define(mine, info, name)
        their_left = await crash_before_define(theirs, info, name)
        assert my_left == {naming.overlay_volume(name, cluster_id=mine.cluster_id, namespace="it"),
                           naming.seed_volume(name, cluster_id=mine.cluster_id, namespace="it")}
        assert my_left.isdisjoint(their_left)
        assert virsh_ok(info, "vol-create-as", "default", legacy, "1M")
        # Delete by name with no domain (a finalizer after such a crash) finds the volumes by listing.
        gone = await crash_before_define(mine, info, f"{name}-del")
        mark = logs.mark()
        await mine.delete(f"{name}-del", "host0")
        delete_rpcs = logs.rpcs(mark)
        assert gone.isdisjoint(volumes(info))
        assert delete_rpcs == ["domain_lookup_by_name", "storage_pool_lookup_by_name",
                               "storage_pool_list_all_volumes", "storage_vol_delete", "storage_vol_delete"]

        clocks: VolumeClocks = {}
        mark = logs.mark()
        assert await gc_pass(mine, clocks, T0) == set()  # first sight: the grace clock starts
        listing_rpcs = logs.rpcs(mark)
        assert my_left <= volumes(info)
        mark = logs.mark()
        assert await gc_pass(mine, clocks, T0 + GRACE) == my_left
        collect_rpcs = logs.rpcs(mark)
        print(f"\nRPCs over {len(mine.zones())} hosts: a GC pass that collects nothing {len(listing_rpcs)}; "
              f"one that collects two volumes {len(collect_rpcs)} {collect_rpcs}")
        assert listing_rpcs == ["storage_pool_lookup_by_name", "storage_pool_list_all_volumes",
                                "connect_list_all_domains"] * len(mine.zones())  # per host
        left_now = volumes(info)
        print(f"\norphan volumes: cluster A collected {sorted(my_left)}; pool keeps {len(left_now)} volumes")
        assert my_left.isdisjoint(left_now)
        assert their_left <= left_now and legacy in left_now  # another cluster's, and unprovable ones
        assert await gc_pass(mine, clocks, T0 + 10 * GRACE) == set()
        assert their_left <= volumes(info)

        their_clocks: VolumeClocks = {}
        await gc_pass(theirs, their_clocks, T0)
        assert await gc_pass(theirs, their_clocks, T0 + GRACE) == their_left
        assert their_left.isdisjoint(volumes(info))
    finally:
        await mine.close()
        await theirs.close()
        for vol in volumes(info):
            if vol.startswith(("proxy-it-orph-", name)):
                virsh_ok(info, "vol-delete", "--pool", "default", vol)
