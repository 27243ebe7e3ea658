"""The hypervisor lab: real libvirt/KVM hosts in network namespaces on this machine.

`up()` brings a lab up (or reuses a healthy one) and returns its `LabInfo` (lab.json); `down()` removes
everything it made; `host_run()` / `virsh()` run commands on one of its hosts. See docs/lab.md.
"""

from egress_kvm.lab.info import HostInfo, ImageInfo, LabInfo
from egress_kvm.lab.lifecycle import down, host_run, problems, unavailable_reason, up, virsh
from egress_kvm.lab.procs import LabError

__all__ = [
    "HostInfo", "ImageInfo", "LabError", "LabInfo",
    "down", "host_run", "problems", "unavailable_reason", "up", "virsh",
]
