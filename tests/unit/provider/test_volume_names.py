"""Instance volume names carry the cluster (naming.py): only this cluster's parse back as its own."""

from __future__ import annotations

import pytest

from egress_kvm.providers.kvm import naming
from egress_kvm.providers.kvm.naming import InstanceVolumeName, VolumeKind

C1, C2 = "cluster-one", "cluster-two"
OVERLAY = naming.overlay_volume("proxy-abc", cluster_id=C1, namespace="team-a")
SEED = naming.seed_volume("proxy-abc", cluster_id=C1, namespace="team-a")
THEIRS = naming.overlay_volume("proxy-abc", cluster_id=C2, namespace="team-a")
TAG = naming.volume_tag(cluster_id=C1, namespace="team-a", name="proxy-abc")


@pytest.mark.parametrize(("volume", "parsed"), [
    (OVERLAY, InstanceVolumeName("proxy-abc", "team-a", VolumeKind.OVERLAY)),
    (SEED, InstanceVolumeName("proxy-abc", "team-a", VolumeKind.SEED)),
    (naming.overlay_volume("proxy-abc", cluster_id=C1, namespace=""),  # no namespace (tests, old callers)
     InstanceVolumeName("proxy-abc", "", VolumeKind.OVERLAY)),
    # another cluster's volume of the very same instance name and namespace: not ours
    (THEIRS, None),
    # the namespace or instance changed under the same tag: the tag no longer recomputes
    (f"proxy-abc.team-b.{TAG}.qcow2", None),
    (f"proxy-abd.team-a.{TAG}.qcow2", None),
    (f"proxy-abc.team-a.{TAG.upper()}.qcow2", None),
    (f"proxy-abc.team-a.{TAG[:-1]}.qcow2", None),
    (f"proxy-abc.team-a.{TAG}.qcow2.sha256", None),
    # legacy names (no tag: whose they are cannot be proven), bases, markers, strangers
    ("proxy-abc.qcow2", None),
    ("proxy-abc-seed.iso", None),
    ("base-debian-12.qcow2", None),
    ("base-debian-12.qcow2.sha256", None),
    ("base-0123456789abcdef.qcow2", None),
    ("someones-vm.img", None),
])
def test_parse_instance_volume(volume: str, parsed: InstanceVolumeName | None) -> None:
    assert naming.parse_instance_volume(volume, cluster_id=C1) == parsed


def test_the_other_cluster_parses_its_own_and_not_ours() -> None:
    assert naming.parse_instance_volume(THEIRS, cluster_id=C2) == InstanceVolumeName(
        "proxy-abc", "team-a", VolumeKind.OVERLAY)
    assert naming.parse_instance_volume(OVERLAY, cluster_id=C2) is None


def test_longest_names_fit_a_file_name_and_an_lvm_volume() -> None:
    name = "proxy-" + "a" * 20
    ns = "n" * 63
    longest = naming.seed_volume(name, cluster_id=C1, namespace=ns)
    assert len(longest) <= 127  # LVM's limit; a dir pool's file name allows 255
    parsed = naming.parse_instance_volume(longest, cluster_id=C1)
    assert parsed == InstanceVolumeName(name, ns, VolumeKind.SEED)
