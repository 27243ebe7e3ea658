"""Unused URL bases are evicted (issue 13 item 3): once no overlay in the pool backs onto a base imported
for a URL and it went unused for the grace period, it goes with its marker; configured images stay."""

from __future__ import annotations

import hashlib

from fakes import fake_kvm_provider, qcow2_image
from provider_helpers import request

from egress_kvm.providers.kvm import naming

URL = "http://images.example/tenant-picked.qcow2"  # never fetched: the cache entry is staged
DATA = qcow2_image()


async def test_a_url_base_goes_once_nothing_backs_onto_it_and_its_grace_passed() -> None:
    provider, hv = fake_kvm_provider(cluster_id="c1", urlImages=["images.example"])
    h = hv["host0"]
    base = naming.base_volume(url=URL)
    h.put_volume(base, DATA, fmt="qcow2")
    h.put_volume(naming.marker_volume(base), hashlib.sha256(DATA).hexdigest().encode())
    try:
        await provider.create(request(image=URL))  # an overlay backs onto the URL base now
        assert await provider.evict_unused_images(grace=0.0) == []
        assert base in h.volumes
        await provider.delete("proxy-abc", "host0")
        assert await provider.evict_unused_images(grace=600.0) == []  # used moments ago
        assert await provider.evict_unused_images(grace=0.0) == [f"host0/{base}"]
        assert base not in h.volumes and naming.marker_volume(base) not in h.volumes
        assert "base-debian-12.qcow2" in h.volumes  # a configured image is never evicted
    finally:
        await provider.close()
