"""Inspecting the first bytes of a downloaded image before any of it reaches the pool.

A user-supplied qcow2 may name a backing file or an external data file in its header; qemu would then
open that host path when the VM starts (reading host files into the guest). Such images are refused.
The header layout is qemu's docs/interop/qcow2.txt: big-endian, magic "QFI\\xfb", version 2 or 3,
backing_file_offset (u64) at byte 8, backing_file_size (u32) at 16, and for version 3
incompatible_features (u64) at 72 whose bit 2 means "external data file".
"""

from __future__ import annotations

import struct

MAGIC = b"QFI\xfb"
HEADER_NEEDED = 104  # a v3 header's fixed part; enough for every field we read
_INCOMPAT_DATA_FILE = 1 << 2


class UnsafeImageError(ValueError):
    """The image is not what its entry says, or would make qemu open a host path."""


def is_qcow2(head: bytes) -> bool:
    return head[:4] == MAGIC


def check_header(head: bytes, *, fmt: str) -> None:
    """Raise UnsafeImageError if `head` (the image's first bytes) is unsafe or not `fmt`."""
    if fmt == "raw":
        return  # attached as raw: qemu never parses a header, whatever the bytes are
    if not is_qcow2(head):
        raise UnsafeImageError("is not a qcow2 image (no QFI magic); set format: raw if it is raw")
    if len(head) < 72:
        raise UnsafeImageError("qcow2 header is truncated")
    version, backing_offset, backing_size = struct.unpack_from(">IQI", head, 4)
    if version not in (2, 3):
        raise UnsafeImageError(f"qcow2 version {version} is not supported")
    if backing_offset or backing_size:
        raise UnsafeImageError(
            "qcow2 header names a backing file; refusing an image that would open a host path")
    if version == 3:
        if len(head) < 80:
            raise UnsafeImageError("qcow2 v3 header is truncated")
        (incompatible,) = struct.unpack_from(">Q", head, 72)
        if incompatible & _INCOMPAT_DATA_FILE:
            raise UnsafeImageError(
                "qcow2 header uses an external data file; refusing an image that would open a host path")
