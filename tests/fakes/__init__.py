"""In-memory fakes for fast unit tests.

The KVM provider over a fake libvirt, in one line (the real KvmProvider; only the host dialer is fake):

    provider, hv = fake_kvm_provider(hosts=["host0", "host1"], cluster_id="c1")
    inst = await provider.create(CreateRequest(name="proxy-abc", owner_uid="u1",
                                               placement=provider.resolve(Placement(zone="host0")),
                                               user_data=b"#cloud-config"))
    hv["host0"].domains["proxy-abc"].state        # rpc.constants.DomainState value
    hv["host0"].volumes                           # name -> FakeVolume (bytes in .data)
    hv["host0"].set_vm_ip("proxy-abc", "192.0.2.10")        # the guest agent now reports it
    hv["host0"].set_vm_ip("proxy-abc", "192.0.2.10", agent=False)  # only the host's neighbour table
    hv["host0"].shut_off("proxy-abc")             # the VM powered off (get -> Stopped)
    hv["host0"].pause("proxy-abc")                # `virsh suspend`: start() resumes it
    hv["host0"].pause_on_io_error("proxy-abc")    # fills the pool: get/create -> QuotaError
    hv["host0"].free_pool_space()                 # room again: start() resumes it
    hv.set_unreachable("host1")                   # dial fails, open sessions drop (get -> TransientError)
    hv["host0"].calls                             # every libvirt method called, in order
    await provider.close()

Images: by default one image `debian-12` (URL on 127.0.0.1:9, never fetched) is pre-cached on every host
(base volume + marker), so create needs no HTTP. Pass `images={key: {"url": ..., "sha256": ...}}` and
`precache=False` to exercise the download path against a real local HTTP server.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

from egress_kvm.config import parse_providers
from egress_kvm.config.models import EgressConfig
from egress_kvm.providers.kvm import KvmProvider, naming

from .libvirt import FakeDomain, FakeHypervisor, FakeHypervisors, FakeLibvirtClient, FakeSession, FakeVolume

__all__ = [
    "DEFAULT_BASE",
    "DEFAULT_MARKER",
    "FakeDomain",
    "FakeHypervisor",
    "FakeHypervisors",
    "FakeLibvirtClient",
    "FakeSession",
    "FakeVolume",
    "fake_kvm_provider",
    "kvm_config",
    "overlay_of",
    "qcow2_image",
    "seed_of",
]

DEFAULT_IMAGES: dict[str, dict[str, Any]] = {"debian-12": {"url": "http://127.0.0.1:9/debian-12.qcow2"}}
#: The default image's base volume and marker on a fake host (content-addressed: naming.base_volume).
DEFAULT_BASE = naming.base_volume(key="debian-12", url=DEFAULT_IMAGES["debian-12"]["url"])
DEFAULT_MARKER = naming.marker_volume(DEFAULT_BASE)


def qcow2_image(size: int = 4096, *, version: int = 3, backing: bool = False,
                data_file: bool = False) -> bytes:
    """Bytes that start like a qcow2 image (enough for the provider's header checks), padded to `size`."""
    header = bytearray(112)
    struct.pack_into(">4sIQI", header, 0, b"QFI\xfb", version, 112 if backing else 0, 8 if backing else 0)
    struct.pack_into(">I", header, 20, 16)  # cluster_bits
    struct.pack_into(">Q", header, 24, 2 * 1024**3)  # virtual size
    if version == 3:
        struct.pack_into(">Q", header, 72, 4 if data_file else 0)
        struct.pack_into(">I", header, 100, 112)  # header_length
    body = bytes(header) + (b"/etc/shadow" if backing else b"")
    return body + bytes(max(0, size - len(body)))


def kvm_config(*, hosts: Sequence[str], images: dict[str, dict[str, Any]] | None = None,
               machine_types: dict[str, dict[str, int]] | None = None, name: str = "kvm-test",
               **kvm_overrides: Any) -> Any:
    """A validated providers config with one kvm entry over the named hosts (insecure host keys: fake)."""
    host_list = kvm_overrides.pop("host_entries", None) or [
        {"name": h, "address": f"{h}.test:22", "user": "virt", "bridge": "br0"} for h in hosts]
    entry = {
        "name": name, "type": "kvm",
        "kvm": {
            "sshKeyFile": "/nonexistent/id_ed25519", "insecureIgnoreHostKey": True,
            "images": images if images is not None else DEFAULT_IMAGES,
            "machineTypes": machine_types or {"small": {"vcpus": 1, "memoryMiB": 512}},
            "hosts": host_list, **kvm_overrides,
        },
    }
    return parse_providers([entry]).providers[0]


def overlay_of(name: str, *, namespace: str = "ns1", cluster_id: str = "test-cluster") -> str:
    """The overlay volume the provider names for instance `name` (naming.py; defaults: the provider
    tests' request and `fake_kvm_provider`)."""
    return naming.overlay_volume(name, cluster_id=cluster_id, namespace=namespace)


def seed_of(name: str, *, namespace: str = "ns1", cluster_id: str = "test-cluster") -> str:
    return naming.seed_volume(name, cluster_id=cluster_id, namespace=namespace)


def precache_image(hyp: FakeHypervisor, key: str, data: bytes, *, url: str, sha256: str | None = None) -> str:
    """Put a finished cache entry (base volume + marker with its digest) into a fake host's pool, under
    the name the provider gives the image `key` at `url` pinned to `sha256` (or not); returns that name."""
    base = naming.base_volume(key=key, url=url, sha256=sha256)
    hyp.put_volume(base, data, fmt="qcow2")
    hyp.put_volume(naming.marker_volume(base), hashlib.sha256(data).hexdigest().encode())
    return base


# The tests' HTTP servers listen on loopback, which the egress policy denies by default: allowed here
# explicitly, as the lab's providers files do (the default itself is tested in tests/unit/policy).
LOOPBACK_EGRESS = EgressConfig.model_validate({"allowedCIDRs": ["127.0.0.0/8"]})


def fake_kvm_provider(*, hosts: Sequence[str] = ("host0",), cluster_id: str = "test-cluster",
                      images: dict[str, dict[str, Any]] | None = None, precache: bool = True,
                      machine_types: dict[str, dict[str, int]] | None = None,
                      host_kwargs: dict[str, Any] | None = None,
                      egress: EgressConfig | None = LOOPBACK_EGRESS,
                      **kvm_overrides: Any
                      ) -> tuple[KvmProvider, FakeHypervisors]:
    """A real KvmProvider whose hosts are FakeHypervisors (see the module docstring)."""
    entry = kvm_config(hosts=hosts, images=images, machine_types=machine_types, **kvm_overrides)
    hv = FakeHypervisors([h.name for h in entry.kvm.hosts], **(host_kwargs or {}))
    if precache:
        image = qcow2_image()
        for key in entry.kvm.images:
            for hyp in hv.hosts.values():
                entry_image = entry.kvm.images[key]
                precache_image(hyp, key, image, url=entry_image.url, sha256=entry_image.sha256)
    provider = KvmProvider(name=entry.name, config=entry.kvm, cluster_id=cluster_id, dial=hv.dial,
                           egress=egress)
    return provider, hv
