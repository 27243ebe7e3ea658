"""Deterministic instance names: what changes them and what does not."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from egress_kvm.controller.naming import instance_name, user_data_digest
from egress_kvm.providers.base import ResolvedPlacement

BASE = dict(uid="7c1e0b5a-1111-2222-3333-444455556666", provider="kvm-home",
            placement=ResolvedPlacement(zone="nas1", machine_type="small", image="debian-13"),
            user_data_sha256=user_data_digest(b"#cloud-config\n"))


def test_same_inputs_same_name_and_shape() -> None:
    a = instance_name(**BASE)
    assert a == instance_name(**BASE)
    assert re.fullmatch(r"proxy-[0-9a-f]{20}", a)


def test_every_provisioning_input_changes_the_name() -> None:
    names = {instance_name(**BASE)}
    for change in (dict(uid="other"), dict(provider="kvm-lab"),
                   dict(placement=ResolvedPlacement("nas2", "small", "debian-13")),
                   dict(placement=ResolvedPlacement("nas1", "large", "debian-13")),
                   dict(placement=ResolvedPlacement("nas1", "small", "https://x/y.qcow2")),
                   dict(user_data_sha256=user_data_digest(b"#cloud-config\n# v2\n"))):
        names.add(instance_name(**(BASE | change)))
    assert len(names) == 7


def test_the_name_reveals_nothing_of_the_user_data() -> None:
    assert "cloud-config" not in instance_name(**BASE)


@given(uid=st.text(min_size=1, max_size=100), provider=st.text(max_size=63), zone=st.text(max_size=300),
       mt=st.text(max_size=300), image=st.text(max_size=3000), ud=st.binary(max_size=1000))
def test_any_inputs_give_a_dns_label(uid: str, provider: str, zone: str, mt: str, image: str,
                                     ud: bytes) -> None:
    name = instance_name(uid=uid, provider=provider, placement=ResolvedPlacement(zone, mt, image),
                         user_data_sha256=user_data_digest(ud))
    assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", name)
