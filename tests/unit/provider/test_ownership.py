"""Ownership is checked at the host (issue 13 item 4): the domain's metadata names its Proxy (owner uid)
and cluster, and get/delete/reuse for another owner are refused with NotOwned, touching nothing."""

from __future__ import annotations

import pytest
from fakes import fake_kvm_provider
from provider_helpers import request

from egress_kvm.providers.base import NotOwned

NAME = "proxy-abc"


async def test_get_delete_and_reuse_for_another_proxy_are_refused_and_touch_nothing() -> None:
    provider, hv = fake_kvm_provider(cluster_id="c1")
    h = hv["host0"]
    try:
        await provider.create(request(uid="uid-a"))
        before = set(h.volume_names())
        assert (await provider.get(NAME, "host0", owner_uid="uid-a")) is not None
        with pytest.raises(NotOwned, match=r"belongs to another Proxy \(owner uid uid-a, not uid-b\); "
                                           r"refusing to manage it"):
            await provider.get(NAME, "host0", owner_uid="uid-b")
        with pytest.raises(NotOwned, match="refusing to delete it"):
            await provider.delete(NAME, "host0", owner_uid="uid-b")
        with pytest.raises(NotOwned, match="refusing to reuse it"):
            await provider.create(request(uid="uid-b"))
        assert NAME in h.domains and h.domains[NAME].id != -1  # still defined and running
        assert set(h.volume_names()) == before
        await provider.delete(NAME, "host0", owner_uid="uid-a")  # its owner may
        assert NAME not in h.domains
    finally:
        await provider.close()


async def test_another_clusters_domain_is_not_owned() -> None:
    mine, hv = fake_kvm_provider(cluster_id="cluster-a")
    theirs = type(mine)(name=mine.name, config=mine.config, cluster_id="cluster-b", dial=hv.dial)
    try:
        await theirs.create(request(uid="uid-a"))
        with pytest.raises(NotOwned, match="belongs to cluster 'cluster-b'"):
            await mine.delete(NAME, "host0", owner_uid="uid-a")
        assert NAME in hv["host0"].domains
    finally:
        await mine.close()
        await theirs.close()
