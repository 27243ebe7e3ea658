"""Unused URL bases are evicted: a tenant naming new URLs must not fill a pool with cached images.

A base imported for an image given as a URL (`base-<url-hash>.qcow2`) is deleted, with its marker, once
no overlay in the pool backs onto it (the pool's own volumes are checked, not the Proxies in the cluster:
another cluster's overlays count too) and it was not used for `grace` seconds (a create that just found
it must not lose it between the lookup and its overlay). Bases of the providers file's image keys are
never evicted: an admin named them. Run by the controller's GC pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from lxml import etree

from rpc.types import StorageVol

from . import naming
from .hosts import Host
from .images import delete_volume

_URL_BASE = re.compile(r"^base-[0-9a-f]{16}\.qcow2$")


def is_url_base(name: str) -> bool:
    return bool(_URL_BASE.fullmatch(name))


def backing_path(xml: str) -> str | None:
    root = etree.fromstring(xml.encode(), parser=etree.XMLParser(resolve_entities=False, no_network=True))
    path: str | None = root.findtext("backingStore/path")
    return path


async def _xml_desc(host: Host, vol: StorageVol) -> str:
    return await host.call("storage_vol_get_xml_desc", lambda lv: lv.storage_vol_get_xml_desc(vol, 0))


async def _path(host: Host, vol: StorageVol) -> str:
    return await host.call("storage_vol_get_path", lambda lv: lv.storage_vol_get_path(vol))


async def evict_unused_url_bases(host: Host, pool: Any, *, keep: set[str], last_used: dict[str, float],
                                 busy: Callable[[str], bool], now: float, grace: float) -> list[str]:
    """Delete the URL bases nothing backs onto; `last_used` (volume -> monotonic time) is updated with
    every base seen for the first time, so one found after a restart gets its full grace period."""
    listing = await host.call("storage_pool_list_all_volumes",
                              lambda lv: lv.storage_pool_list_all_volumes(pool, 1, 0))
    volumes = {v.name: v for v in listing.vols}
    candidates = [n for n in volumes if is_url_base(n) and n not in keep]
    if not candidates:
        return []
    backed: set[str] = set()
    for name, vol in volumes.items():
        if name.endswith(".qcow2") and not name.startswith("base-"):  # any overlay, ours or not
            path = backing_path(await _xml_desc(host, vol))
            if path:
                backed.add(path)
    evicted: list[str] = []
    for name in candidates:
        seen = last_used.setdefault(name, now)
        if now - seen < grace or busy(name):
            continue
        async with host.exclusive(f"image:{pool.name}/{name}"):
            path = await _path(host, volumes[name])
            if path in backed:
                last_used[name] = now
                continue
            marker = volumes.get(naming.marker_volume(name))
            if marker is not None:  # marker first: a base without one is never used as finished
                await delete_volume(host, marker)
            await delete_volume(host, volumes[name])
            last_used.pop(name, None)
            evicted.append(name)
            host.log.info("unused URL base image evicted", pool=pool.name, volume=name)
    return evicted
