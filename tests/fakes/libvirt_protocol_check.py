"""Checked by mypy only (./scripts/test): the real rpc client and the in-memory fake both satisfy the
Protocol the kvm provider calls (`LibvirtApi`), and both sessions the `Session` Protocol, so a method
renamed or reshaped on either side fails the type check rather than hiding behind the fake. The kvm
provider's optional capabilities (the manager checks them with isinstance) are held the same way."""

from __future__ import annotations

import rpc
from egress_kvm.providers.base import EvictsImages, ReportsHostBack, WatchesInstances
from egress_kvm.providers.kvm.libvirt_api import LibvirtApi
from egress_kvm.providers.kvm.provider import KvmProvider
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


def evicts(provider: KvmProvider) -> EvictsImages:  # the manager's GC pass calls it when it is there
    return provider


def reports_host_back(provider: KvmProvider) -> ReportsHostBack:
    return provider


def watches_instances(provider: KvmProvider) -> WatchesInstances:  # the manager follows its events
    return provider
