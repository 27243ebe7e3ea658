"""Splitting a watch stream into JSON lines without a line-length limit.

aiohttp's `readline()` refuses lines longer than its buffer limit (128 KiB by default, 2 MiB in
kubernetes-asyncio's session), and a watch line is a whole object: a Proxy with a large inline
cloud-init, or a future field we do not control, can exceed any fixed limit and would wedge the watch
on the same event forever. So the informer reads whatever bytes arrived and splits them here.
"""

from __future__ import annotations


class LineSplitter:
    """Feed arbitrary chunks, get back complete lines (without the newline)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        if not chunk:
            return []
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            self._parts.append(chunk)  # no newline yet: keep a list, joined once (no quadratic copies)
            return []
        first = b"".join([*self._parts, pieces[0]])
        self._parts = [pieces[-1]] if pieces[-1] else []
        lines = [first, *pieces[1:-1]]
        return [line.rstrip(b"\r") for line in lines if line.strip()]

    def pending(self) -> int:
        """Bytes of an incomplete line held back."""
        return sum(len(p) for p in self._parts)
