"""A Kubernetes API server emulator for tests and the local demo (see docs/emulator.md).

`Emulator` serves the API over plain HTTP on loopback; `Api` is the same semantics without HTTP.
"""

from testbed.emulator.api import Api
from testbed.emulator.errors import ApiError
from testbed.emulator.server import Emulator
from testbed.emulator.store import Store

__all__ = ["Api", "ApiError", "Emulator", "Store"]
