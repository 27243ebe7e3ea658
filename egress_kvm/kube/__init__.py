"""Kubernetes side: API access, list+watch, status, events, leader election.

kubernetes-asyncio's generated packages are made lazy here, before any module of this package imports
them (lazyclient.py says why)."""

from egress_kvm.kube import lazyclient

lazyclient.install()
