"""Checked by mypy only (./scripts/test): the real rpc client and the in-memory fake both satisfy the
Protocol the kvm provider calls (`LibvirtApi`), and both sessions the `Session` Protocol, so a method
renamed or reshaped on either side fails the type check rather than hiding behind the fake."""

from __future__ import annotations

import rpc
from egress_kvm.providers.kvm.libvirt_api import LibvirtApi
from egress_kvm.providers.kvm.session import Session, SshSession

from .libvirt import FakeLibvirtClient, FakeSession


def real_client(client: rpc.Client) -> LibvirtApi:
    return client


def fake_client(client: FakeLibvirtClient) -> LibvirtApi:
    return client


def real_session(session: SshSession) -> Session:
    return session


def fake_session(session: FakeSession) -> Session:
    return session
