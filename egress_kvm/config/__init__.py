"""The providers file: pydantic models, loading with field-path errors, and start-up file checks."""

from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .loading import load_providers_file, parse_providers
from .models import (
    DEFAULT_POOL,
    DEFAULT_SOCKET,
    DEFAULT_VENDOR_DATA,
    CpuConfig,
    HostConfig,
    ImageConfig,
    KvmConfig,
    MachineType,
    ProviderConfig,
    ProvidersConfig,
)

if TYPE_CHECKING:
    from .files import check_kvm_files

__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_SOCKET",
    "DEFAULT_VENDOR_DATA",
    "ConfigError",
    "CpuConfig",
    "HostConfig",
    "ImageConfig",
    "KvmConfig",
    "MachineType",
    "ProviderConfig",
    "ProvidersConfig",
    "check_kvm_files",
    "load_providers_file",
    "parse_providers",
]


def __getattr__(name: str) -> Any:
    # The start-up file checks parse keys with asyncssh: imported when used, so the controller's pure
    # modules (which read the models) do not load an SSH library.
    if name == "check_kvm_files":
        from .files import check_kvm_files

        return check_kvm_files
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
