"""One REMOTE procedure: its number, name and the codecs of its arguments and reply.

The table of them (rpc/procedures.py) is generated from libvirt's remote_protocol.x. The client's generic
call path encodes a procedure's arguments and decodes its reply from here, the observer names calls from
here, and a server side (tests, the fake daemon) uses decode_args / encode_ret.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xdrlib3

from .errors import ProtocolError
from .xdr import Reader, Struct


def one(value: Any) -> Any:
    """The factory of a one-field reply struct: the field's value itself."""
    return value


@dataclass(frozen=True)
class Procedure:
    """One REMOTE procedure. `ret` of None is void; a one-field ret decodes to that field's value.

    `stream` is "upload" (client to daemon) or "download" for procedures whose reply opens a stream with
    the call's serial; the generic call path refuses those.
    """

    number: int
    name: str
    args: Struct | None
    ret: Struct | None
    stream: str | None = None

    @property
    def method(self) -> str:
        return self.name.lower()

    def encode_args(self, values: Sequence[Any]) -> bytes:
        if self.args is None:
            if values:
                raise TypeError(f"{self.method} takes no arguments")
            return b""
        if len(values) != len(self.args.fields):
            raise TypeError(f"{self.method} takes {len(self.args.fields)} arguments, got {len(values)}")
        p = xdrlib3.Packer()
        self.args.pack_values(p, values, where=self.method)
        return p.get_buffer()

    def decode_args(self, payload: bytes) -> tuple[Any, ...]:
        r = Reader(payload, what=f"{self.name} args")
        if self.args is None:
            r.finish()
            return ()
        try:
            values = tuple(codec.unpack(r) for _, codec in self.args.fields)
        except EOFError:
            raise ProtocolError(f"{r.what}: truncated") from None
        r.finish()
        return values

    def decode_ret(self, payload: bytes) -> Any:
        r = Reader(payload, what=f"{self.name} reply")
        if self.ret is None:
            r.finish()
            return None
        try:
            fields = self.ret.fields
            value = fields[0][1].unpack(r) if len(fields) == 1 else self.ret.unpack(r)
        except EOFError:
            raise ProtocolError(f"{r.what}: truncated") from None
        r.finish()
        return value

    def encode_ret(self, value: Any) -> bytes:
        """The reply payload for `value` (what a server sends); used by tests and the fake server."""
        if self.ret is None:
            return b""
        p = xdrlib3.Packer()
        if len(self.ret.fields) == 1:
            self.ret.fields[0][1].pack(p, value)
        else:
            self.ret.pack(p, value)
        return p.get_buffer()
