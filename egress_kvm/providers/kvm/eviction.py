"""Base images nothing uses any more are collected, and none that something still uses ever is.

Bases are named by their content (naming.py): a changed `url` or `sha256` imports a new base beside the
old one, and the overlays of running VMs go on backing onto the old one. So the GC pass (the controller
calls `KvmProvider.evict_unused_images`) looks at every base in each pool and deletes, with its marker:

- a **URL base** (`base-<url-hash>.qcow2`, a tenant's `placement.image` URL),
- a **superseded base** (`base-<key>-<digest>.qcow2` that is not the current name of a providers-file
  key: its url/sha256 changed, or the key is gone),
- a **legacy base** (`base-<key>.qcow2`, the name before bases were content-addressed; only with its
  marker, the proof that this operator wrote it: the pattern alone is broad),

once no volume in the pool backs onto it (the pool's own volumes are read, STORAGE_VOL_GET_XML_DESC's
backingStore, not the Proxies in the cluster: another cluster's overlays and a VM whose Proxy is gone
count too), no import is writing it, and it went unused for `grace` seconds (a create that just found it
must not lose it between the lookup and its overlay). A key's current base is never collected while it
is complete (its marker holds the digest): an admin named it. Without one it is incomplete by definition
(an operator killed mid-import leaves it so, or with the marker still empty, and if no Proxy needs
that image on that host again nothing would ever redo it): it goes like the others, and the next
create re-imports it. A base without its
marker, current or not, must moreover have kept one allocation for `grace` seconds: an import by
another process (another cluster's operator on the same host) grows it at least at
`imageImport.minBytesPerSecond`, and is not this process's to cut short. A marker whose base is gone goes
too (never a state of a running import: the base is created first, and deleted last).

`verdict` is the decision, pure (tested as a table); `collect_unused_bases` is the I/O around it.
"""

from __future__ import annotations

import enum
import posixpath
import re
from collections.abc import Callable
from typing import Any

from lxml import etree

from rpc.errors import NotFoundError
from rpc.types import StorageVol

from . import naming
from .hosts import Host
from .images import DIGEST_LEN, delete_volume

_URL_BASE = re.compile(r"^base-[0-9a-f]{16}\.qcow2$")
_KEYED_BASE = re.compile(r"^base-[A-Za-z0-9._-]+-[0-9a-f]{16}\.qcow2$")
_ANY_BASE = re.compile(r"^base-[A-Za-z0-9._-]+\.qcow2$")
_MARKER_SUFFIX = ".sha256"


class Kind(enum.Enum):
    URL = "URL base"
    KEYED = "superseded base"  # content-addressed, not a current name
    LEGACY = "legacy base"  # base-<key>.qcow2, from before content addressing


class Keep(enum.Enum):
    """Why a base stays (no verdict: it is collected)."""

    CURRENT = "the current base of a providers-file image"
    BUSY = "an import is writing it"
    BACKED = "a volume in the pool backs onto it"
    RECENT = "used within the grace period"
    UNPROVEN = "a legacy name without its marker: maybe not ours"
    UNSETTLED = "without its marker, at one size for less than the grace period: maybe still written"


def kind(name: str) -> Kind | None:
    """What a pool volume's name says it is; None: not a base of ours."""
    if _URL_BASE.fullmatch(name):
        return Kind.URL
    if _KEYED_BASE.fullmatch(name):
        return Kind.KEYED
    if _ANY_BASE.fullmatch(name):
        return Kind.LEGACY
    return None


def is_url_base(name: str) -> bool:
    return kind(name) is Kind.URL


def verdict(name: str, *, current: frozenset[str] | set[str], busy: bool, backed: bool, idle: float,
            grace: float, has_marker: bool, settled: float = 0.0) -> Keep | None:
    """Whether the base `name` stays (why) or goes (None). `idle`: seconds since it was last used (or
    first seen by this process, so one found after a restart gets its full grace period). `settled`
    (read only without a marker): seconds it has been seen without its marker at one allocation."""
    if name in current and has_marker:
        return Keep.CURRENT
    if busy:
        return Keep.BUSY
    if backed:
        return Keep.BACKED
    if idle < grace:
        return Keep.RECENT
    if not has_marker and kind(name) is Kind.LEGACY:
        return Keep.UNPROVEN
    if not has_marker and settled < grace:
        return Keep.UNSETTLED
    return None


def backing_path(xml: str) -> str | None:
    root = etree.fromstring(xml.encode(), parser=etree.XMLParser(resolve_entities=False, no_network=True))
    path: str | None = root.findtext("backingStore/path")
    return path


def may_back_onto_a_base(name: str) -> bool:
    """Whether a volume's backing store must be read: anything but our bases, markers and seed ISOs (a
    base never has one: images.py refuses an image naming a backing file)."""
    return kind(name) is None and not name.endswith((_MARKER_SUFFIX, "-seed.iso"))


async def _xml_desc(host: Host, vol: StorageVol) -> str:
    return await host.call("storage_vol_get_xml_desc", lambda lv: lv.storage_vol_get_xml_desc(vol, 0))


async def _path(host: Host, vol: StorageVol) -> str:
    return await host.call("storage_vol_get_path", lambda lv: lv.storage_vol_get_path(vol))


