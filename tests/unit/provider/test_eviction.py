"""Bases nothing uses are collected, and none that something uses ever is (issue 13 item 3, issue 9 item 4).

The decision (eviction.verdict) as a table; then the provider over the fake pool: a URL base, a base
superseded by a changed sha256, and a legacy base from before content addressing (the migration path),
each kept while any volume in the pool backs onto it and collected after.
"""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from fakes import DEFAULT_BASE, DEFAULT_MARKER, FakeHypervisor, fake_kvm_provider, overlay_of, qcow2_image
from provider_helpers import request

from egress_kvm.providers.kvm import naming
from egress_kvm.providers.kvm.domain_xml import volume_xml
from egress_kvm.providers.kvm.eviction import (
    Keep,
    Kind,
    collect_unused_bases,
    kind,
    may_back_onto_a_base,
    settled_for,
    verdict,
)

URL = "http://images.example/tenant-picked.qcow2"  # never fetched: the cache entry is staged
DATA = qcow2_image()
KEYED = "base-debian-12-0123456789abcdef.qcow2"
LEGACY = "base-debian-12.qcow2"
URL_BASE = naming.base_volume(url=URL)


@pytest.mark.parametrize(("name", "expected"), [
    (URL_BASE, Kind.URL),
    (KEYED, Kind.KEYED),
    (LEGACY, Kind.LEGACY),
    ("base-a.b_c.qcow2", Kind.LEGACY),
    ("base-debian-12.qcow2.sha256", None),  # a marker
    ("proxy-abc.qcow2", None),
    ("proxy-abc-seed.iso", None),
    ("base-../x.qcow2", None),
    ("notbase-debian.qcow2", None),
])
def test_kind_of_a_pool_volume(name: str, expected: Kind | None) -> None:
    assert kind(name) is expected


@pytest.mark.parametrize(("name", "reads"), [
    ("proxy-abc.qcow2", True), ("someone-elses.img", True), (KEYED, False), (LEGACY + ".sha256", False),
    ("proxy-abc-seed.iso", False),
])
def test_whose_backing_store_is_read(name: str, reads: bool) -> None:
    assert may_back_onto_a_base(name) is reads


CURRENT = frozenset({"base-debian-12-fedcba9876543210.qcow2"})
# name, busy, backed, idle seconds, marker, settled seconds (without a marker, at one allocation)
# -> verdict (grace 600 s)
TABLE = [
    ("base-debian-12-fedcba9876543210.qcow2", False, False, 9999, True, 0, Keep.CURRENT),
    ("base-debian-12-fedcba9876543210.qcow2", True, False, 9999, True, 0, Keep.CURRENT),
    # A current base without its marker (an operator SIGKILLed mid-import): incomplete, so it goes once
    # nothing writes it, backs onto it or used it, and it kept one size for the grace period.
    ("base-debian-12-fedcba9876543210.qcow2", True, False, 9999, False, 9999, Keep.BUSY),
    ("base-debian-12-fedcba9876543210.qcow2", False, True, 9999, False, 9999, Keep.BACKED),
    ("base-debian-12-fedcba9876543210.qcow2", False, False, 599, False, 9999, Keep.RECENT),
    ("base-debian-12-fedcba9876543210.qcow2", False, False, 9999, False, 599, Keep.UNSETTLED),
    ("base-debian-12-fedcba9876543210.qcow2", False, False, 600, False, 600, None),
    (KEYED, True, False, 9999, True, 0, Keep.BUSY),
    (KEYED, False, True, 9999, True, 0, Keep.BACKED),
    (KEYED, False, False, 599, True, 0, Keep.RECENT),
    (KEYED, False, False, 600, True, 0, None),  # settled is read only without a marker
    (KEYED, False, False, 600, False, 600, None),  # an interrupted import of a superseded image
    (KEYED, False, False, 9999, False, 599, Keep.UNSETTLED),  # growing: another process imports it
    (URL_BASE, False, True, 9999, True, 0, Keep.BACKED),
    (URL_BASE, False, False, 9999, False, 9999, None),
    (URL_BASE, False, False, 9999, False, 0, Keep.UNSETTLED),
    (LEGACY, False, True, 9999, True, 0, Keep.BACKED),  # an old VM still runs on it: the migration waits
    (LEGACY, False, False, 600, True, 0, None),
    (LEGACY, False, False, 9999, False, 9999, Keep.UNPROVEN),  # base-<anything>.qcow2 without our marker
]


