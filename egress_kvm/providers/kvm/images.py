"""The base image cache: each image downloaded once per host, by the operator, through libvirt.

Bytes stream from the URL through this process into the pool (aiohttp -> storage_vol_upload) with a
running sha256; nothing is buffered beyond one chunk, and the image's first bytes are checked before any
volume exists (a qcow2 naming a backing or external data file is refused: qemu would open that host
path). The marker volume `<base>.sha256` is written last and holds the digest, so a crash mid-download
leaves a base without a marker, which the next attempt deletes and redoes. The marker itself is created
empty and reaches the digest's 64 bytes with its upload, so one left empty by a crash between the two
is seen (by its size, one cheap RPC) and redone too. A re-download happens when the marker is missing or
holds no digest, or `sha256` is configured and differs from it; otherwise the cached copy is used for as
long as it exists (a `latest` URL is pinned at its first fetch, per host). The base's name carries the
image's digest (naming.base_volume), so a changed url/sha256 is another base, imported beside the one
running VMs back onto; eviction.py collects bases nothing backs onto. A cancelled import (nobody waits
for it: imports.py) deletes what it wrote.

Downloads run in the background (imports.py), never on a reconcile worker, and are bounded so no URL can
hold a slot or a pool for long: an overall deadline (`imageImport.timeoutSeconds`, headers included), a
minimum rate (`minBytesPerSecond` averaged over each `rateWindowSeconds`: a byte a second is stopped
after one window), a size cap (`maxSizeGb`: a Content-Length above it is refused before any volume
exists, a stream without one is stopped at it), and room in the pool checked on refreshed figures with
`poolReserveGb` kept free (for the cap when the server sends no length).

Two imports of the same image on the same host cannot both write: the host's per-image lock makes the
second wait and then find the marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from egress_kvm.metrics import IMAGE_BYTES_FETCHED, IMAGE_IMPORTS
from egress_kvm.policy.connect import EgressDenied, NameNotResolved, TooManyRedirects, open_checked
from egress_kvm.policy.egress import Policy
from egress_kvm.policy.phrases import failure_phrase
from egress_kvm.providers.base import PermanentError, ProgressCallback, TransientError
from rpc.errors import LibvirtError, NotFoundError
from rpc.types import StoragePool, StorageVol

from . import capacity, qcow2
from .domain_xml import volume_xml
from .hosts import Host
from .placement import ImageSource
from .together import together

CHUNK = 1024 * 1024
MARKER_MAX = 128
DIGEST_LEN = 64  # a sha256 in hex: the marker's content, and so its size once written
PROGRESS_EVERY = 5.0


@dataclass(frozen=True)
class BaseImage:
    volume: StorageVol
    path: str
    format: str
    downloaded: bool


# The session for an image (its resolver enforces the egress policy) and that policy (for literal
# addresses and redirects, which open_checked decides hop by hop).
HttpFactory = Callable[[ImageSource], Awaitable[tuple[aiohttp.ClientSession, Policy]]]


@dataclass(frozen=True)
class ImportLimits:
    """The providers file's `imageImport` and `poolReserveGb`, in seconds and bytes."""

    timeout: float = 3600.0
    min_rate: int = 64 * 1024
    window: float = 60.0
    reserve: int = 1024**3


async def lookup_volume(host: Host, pool: StoragePool, name: str) -> StorageVol | None:
    try:
        return await host.call("storage_vol_lookup_by_name",
                               lambda lv: lv.storage_vol_lookup_by_name(pool, name))
    except NotFoundError:
        return None


async def delete_volume(host: Host, vol: StorageVol) -> None:
    with contextlib.suppress(NotFoundError):
        await host.call("storage_vol_delete", lambda lv: lv.storage_vol_delete(vol, 0))


