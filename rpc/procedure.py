"""One REMOTE procedure: its number, name and the codecs of its arguments and reply.

The table of them (rpc/procedures.py) is generated from libvirt's remote_protocol.x. The client's generic
call path encodes a procedure's arguments and decodes its reply from here, the observer names calls from
here, and a server side (tests, the fake daemon) uses decode_args / encode_ret.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ProtocolError
from .xdr import Decoded, Struct, decode_all


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
        # On every call's path: the codec's compiled dec and the error prefix are looked up once per
        # procedure (_ret_decoder), not per reply (docs/performance.md).
        try:
            dec, what = self._ret_dec  # type: ignore[attr-defined]
        except AttributeError:
            dec, what = self._ret_decoder()
        if dec is None:
            if payload:
                raise ProtocolError(f"{what}: {len(payload)} unexpected trailing bytes")
            return None
        try:
            value, pos = dec(payload, 0)
        except ProtocolError as e:
            raise ProtocolError(f"{what}: {e}") from None
        except (struct.error, IndexError):
            raise ProtocolError(f"{what}: truncated") from None
        if pos != len(payload):
            raise ProtocolError(f"{what}: {len(payload) - pos} unexpected trailing bytes")
        return value

    def _ret_decoder(self) -> tuple[Callable[[bytes, int], Decoded] | None, str]:
        """The reply's decoder (a one-field ret decodes to the field itself), compiled, and its name."""
        ret = self.ret
        what = f"{self.name} reply"
        if ret is None:
            pair: tuple[Callable[[bytes, int], Decoded] | None, str] = (None, what)
        else:
            codec = ret.fields[0][1] if len(ret.fields) == 1 else ret
            codec._ensure()  # a Struct's compiled dec replaces the compiling one on first use
            pair = (codec.dec, what)
        object.__setattr__(self, "_ret_dec", pair)  # frozen: a cache, not state
        return pair

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
