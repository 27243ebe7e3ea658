"""One REMOTE procedure: its number, name and the codecs of its arguments and reply.

The table of them (rpc/procedures.py) is generated from libvirt's remote_protocol.x. The client's generic
call path encodes a procedure's arguments and decodes its reply from here, the observer names calls from
here, and a server side (tests, the fake daemon) uses decode_args / encode_ret.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ProtocolError
from .xdr import Struct, decode_all


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
        args = self.args
        if args is None:
            if values:
                raise TypeError(f"{self.method} takes no arguments")
            return b""
        if len(values) != len(args.fields):
            raise TypeError(f"{self.method} takes {len(args.fields)} arguments, got {len(values)}")
        return args.encode_values(values, where=self.method)

    def decode_args(self, payload: bytes) -> tuple[Any, ...]:
        what = f"{self.name} args"
        if self.args is None:
            if payload:
                raise ProtocolError(f"{what}: {len(payload)} unexpected trailing bytes")
            return ()
        return tuple(decode_all(self.args.dec_values, payload, what=what))

    def decode_ret(self, payload: bytes) -> Any:
        ret = self.ret
        if ret is None:
            if payload:
                raise ProtocolError(f"{self.name} reply: {len(payload)} unexpected trailing bytes")
            return None
        fields = ret.fields
        return decode_all((fields[0][1] if len(fields) == 1 else ret).dec, payload, what=f"{self.name} reply")

    def encode_ret(self, value: Any) -> bytes:
        """The reply payload for `value` (what a server sends); used by tests and the fake server."""
        if self.ret is None:
            return b""
        out = bytearray()
        if len(self.ret.fields) == 1:
            self.ret.fields[0][1].enc(out, value)
        else:
            self.ret.enc(out, value)
        return bytes(out)