class ImageCache:
    def __init__(self, *, http: HttpFactory, chunk_size: int = CHUNK, progress_every: float = PROGRESS_EVERY,
                 clock: Callable[[], float] = time.monotonic, limits: ImportLimits | None = None) -> None:
        self._http = http
        self._chunk = chunk_size
        self._progress_every = progress_every
        self._clock = clock
        self.limits = limits or ImportLimits()

    async def cached(self, host: Host, pool: StoragePool, image: ImageSource) -> BaseImage | None:
        """The finished cache entry, or None when `ensure` has work to do. Reads only (a few RPCs), so a
        reconcile may ask without waiting on a download: a half-written entry is left for `ensure`."""
        # Every Create asks this: its reads go out in two rounds of two (together.py), not four in a row.
        base, marker = await together(lookup_volume(host, pool, image.base_volume),
                                      lookup_volume(host, pool, image.marker_volume))
        if base is None or marker is None:
            return None
        path_of_base = host.call("storage_vol_get_path", lambda lv: lv.storage_vol_get_path(base))
        if image.sha256 is None:
            info, path = await together(
                host.call("storage_vol_get_info", lambda lv: lv.storage_vol_get_info(marker)), path_of_base)
            ok = info.capacity == DIGEST_LEN
        else:
            digest, path = await together(host.download(marker, limit=MARKER_MAX), path_of_base)
            ok = digest.decode(errors="replace").strip() == image.sha256
        return BaseImage(volume=base, path=path, format=image.format, downloaded=False) if ok else None

    async def ensure(self, host: Host, pool: StoragePool, image: ImageSource, *,
                     progress: ProgressCallback | None = None) -> BaseImage:
        async with host.exclusive(f"image:{pool.name}/{image.base_volume}"):
            base = await lookup_volume(host, pool, image.base_volume)
            marker = await lookup_volume(host, pool, image.marker_volume)
            reason = "not cached"
            if base is not None and marker is not None:
                if image.sha256 is None:
                    # The marker is created empty and grows to the digest's length with its upload, so
                    # a crash between the two leaves a marker whose size says it holds no digest.
                    info = await host.call("storage_vol_get_info", lambda lv: lv.storage_vol_get_info(marker))
                    if info.capacity == DIGEST_LEN:
                        return await self._cached(host, base, image)
                    reason = f"marker holds no digest ({info.capacity} bytes; an interrupted write)"
                else:
                    cached = (await host.download(marker, limit=MARKER_MAX)).decode(errors="replace").strip()
                    if cached == image.sha256:
                        return await self._cached(host, base, image)
                    shown = cached or "(empty marker)"
                    reason = f"configured sha256 {image.sha256} differs from cached {shown}"
            elif base is not None:
                reason = "base volume without marker (an interrupted download)"
            elif marker is not None:
                reason = "marker without base volume"
            # Marker first: if we crash between the two deletes, what is left is "base without marker".
            if marker is not None:
                await delete_volume(host, marker)
            if base is not None:
                await delete_volume(host, base)
            written: list[StorageVol] = []
            try:
                fetched = await self._fetch(host, pool, image, reason=reason, progress=progress,
                                            written=written)
            except asyncio.CancelledError:
                # Nobody waits any more (imports.py) or the provider closes: what this import created
                # goes, whichever step the cancel hit (the marker's upload included).
                IMAGE_IMPORTS.labels(host.name, image.metric_label, "cancelled").inc()
                await self._abandon(host, pool, image, written)
                raise
            except Exception:
                IMAGE_IMPORTS.labels(host.name, image.metric_label, "error").inc()
                raise
            IMAGE_IMPORTS.labels(host.name, image.metric_label, "success").inc()
            return fetched

    async def _abandon(self, host: Host, pool: StoragePool, image: ImageSource,
                       written: list[StorageVol]) -> None:
        """Delete the volumes a cancelled import created (marker first), only those: another process's
        import of the same name is not ours to undo. While our base is among them (it is unfinished),
        the marker's name is ours too, so it is looked up: a cancel that hit while libvirt created the
        marker left one that `written` never got. Best effort: a base left without its marker (the
        cancel hit while libvirt was creating the base) is redone by the next import, or collected
        (eviction.py) if none comes."""
        if written:
            with contextlib.suppress(Exception):
                marker = await lookup_volume(host, pool, image.marker_volume)
                if marker is not None and all(v.name != marker.name for v in written):
                    written.append(marker)
        for vol in reversed(written):
            with contextlib.suppress(Exception):
                await delete_volume(host, vol)
        host.log.info("cancelled image import cleaned up", image=image.label, pool=pool.name,
                      volume=image.base_volume)

    async def _cached(self, host: Host, base: StorageVol, image: ImageSource) -> BaseImage:
        path = await host.call("storage_vol_get_path", lambda lv: lv.storage_vol_get_path(base))
        return BaseImage(volume=base, path=path, format=image.format, downloaded=False)

    async def _fetch(self, host: Host, pool: StoragePool, image: ImageSource, *, reason: str,
                     progress: ProgressCallback | None, written: list[StorageVol]) -> BaseImage:
        log = host.log.with_values(image=image.label, pool=pool.name, volume=image.base_volume)
        log.info("fetching base image into host pool", url=image.shown_url, reason=reason)
        started = self._clock()
        limits = self.limits
        deadline = asyncio.get_running_loop().time() + limits.timeout
        http, policy = await self._http(image)
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout_at(deadline):  # a server trickling its headers included
                        resp = await stack.enter_async_context(open_checked(
                            http, image.url, policy, headers={"Accept-Encoding": "identity"}))
                except TimeoutError:
                    raise TransientError(f"image {image.label!r}: {image.shown_url} sent no answer within "
                                         f"{limits.timeout:.0f} s") from None
                if resp.status != 200:
                    raise TransientError(
                        f"image {image.label!r}: GET {image.shown_url} answered HTTP {resp.status}")
                encoding = _content_encoding(resp.headers.get("Content-Encoding"))
                if encoding is not None:
                    # Content-Length counts encoded bytes: decoded, the body could outgrow the space
                    # checked for it (and the reserve). We asked for identity; a server that ignores it
                    # is refused rather than trusted.
                    raise PermanentError(f"image {image.label!r} ({image.shown_url}) was sent with "
                                         f"Content-Encoding {encoding}; only unencoded images are fetched")
                length = resp.content_length
                if length is not None and length > image.max_bytes:
                    raise PermanentError(f"image {image.label!r} ({image.shown_url}) is "
                                         f"{capacity.fmt_bytes(length)}, more than its size cap of "
                                         f"{capacity.fmt_bytes(image.max_bytes)} (maxSizeGb)")
                chunks = _Paced(resp.content.iter_chunked(self._chunk), image=image, limits=limits,
                                deadline=deadline)
                head = await _read_head(chunks)
                try:
                    qcow2.check_header(head, fmt=image.format)
                except qcow2.UnsafeImageError as exc:
                    raise PermanentError(f"image {image.label!r} ({image.shown_url}) {exc}") from None
                # Without a length, room for the cap: a stream may run up to it.
                available = await capacity.refreshed_available(host, pool)
                capacity.check_pool_space(host=host.name, pool=pool.name, available=available,
                                          needed=length or image.max_bytes, what=f"image {image.label!r}",
                                          reserve=limits.reserve)
                vol = await host.call("storage_vol_create_xml", lambda lv: lv.storage_vol_create_xml(pool,
                                      volume_xml(name=image.base_volume, capacity=length or 0, fmt="raw"), 0))
                written.append(vol)
                hasher = hashlib.sha256()
                counted = IMAGE_BYTES_FETCHED.labels(host.name, image.metric_label)
                moved = 0
                last_report = started

                async def stream() -> AsyncIterator[bytes]:
                    nonlocal moved, last_report
                    pending = [head] if head else []
                    async for chunk in _source(_chain(pending, chunks)):
                        hasher.update(chunk)
                        moved += len(chunk)
                        counted.inc(len(chunk))  # as they flow: a long import shows its rate meanwhile
                        now = self._clock()
                        if progress is not None and now - last_report >= self._progress_every:
                            last_report = now
                            try:
                                await progress(_progress_text(image.label, host.name, moved, length,
                                                              elapsed=now - started))
                            except Exception as exc:
                                raise _SourceError(exc) from exc
                        yield chunk

                try:
                    await host.upload(vol, stream())
                except BaseException as exc:
                    await _discard(host, vol)
                    if isinstance(exc, LibvirtError) and capacity.is_no_space(exc):
                        raise capacity.no_space(exc, host=host.name, pool=pool.name, available=None,
                                                action=f"downloading image {image.label!r}") from None
                    if isinstance(exc, _SourceError):
                        raise exc.cause from None  # handled below as the download's own failure
                    raise
        except EgressDenied as exc:
            raise PermanentError(f"image {image.label!r} ({image.shown_url}): {exc}") from None
        except (aiohttp.ClientError, NameNotResolved, TooManyRedirects) as exc:
            # A fixed phrase, never the library's text: it quotes URLs (queries, userinfo) and peers.
            why = failure_phrase(exc)
            raise TransientError(
                f"image {image.label!r}: downloading {image.shown_url} failed: {why}") from None
        except TimeoutError:
            raise TransientError(f"image {image.label!r}: downloading {image.shown_url} timed out") from None
        digest = hasher.hexdigest()
        if image.sha256 is not None and digest != image.sha256:
            await _discard(host, vol)
            raise PermanentError(f"image {image.label!r} ({image.shown_url}): sha256 mismatch: configured "
                                 f"{image.sha256}, downloaded {digest}; the volume was deleted")
        # libvirt re-probes the file: the pool now reports the base's real format and virtual size.
        await host.call("storage_pool_refresh", lambda lv: lv.storage_pool_refresh(pool, 0))
        vol = await host.call("storage_vol_lookup_by_name",
                              lambda lv: lv.storage_vol_lookup_by_name(pool, image.base_volume))
        # Created empty: its size reaches DIGEST_LEN only once the digest is written (see ensure).
        marker = await host.call("storage_vol_create_xml", lambda lv: lv.storage_vol_create_xml(pool,
                                 volume_xml(name=image.marker_volume, capacity=0, fmt="raw"), 0))
        written.append(marker)
        try:
            await host.upload(marker, digest.encode())
        except BaseException:
            await _discard(host, marker)
            raise
        written.clear()  # finished: someone may back onto it already, a cancel from here on keeps it
        path = await host.call("storage_vol_get_path", lambda lv: lv.storage_vol_get_path(vol))
        duration = self._clock() - started
        log.info("base image cached", size=moved, duration=round(duration, 3), sha256=digest,
                 rateMBps=round(moved / 1e6 / duration, 1) if duration > 0 else None)
        return BaseImage(volume=vol, path=path, format=image.format, downloaded=True)