@pytest.mark.parametrize(("name", "busy", "backed", "idle", "marker", "settled", "expected"), TABLE)
def test_verdict(name: str, busy: bool, backed: bool, idle: float, marker: bool, settled: float,
                 expected: Keep | None) -> None:
    assert verdict(name, current=CURRENT, busy=busy, backed=backed, idle=idle, grace=600.0,
                   has_marker=marker, settled=settled) is expected


@pytest.mark.parametrize(("seen", "allocation", "now", "expected"), [
    (None, 100, 50.0, 0.0),  # first seen: the count starts
    ((10.0, 100), 100, 50.0, 40.0),  # same size since
    ((10.0, 100), 200, 50.0, 0.0),  # it grew: someone writes it, the count starts again
])
def test_settled_for(seen: tuple[float, int] | None, allocation: int, now: float, expected: float) -> None:
    unfinished = {} if seen is None else {"b": seen}
    assert settled_for(unfinished, "b", allocation=allocation, now=now) == expected
    assert unfinished["b"][1] == allocation


def stage(h: FakeHypervisor, base: str, *, marker: bool = True) -> None:
    h.put_volume(base, DATA, fmt="qcow2")
    if marker:
        h.put_volume(naming.marker_volume(base), hashlib.sha256(DATA).hexdigest().encode())


def overlay_onto(h: FakeHypervisor, name: str, base: str) -> None:
    """An overlay as a VM of an earlier operator version (or another cluster) left it."""
    h.storage_vol_create_xml(h.pool_handle(), volume_xml(name=name, capacity=1 << 30, fmt="qcow2",
                                                         backing_path=h.volumes[base].path,
                                                         backing_format="qcow2"))


async def test_a_url_base_goes_once_nothing_backs_onto_it_and_its_grace_passed() -> None:
    provider, hv = fake_kvm_provider(cluster_id="c1", urlImages=["images.example"])
    h = hv["host0"]
    stage(h, URL_BASE)
    try:
        await provider.create(request(image=URL))  # an overlay backs onto the URL base now
        assert await provider.evict_unused_images(grace=0.0) == []
        assert URL_BASE in h.volumes
        await provider.delete("proxy-abc", "host0")
        assert await provider.evict_unused_images(grace=600.0) == []  # used moments ago
        assert await provider.evict_unused_images(grace=0.0) == [f"host0/{URL_BASE}"]
        assert URL_BASE not in h.volumes and naming.marker_volume(URL_BASE) not in h.volumes
        assert DEFAULT_BASE in h.volumes  # a configured image's current base is never evicted
    finally:
        await provider.close()


async def test_a_legacy_base_is_kept_while_an_old_overlay_backs_onto_it_then_collected() -> None:
    """The migration path: a host from before content addressing has `base-debian-12.qcow2` (+ marker)
    and a VM's overlay on it. New VMs get the content-addressed base; the legacy one stays, untouched,
    until the last overlay on it is gone, and then goes with its marker."""
    provider, hv = fake_kvm_provider(cluster_id="c1")
    h = hv["host0"]
    stage(h, LEGACY)
    overlay_onto(h, "proxy-old.qcow2", LEGACY)
    try:
        await provider.create(request(name="proxy-new"))
        new_overlay = h.volumes[overlay_of("proxy-new", cluster_id="c1")]
        assert new_overlay.backing_path == h.volumes[DEFAULT_BASE].path
        assert await provider.evict_unused_images(grace=0.0) == []
        assert {LEGACY, LEGACY + ".sha256", "proxy-old.qcow2"} <= set(h.volumes)
        del h.volumes["proxy-old.qcow2"]  # its Proxy deleted (by the old operator or this one)
        assert sorted(await provider.evict_unused_images(grace=0.0)) == [f"host0/{LEGACY}"]
        assert {LEGACY, LEGACY + ".sha256"}.isdisjoint(h.volumes)
        assert {DEFAULT_BASE, DEFAULT_MARKER, overlay_of("proxy-new", cluster_id="c1")} <= set(h.volumes)
    finally:
        await provider.close()


