"""Start-up checks of the files the providers file points at (SSH key, known_hosts).

A bad path must fail when the operator starts, not on the first Proxy an hour later, so the registry
runs these before building any provider. Parsing uses asyncssh, the same code that will use them.
"""

from __future__ import annotations

import asyncssh

from .errors import ConfigError
from .models import KvmConfig


def check_ssh_key(path: str, *, field: str) -> asyncssh.SSHKey:
    try:
        return asyncssh.read_private_key(path)
    except FileNotFoundError:
        raise ConfigError(f"{field}: {path!r} does not exist") from None
    except PermissionError:
        raise ConfigError(f"{field}: {path!r} is not readable (permission denied)") from None
    except IsADirectoryError:
        raise ConfigError(f"{field}: {path!r} is a directory, not a private key file") from None
    except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError, ValueError, OSError) as exc:
        raise ConfigError(f"{field}: {path!r} is not a usable unencrypted private key: {exc}") from None


def check_known_hosts(path: str, *, field: str) -> asyncssh.SSHKnownHosts:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{field}: {path!r} does not exist") from None
    except (PermissionError, IsADirectoryError) as exc:
        raise ConfigError(f"{field}: {path!r} is not readable: {exc.strerror}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{field}: {path!r} is not readable: {exc}") from None
    # asyncssh skips lines it cannot parse; a known_hosts that silently verifies nothing is worse than
    # none, so every entry must carry a public key that parses.
    entries = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if fields[0].startswith("@"):
            fields = fields[1:]
        if len(fields) < 3:
            raise ConfigError(f"{field}: {path!r} line {lineno} does not parse as known_hosts "
                              f"(expected: hosts keytype key)")
        try:
            asyncssh.import_public_key(f"{fields[1]} {fields[2]}")
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise ConfigError(
                f"{field}: {path!r} line {lineno} does not parse as known_hosts: {exc}") from None
        entries += 1
    if not entries:
        raise ConfigError(f"{field}: {path!r} has no host keys")
    try:
        known = asyncssh.import_known_hosts(text)
    except (ValueError, asyncssh.KeyImportError) as exc:
        raise ConfigError(f"{field}: {path!r} does not parse as known_hosts: {exc}") from None
    return known


def check_kvm_files(kvm: KvmConfig, *, prefix: str) -> None:
    """Raise ConfigError naming the field and path if the key or known_hosts is missing or unparsable."""
    check_ssh_key(kvm.ssh_key_file, field=f"{prefix}.sshKeyFile")
    if not kvm.insecure_ignore_host_key and kvm.known_hosts_file:
        check_known_hosts(kvm.known_hosts_file, field=f"{prefix}.knownHostsFile")
