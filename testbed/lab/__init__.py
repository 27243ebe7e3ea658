"""The hypervisor lab: real libvirt/KVM hosts in network namespaces on this machine.

`up()` brings a lab up (or reuses a healthy one) and returns its `LabInfo` (lab.json); `down()` removes
everything it made; `host_run()` / `virsh()` run commands on one of its hosts. See docs/lab.md.
"""

from testbed.lab.info import HostInfo, ImageInfo, LabInfo
from testbed.lab.lifecycle import down, host_run, problems, unavailable_reason, up, virsh
from testbed.lab.procs import LabError

__all__ = [
    "HostInfo", "ImageInfo", "LabError", "LabInfo",
    "down", "host_run", "problems", "unavailable_reason", "up", "virsh",
]