async def _capacity(host: Host, vol: StorageVol) -> int:
    info = await host.call("storage_vol_get_info", lambda lv: lv.storage_vol_get_info(vol))
    return int(info.capacity)


async def _allocation(host: Host, vol: StorageVol) -> int:
    info = await host.call("storage_vol_get_info", lambda lv: lv.storage_vol_get_info(vol))
    return int(info.allocation)


def settled_for(unfinished: dict[str, tuple[float, int]], name: str, *, allocation: int, now: float) -> float:
    """Seconds `name` has been seen without its marker at `allocation`; a changed allocation (someone
    writes it) starts the count again. `unfinished` (volume -> (since, allocation)) is updated."""
    since, seen = unfinished.get(name, (now, allocation))
    if seen != allocation:
        since = now
    unfinished[name] = (since, allocation)
    return now - since


async def collect_unused_bases(host: Host, pool: Any, *, current: set[str], last_used: dict[str, float],
                               busy: Callable[[str], bool], now: float, grace: float,
                               unfinished: dict[str, tuple[float, int]] | None = None) -> list[str]:
    """Delete the bases `verdict` lets go (markers first) and markers left without their base; returns
    the names deleted. `last_used` (volume -> monotonic time) gains every base seen for the first time,
    `unfinished` (see settled_for) every base seen without its marker."""
    unfinished = {} if unfinished is None else unfinished
    listing = await host.call("storage_pool_list_all_volumes",
                              lambda lv: lv.storage_pool_list_all_volumes(pool, 1, 0))
    volumes: dict[str, StorageVol] = {v.name: v for v in listing.vols}
    for memo in (last_used, unfinished):  # forget volumes gone from the pool (deleted by anyone)
        for gone in [n for n in memo if n not in volumes]:
            del memo[gone]

    def writing(base: str) -> bool:  # an import of this process holds it: never wait out a download
        return busy(base) or host.held(f"image:{pool.name}/{base}")

    # A current base is complete when its marker holds a digest (one size read: a marker is created
    # empty and reaches DIGEST_LEN with its upload, images.py); an incomplete one is a candidate like
    # the rest, its empty marker counted as none.
    complete: set[str] = set()
    for name in current:
        marker_vol = volumes.get(naming.marker_volume(name))
        if name in volumes and marker_vol is not None:
            try:
                size = await _capacity(host, marker_vol)
            except NotFoundError:
                continue
            if size == DIGEST_LEN or writing(name):
                complete.add(name)
    candidates = [n for n in volumes if kind(n) is not None and n not in complete]
    orphan_markers = [n for n in volumes if n.endswith(_MARKER_SUFFIX) and kind(n[:-len(_MARKER_SUFFIX)])
                      and n[:-len(_MARKER_SUFFIX)] not in volumes and not writing(n[:-len(_MARKER_SUFFIX)])]
    if not candidates and not orphan_markers:
        return []
    backed: set[str] = set()
    for name, vol in volumes.items():
        if candidates and may_back_onto_a_base(name):
            try:
                path = backing_path(await _xml_desc(host, vol))
            except NotFoundError:
                continue  # deleted since the listing: backs onto nothing any more
            if path:
                backed.add(path)
    # By path, or by file name alone: an overlay made through another path to the pool's directory (a
    # symlink, a bind mount, another cluster's config) must keep its base too: the cautious answer.
    backed_names = {posixpath.basename(p) for p in backed}
    collected: list[str] = []
    for name in orphan_markers:
        await delete_volume(host, volumes[name])
        collected.append(name)
        host.log.info("base image marker without its base deleted", pool=pool.name, volume=name)
    for name in candidates:
        seen = last_used.setdefault(name, now)
        marker = volumes.get(naming.marker_volume(name))
        has_marker = marker is not None and (name not in current or name in complete)
        if has_marker:
            unfinished.pop(name, None)
        if writing(name):
            continue  # verdict's BUSY, decided without waiting for the lock
        # The lock is the importer's (images.py): no import starts writing this name meanwhile.
        async with host.exclusive(f"image:{pool.name}/{name}"):
            try:
                path = await _path(host, volumes[name])
                settled = 0.0 if has_marker else settled_for(
                    unfinished, name, allocation=await _allocation(host, volumes[name]), now=now)
            except NotFoundError:  # deleted meanwhile (a cancelled import's clean-up, by hand)
                last_used.pop(name, None)
                unfinished.pop(name, None)
                continue
            is_backed = path in backed or name in backed_names
            keep = verdict(name, current=current, busy=busy(name), backed=is_backed, idle=now - seen,
                           grace=grace, has_marker=has_marker, settled=settled)
            if keep is Keep.BACKED:
                last_used[name] = now
            if keep is not None:
                continue
            if marker is not None:  # marker first: a base without one is never used as finished
                await delete_volume(host, marker)
            await delete_volume(host, volumes[name])
        last_used.pop(name, None)
        unfinished.pop(name, None)
        collected.append(name)
        what = kind(name)
        host.log.info("unused base image collected", pool=pool.name, volume=name,
                      kind=what.value if what else "")
    return collected
