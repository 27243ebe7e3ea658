"""Placement rules (the spec's table): zone -> host, machineType -> size, image -> key or URL.

Pure functions, no I/O: a bad value is a PermanentError naming it, because no retry can fix a spec that
points at a host, size or image the config does not have.
"""

from __future__ import annotations

from dataclasses import dataclass

from egress_kvm.config.models import KvmConfig, MachineType, check_http_url
from egress_kvm.policy.egress import Policy, Purpose, explain, precheck, url_target
from egress_kvm.policy.policies import url_image_policy
from egress_kvm.providers.base import PermanentError, Placement, ResolvedPlacement
from egress_kvm.redact import redact_url

from . import naming


@dataclass(frozen=True)
class ImageSource:
    """Where a base image comes from and what it is called on the host."""

    label: str  # the image key, or the URL as shown (redact_url) when used directly (logs, messages)
    url: str  # only ever fetched, never printed: it may hold credentials or a signature
    sha256: str | None
    format: str
    base_volume: str
    max_bytes: int = 20 * 1024**3  # a download is stopped here (imageImport.maxSizeGb, or the image's own)
    direct: bool = False  # placement.image was a URL (the tenant's), not a key of images (the admin's)

    @property
    def marker_volume(self) -> str:
        return naming.marker_volume(self.base_volume)

    @property
    def metric_label(self) -> str:
        """The `image` label of metrics: the admin's key, or one shared value for every URL image (a
        tenant picks URLs freely; one series per URL would grow without bound)."""
        return "url" if self.direct else self.label

    @property
    def shown_url(self) -> str:
        return redact_url(self.url)


def _pick(kind: str, value: str | None, known: list[str], provider: str) -> str:
    if value:
        if value not in known:
            raise PermanentError(f"unknown placement.{kind} {value!r} for provider {provider!r} "
                                 f"(known: {', '.join(known) or 'none'})")
        return value
    if len(known) == 1:
        return known[0]
    raise PermanentError(
        f"placement.{kind} is required: provider {provider!r} has {len(known)} "
        f"({', '.join(known) or 'none'})")


def resolve(placement: Placement, kvm: KvmConfig, *, provider: str,
            url_policy: Policy | None = None) -> ResolvedPlacement:
    """Defaults and checks. A URL image is refused here unless `url_policy` (the entry's urlImages)
    admits its host as far as that can be told before DNS; the download decides each address again."""
    zone = _pick("zone", placement.zone, [h.name for h in kvm.hosts], provider)
    machine_type = _pick("machineType", placement.machine_type, list(kvm.machine_types), provider)
    image = placement.image
    if image and image.startswith(("http://", "https://")):
        try:
            check_http_url(image)
        except ValueError as exc:
            raise PermanentError(f"placement.image {redact_url(image)!r} {exc}") from None
        target = url_target(image)
        verdict = precheck(url_policy or url_image_policy(None, ()), host=target.host, port=target.port)
        if not verdict.allowed:
            shown = explain(verdict, purpose=Purpose.URL_IMAGE, shown=repr(redact_url(image)))
            raise PermanentError(f"placement.image {shown} (provider {provider!r})")
    elif image and image not in kvm.images:
        raise PermanentError(
            f"unknown placement.image {redact_url(image)!r} for provider {provider!r}: not a key of images "
            f"({', '.join(kvm.images) or 'none'}) nor an http(s):// URL")
    else:
        image = _pick("image", image, list(kvm.images), provider)
    return ResolvedPlacement(zone=zone, machine_type=machine_type, image=image)


def checked(resolved: ResolvedPlacement, kvm: KvmConfig, *, provider: str,
            url_policy: Policy | None = None) -> ResolvedPlacement:
    """A placement resolved elsewhere, checked against this config (nothing filled in): a create must
    not trust its input to name a host, size and image the config has."""
    again = resolve(Placement(zone=resolved.zone, machine_type=resolved.machine_type, image=resolved.image),
                    kvm, provider=provider, url_policy=url_policy)
    if again != resolved:  # cannot happen for a fully named placement; a bug if it does
        raise PermanentError(f"placement {resolved} is not resolved for provider {provider!r}")
    return resolved


def machine_type(kvm: KvmConfig, key: str) -> MachineType:
    return kvm.machine_types[key]


def image_source(kvm: KvmConfig, image: str) -> ImageSource:
    """A resolved image (key or URL). URLs used directly are qcow2 (the format default) and unpinned."""
    entry = kvm.images.get(image)
    cap = kvm.image_import.max_size_gb * 1024**3
    if entry is not None:
        return ImageSource(label=image, url=entry.url, sha256=entry.sha256, format=entry.format,
                           base_volume=naming.base_volume(key=image, url=entry.url, sha256=entry.sha256),
                           max_bytes=entry.max_size_gb * 1024**3 if entry.max_size_gb else cap)
    return ImageSource(label=redact_url(image), url=image, sha256=None, format="qcow2",
                       base_volume=naming.base_volume(url=image), max_bytes=cap, direct=True)
