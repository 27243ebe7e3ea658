"""A Kubernetes API server emulator for tests and the local demo (see docs/emulator.md).

`Emulator` serves the API over plain HTTP on loopback; `Api` is the same semantics without HTTP.
"""

from egress_kvm.emulator.api import Api
from egress_kvm.emulator.errors import ApiError
from egress_kvm.emulator.server import Emulator
from egress_kvm.emulator.store import Store

__all__ = ["Api", "ApiError", "Emulator", "Store"]
