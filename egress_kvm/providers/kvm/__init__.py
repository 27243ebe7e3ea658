"""The KVM provider: Proxy VMs on the user's own libvirt hypervisors, reached over SSH."""

from .provider import KvmProvider

__all__ = ["KvmProvider"]
