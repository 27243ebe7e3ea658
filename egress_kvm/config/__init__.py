"""The providers file: pydantic models, loading with field-path errors, and start-up file checks."""

from .errors import ConfigError
from .files import check_kvm_files
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