_ENCODINGS = frozenset({"gzip", "x-gzip", "deflate", "br", "compress", "zstd"})


def _content_encoding(value: str | None) -> str | None:
    """None for an unencoded body; else how to name the encoding in status (a fixed phrase: the header
    is the server's text, shown only when it is one of the encodings we know)."""
    if value is None or value.strip().lower() in ("", "identity"):
        return None
    name = value.strip().lower()
    return repr(name) if name in _ENCODINGS else "(an encoding this operator does not name)"


class _SourceError(Exception):
    """A failure of the HTTP source (or the progress callback) while the upload pulls from it.

    Raised inside the upload's data generator, so it travels up through the rpc stream and `Host.call`.
    It must not look like a link failure there (aiohttp's timeouts and resets are OSError/TimeoutError,
    which `Host.call` reads as "libvirt connection lost" and answers by closing the host's shared
    session), so it is wrapped on the way in and unwrapped once `host.upload` has returned.
    """

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


async def _source(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except Exception as exc:
            raise _SourceError(exc) from exc
        yield chunk


async def _discard(host: Host, vol: StorageVol) -> None:
    """Best effort: a volume we could not finish must not look finished (it has no marker either way)."""
    with contextlib.suppress(Exception):
        await delete_volume(host, vol)


async def _read_head(chunks: AsyncIterator[bytes]) -> bytes:
    head = b""
    while len(head) < qcow2.HEADER_NEEDED:
        try:
            head += await anext(chunks)
        except StopAsyncIteration:
            break
    return head


async def _chain(first: list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in first:
        yield chunk
    async for chunk in rest:
        yield chunk


def _progress_text(label: str, host: str, moved: int, length: int | None, *, elapsed: float = 0.0) -> str:
    notes = [f"{100 * moved / length:.0f}%"] if length else []
    if elapsed > 0:
        notes.append(f"{moved / 1e6 / elapsed:.1f} MB/s")
    size = f"{moved / 1e6:.0f} of {length / 1e6:.0f} MB" if length else f"{moved / 1e6:.0f} MB"
    return f"downloading image {label} to host {host}: {size}" + (f" ({', '.join(notes)})" if notes else "")


class _Paced:
    """The HTTP body as chunks, stopped at the deadline, below the minimum rate, or past the size cap.

    Every read waits at most until the deadline or the end of the current rate window, so a server that
    sends nothing at all is caught as surely as one that sends a byte a second."""

    def __init__(self, chunks: AsyncIterator[bytes], *, image: ImageSource, limits: ImportLimits,
                 deadline: float) -> None:
        self._chunks = chunks
        self._image = image
        self._limits = limits
        self._deadline = deadline
        self._loop = asyncio.get_running_loop()
        self._window_end = self._loop.time() + limits.window
        self._window_bytes = 0
        self.total = 0

    def __aiter__(self) -> _Paced:
        return self

    async def __anext__(self) -> bytes:
        image, limits = self._image, self._limits
        while True:
            if self._loop.time() >= self._deadline:
                raise TransientError(f"image {image.label!r}: downloading {image.shown_url} took longer than "
                                     f"{limits.timeout:.0f} s (imageImport.timeoutSeconds); stopped")
            chunk: bytes | None = None
            cm = asyncio.timeout_at(min(self._deadline, self._window_end))
            try:
                async with cm:
                    chunk = await anext(self._chunks)
            except TimeoutError:
                if not cm.expired():
                    raise  # the HTTP client's own timeout
            if chunk is not None:
                self.total += len(chunk)
                self._window_bytes += len(chunk)
                if self.total > image.max_bytes:
                    raise PermanentError(f"image {image.label!r} ({image.shown_url}) is larger than its size "
                                         f"cap of {capacity.fmt_bytes(image.max_bytes)} (maxSizeGb); stopped")
            now = self._loop.time()
            if now >= self._window_end:
                if self._window_bytes < limits.min_rate * limits.window:
                    raise TransientError(
                        f"image {image.label!r}: {image.shown_url} sent {self._window_bytes} bytes in "
                        f"{limits.window:.0f} s, below the minimum of {limits.min_rate} bytes/s "
                        "(imageImport.minBytesPerSecond); stopped")
                self._window_end = now + limits.window
                self._window_bytes = 0
            if chunk is not None:
                return chunk