async def test_a_superseded_base_stays_under_a_running_vm_and_goes_after_it() -> None:
    """A changed sha256: the VM made before the change keeps its base; once it is deleted, so is the
    base, while a legacy-looking volume without our marker and the current base stay."""
    new_sha = hashlib.sha256(b"new").hexdigest()
    provider, hv = fake_kvm_provider(cluster_id="c1", images={"debian-12": {
        "url": "http://127.0.0.1:9/debian-12.qcow2", "sha256": new_sha}}, precache=False)
    h = hv["host0"]
    stage(h, DEFAULT_BASE)  # the base of the config before the change (unpinned)
    current = naming.base_volume(key="debian-12", url="http://x/", sha256=new_sha)
    stage(h, current)
    overlay_onto(h, "proxy-abc.qcow2", DEFAULT_BASE)
    stage(h, "base-admins-own.qcow2", marker=False)
    h.put_volume("base-gone-0123456789abcdef.qcow2.sha256", b"0" * 64)  # a marker whose base is gone
    try:
        assert await provider.evict_unused_images(grace=0.0) == [
            "host0/base-gone-0123456789abcdef.qcow2.sha256"]
        assert DEFAULT_BASE in h.volumes
        await provider.delete("proxy-abc", "host0")
        assert await provider.evict_unused_images(grace=0.0) == [f"host0/{DEFAULT_BASE}"]
        assert {current, naming.marker_volume(current), "base-admins-own.qcow2"} <= set(h.volumes)
        assert DEFAULT_MARKER not in h.volumes
    finally:
        await provider.close()


async def test_a_volume_of_any_name_backing_onto_a_base_keeps_it() -> None:
    provider, hv = fake_kvm_provider(cluster_id="c1")
    h = hv["host0"]
    stage(h, LEGACY)
    overlay_onto(h, "someone-elses.img", LEGACY)  # not our naming, not our cluster: still counts
    try:
        assert await provider.evict_unused_images(grace=0.0) == []
        assert LEGACY in h.volumes
    finally:
        await provider.close()


async def test_an_overlay_naming_its_base_through_another_directory_keeps_it() -> None:
    """Another cluster (or the pool reached through a symlink) may have made its overlay with another
    path to the same file: the file name alone keeps the base, the cautious answer."""
    provider, hv = fake_kvm_provider(cluster_id="c1")
    h = hv["host0"]
    stage(h, KEYED)
    overlay_onto(h, "proxy-other.qcow2", KEYED)
    h.volumes["proxy-other.qcow2"].backing_path = f"/srv/linked-pool/{KEYED}"  # as its qcow2 header says
    try:
        assert await provider.evict_unused_images(grace=0.0) == []
        assert KEYED in h.volumes
    finally:
        await provider.close()


