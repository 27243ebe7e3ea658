"""Deterministic instance names: what changes them and what does not."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given
from hypothesis import strategies as st

from egress_kvm.controller import naming
from egress_kvm.controller.desired import desired_instance
from egress_kvm.controller.naming import instance_name, legacy_user_data_digest, user_data_digest
from egress_kvm.controller.proxyspec import parse_spec
from egress_kvm.policy import namekey
from egress_kvm.providers.base import ResolvedPlacement

from .fakekube import FakeKube
from .fakeprovider import FakeProvider

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


def test_the_user_data_digest_is_keyed() -> None:
    """Without the cluster's key, a guess of the user-data (e.g. of a referenced Secret) cannot be checked
    against the name: the digest is an HMAC, not the plain sha256 names used to carry."""
    ud = b"#cloud-config\npassword: hunter2\n"
    assert user_data_digest(ud, key=b"k1") != user_data_digest(ud, key=b"k2")
    assert user_data_digest(ud, key=b"k1") != legacy_user_data_digest(ud) == hashlib.sha256(ud).hexdigest()
    a = namekey.derive(secret=b"s" * 32, cluster_id="c1")
    assert a.from_file and a != namekey.derive(secret=b"s" * 32, cluster_id="c2")
    assert a != namekey.derive(secret=b"t" * 32, cluster_id="c1")
    assert not namekey.derive(secret=None, cluster_id="c1").from_file


async def test_a_name_made_before_keying_is_kept_and_new_names_are_keyed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Upgrade: an instance named with the plain digest is not replaced; a new Proxy gets a keyed name."""
    provider = FakeProvider()
    spec = parse_spec({"provider": "kvm-home", "placement": {"zone": "nas1", "machineType": "small",
                                                             "image": "debian-13"},
                       "cloudInit": {"userData": "#cloud-config\n"}})
    proxy = {"metadata": {"namespace": "default", "name": "px1", "uid": "u-1"}}
    key = tmp_path / "key"
    key.write_bytes(b"0123456789abcdef0123456789abcdef\n")
    naming.set_name_key(namekey.load(str(key), cluster_id="c1").key)
    try:
        fresh = await desired_instance(proxy=proxy, spec=spec, providers={"kvm-home": provider},
                                       kube=FakeKube())
        legacy = instance_name(uid="u-1", provider="kvm-home", placement=fresh.resolved,
                               user_data_sha256=legacy_user_data_digest(b"#cloud-config\n"))
        assert fresh.name != legacy
        upgraded = proxy | {"status": {"instance": {"name": legacy, "zone": "nas1", "provider": "kvm-home"}}}
        kept = await desired_instance(proxy=upgraded, spec=spec, providers={"kvm-home": provider},
                                      kube=FakeKube())
        assert kept.name == legacy
    finally:
        naming.set_name_key(b"")
