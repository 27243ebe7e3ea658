"""The provider's half of orphan-volume GC: listing this cluster's instance volumes (and only its own),
and deleting one only while no domain of its instance exists. The decision is the controller's
(tests/unit/controller/test_orphan_volumes.py)."""

from __future__ import annotations

import pytest
from fakes import DEFAULT_BASE, DEFAULT_MARKER, fake_kvm_provider, overlay_of, seed_of
from fakes.libvirt import lv_error
from provider_helpers import request

from egress_kvm.providers.base import CollectsVolumes, InstanceVolume, PermanentError, TransientError
from rpc.constants import ErrorCode

NAME = "proxy-abc"


async def crash_before_define(provider, hv, name: str = NAME) -> None:  # type: ignore[no-untyped-def]
    """A create that dies between its volumes and its domain (as an operator killed there would)."""
    hv["host0"].fail["domain_define_xml"] = lv_error(ErrorCode.INTERNAL_ERROR, "internal error: boom")
    with pytest.raises(TransientError):
        await provider.create(request(name=name))
    assert name not in hv["host0"].domains


async def test_volumes_of_a_create_that_died_before_define_are_listed_and_deleted() -> None:
    provider, hv = fake_kvm_provider(cluster_id="c1")
    assert isinstance(provider, CollectsVolumes)
    try:
        await crash_before_define(provider, hv)
        listing = await provider.list_instance_volumes("host0")
        overlay, seed = overlay_of(NAME, cluster_id="c1"), seed_of(NAME, cluster_id="c1")
        assert set(listing.volumes) == {
            InstanceVolume(zone="host0", name=overlay, instance=NAME, owner_namespace="ns1"),
            InstanceVolume(zone="host0", name=seed, instance=NAME, owner_namespace="ns1")}
        assert NAME not in listing.domains
        for v in listing.volumes:
            assert await provider.delete_orphan_volume(v) is True
        assert hv["host0"].volume_names() == {DEFAULT_BASE, DEFAULT_MARKER}
        assert await provider.delete_orphan_volume(listing.volumes[0]) is True  # gone already: done
    finally:
        await provider.close()


async def test_a_volume_whose_domain_exists_is_spared() -> None:
    provider, hv = fake_kvm_provider(cluster_id="c1")
    try:
        await provider.create(request())
        listing = await provider.list_instance_volumes("host0")
        assert NAME in listing.domains and len(listing.volumes) == 2
        assert await provider.delete_orphan_volume(listing.volumes[0]) is False
        assert listing.volumes[0].name in hv["host0"].volumes
    finally:
        await provider.close()


async def test_another_clusters_volumes_are_never_listed_nor_deleted() -> None:
    mine, hv = fake_kvm_provider(cluster_id="cluster-a")
    theirs = type(mine)(name=mine.name, config=mine.config, cluster_id="cluster-b", dial=hv.dial)
    try:
        await crash_before_define(theirs, hv, "proxy-theirs")
        their_overlay = overlay_of("proxy-theirs", cluster_id="cluster-b")
        assert (await mine.list_instance_volumes("host0")).volumes == ()
        forged = InstanceVolume(zone="host0", name=their_overlay, instance="proxy-theirs",
                                owner_namespace="ns1")
        with pytest.raises(PermanentError, match="not an instance volume of this cluster"):
            await mine.delete_orphan_volume(forged)
        await mine.delete("proxy-theirs", "host0")  # delete by name: ours only, theirs stay
        assert their_overlay in hv["host0"].volumes
        assert {v.name for v in (await theirs.list_instance_volumes("host0")).volumes} == {
            their_overlay, seed_of("proxy-theirs", cluster_id="cluster-b")}
    finally:
        await mine.close()
        await theirs.close()


async def test_legacy_volumes_go_with_their_instance_but_gc_never_sees_them() -> None:
    """Volumes named before the cluster tag existed: delete still finds them by name; the listing, which
    cannot prove whose they are, leaves them out."""
    provider, hv = fake_kvm_provider(cluster_id="c1")
    h = hv["host0"]
    try:
        h.put_volume(f"{NAME}.qcow2", b"old overlay", fmt="qcow2")
        h.put_volume(f"{NAME}-seed.iso", b"old seed")
        assert (await provider.list_instance_volumes("host0")).volumes == ()
        await provider.delete(NAME, "host0")
        assert h.volume_names() == {DEFAULT_BASE, DEFAULT_MARKER}
    finally:
        await provider.close()
