"""The NoCloud seed ISO, built in memory with pycdlib: volume label `cidata`, user-data, meta-data,
vendor-data (omitted when configured as ""), and network-config on a host with static addresses
(static_ip.py: cloud-init's NoCloud reads it as the VM's network configuration, version 2).

meta-data carries `instance-id` (cloud-init runs its per-instance modules once per id; the instance name
is unique per VM) and `local-hostname`. The bytes hold the user's cloud-init, which may carry secrets: the
ISO is only ever passed to the upload, never logged, and this module returns bytes, nothing else.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import pycdlib

VOLUME_LABEL = "cidata"


def meta_data(*, instance_id: str, hostname: str) -> bytes:
    return f"instance-id: {instance_id}\nlocal-hostname: {hostname}\n".encode()


def build_seed_iso(*, name: str, user_data: bytes, vendor_data: str,
                   network_config: bytes | None = None) -> bytes:
    files: list[tuple[str, bytes]] = [
        ("user-data", user_data),
        ("meta-data", meta_data(instance_id=name, hostname=name)),
    ]
    if vendor_data:
        files.append(("vendor-data", vendor_data.encode()))
    if network_config is not None:
        files.append(("network-config", network_config))
    iso = pycdlib.PyCdlib()
    # Joliet + Rock Ridge give cloud-init the real names (ISO9660 level 1 would mangle "user-data").
    iso.new(interchange_level=3, vol_ident=VOLUME_LABEL, joliet=3, rock_ridge="1.09")
    for index, (fname, data) in enumerate(files):
        iso9660 = f"/FILE{index}.;1"
        iso.add_fp(io.BytesIO(data), len(data), iso9660, rr_name=fname, joliet_path=f"/{fname}")
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


@dataclass(frozen=True)
class SeedContents:
    label: str
    files: dict[str, bytes]


def read_seed_iso(data: bytes) -> SeedContents:
    """The label and the files (by Rock Ridge name) of a seed ISO, for tests and the integration read-back."""
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(data))
    try:
        out: dict[str, bytes] = {}
        for child in iso.list_children(rr_path="/"):
            if child.is_dot() or child.is_dotdot():
                continue
            if child.rock_ridge is None:
                continue
            rr = child.rock_ridge.name().decode()
            buf = io.BytesIO()
            iso.get_file_from_iso_fp(buf, rr_path=f"/{rr}")
            out[rr] = buf.getvalue()
        return SeedContents(label=iso.pvd.volume_identifier.decode().strip(), files=out)
    finally:
        iso.close()