async def test_volumes_deleted_between_the_listing_and_the_reads_do_not_stop_the_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancelled import cleaning up (or an admin) may delete a listed volume before its XML or path is
    read: it is skipped, and the rest of the pass goes on."""
    from fakes import FakeLibvirtClient

    provider, hv = fake_kvm_provider(cluster_id="c1")
    h = hv["host0"]
    stage(h, LEGACY)
    stage(h, KEYED)
    overlay_onto(h, "proxy-gone.qcow2", LEGACY)
    listing = FakeLibvirtClient.storage_pool_list_all_volumes

    async def list_then_delete(self: FakeLibvirtClient, *args: object) -> object:
        out = await listing(self, *args)  # type: ignore[arg-type]
        del h.volumes["proxy-gone.qcow2"], h.volumes[KEYED]
        return out

    monkeypatch.setattr(FakeLibvirtClient, "storage_pool_list_all_volumes", list_then_delete)
    try:
        assert await provider.evict_unused_images(grace=0.0) == [f"host0/{LEGACY}"]
        assert LEGACY not in h.volumes and naming.marker_volume(KEYED) in h.volumes  # next pass's
    finally:
        await provider.close()


async def test_a_current_base_left_without_its_marker_goes_once_it_stopped_changing() -> None:
    """The leak the fleet's chaos run found: an operator SIGKILLed mid-import leaves the key's current
    base without its marker, and if no Proxy needs that image on that host again nothing redoes it. It
    is collected once it kept one size for the grace period (so not while another process writes it);
    the next create imports it as it imports any missing base. The pass is driven with its own clock."""
    provider, hv = fake_kvm_provider(cluster_id="c1", precache=False)
    h = hv["host0"]
    h.put_volume(DEFAULT_BASE, DATA[:4096], fmt="raw")  # the part written before the kill; no marker
    host = provider.host("host0")
    pool = await host.call("lookup", lambda lv: lv.storage_pool_lookup_by_name("default"))
    last_used: dict[str, float] = {}
    unfinished: dict[str, tuple[float, int]] = {}

    async def gc(now: float) -> list[str]:
        return await collect_unused_bases(host, pool, current={DEFAULT_BASE}, last_used=last_used,
                                          busy=lambda _n: False, now=now, grace=600.0,
                                          unfinished=unfinished)

    try:
        assert await gc(1000.0) == []  # first seen: its counts start
        assert await gc(1599.0) == []
        h.volumes[DEFAULT_BASE].data += b"x" * 4096  # another process still writes it
        assert await gc(1600.0) == []  # it grew: the count starts again
        assert await gc(2199.0) == []
        assert DEFAULT_BASE in h.volumes
        assert await gc(2200.0) == [DEFAULT_BASE]
        assert DEFAULT_BASE not in h.volumes and not unfinished and not last_used
    finally:
        await provider.close()


async def test_a_current_base_whose_marker_holds_no_digest_is_incomplete_too() -> None:
    """Killed between creating the marker and writing its digest: the marker is empty, the base is
    no finished cache entry (images.py redoes it), so it is collected like a base without a marker."""
    provider, hv = fake_kvm_provider(cluster_id="c1", precache=False)
    h = hv["host0"]
    h.put_volume(DEFAULT_BASE, DATA, fmt="qcow2")
    h.put_volume(DEFAULT_MARKER, b"")
    try:
        assert sorted(await provider.evict_unused_images(grace=0.0)) == [f"host0/{DEFAULT_BASE}"]
        assert {DEFAULT_BASE, DEFAULT_MARKER}.isdisjoint(h.volumes)
    finally:
        await provider.close()


async def test_a_current_base_with_its_marker_is_never_collected() -> None:
    provider, hv = fake_kvm_provider(cluster_id="c1")
    h = hv["host0"]
    try:
        assert await provider.evict_unused_images(grace=0.0) == []
        assert {DEFAULT_BASE, DEFAULT_MARKER} <= set(h.volumes)
    finally:
        await provider.close()


async def test_a_base_an_import_of_this_process_holds_is_skipped_without_waiting() -> None:
    """The importer holds the image lock for the whole download: the GC pass must not wait it out."""
    provider, hv = fake_kvm_provider(cluster_id="c1", precache=True)
    h = hv["host0"]
    h.put_volume(KEYED, DATA[:4096], fmt="raw")  # a superseded image's import, still running
    host = provider.host("host0")
    entered = asyncio.Event()
    release = asyncio.Event()

    async def importing() -> None:
        async with host.exclusive(f"image:default/{KEYED}"):
            entered.set()
            await release.wait()

    holder = asyncio.create_task(importing())
    try:
        await entered.wait()
        assert await asyncio.wait_for(provider.evict_unused_images(grace=0.0), 30) == []
        assert KEYED in h.volumes
    finally:
        release.set()
        await holder
        await provider.close()
