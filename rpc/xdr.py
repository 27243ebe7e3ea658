"""XDR codecs for the protocol's types, built on xdrlib3's primitives, with the protocol's limits.

Each codec packs a Python value into an xdrlib3.Packer and unpacks one from a bounded reader. Limits are
checked before anything is allocated: a string or list whose declared length exceeds the protocol's
maximum, or the bytes actually left in the packet, is refused with ProtocolError without reading it.
Every codec knows its smallest wire size (`min_size`) so a list count can be checked against the bytes
left before a single element is built.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Sequence
from typing import Any

import xdrlib3

from .constants import REMOTE_STRING_MAX, VIR_UUID_BUFLEN
from .errors import ProtocolError

_ENC = "utf-8"
# surrogateescape: a name that is not valid UTF-8 still round-trips byte for byte back to the daemon.
_ERRS = "surrogateescape"


class Reader(xdrlib3.Unpacker):
    """xdrlib3's Unpacker plus the bounds checks hostile input needs."""

    def __init__(self, data: bytes, *, what: str = "payload") -> None:
        super().__init__(data)
        self._len = len(data)
        self.what = what

    def remaining(self) -> int:
        return self._len - self.get_position()

    def need(self, n: int, *, field: str) -> None:
        if n > self.remaining():
            raise ProtocolError(
                f"{self.what}: {field} needs {n} bytes, only {self.remaining()} left in the packet"
            )

    def finish(self) -> None:
        left = self.remaining()
        if left:
            raise ProtocolError(f"{self.what}: {left} unexpected trailing bytes")


class Codec:
    """One XDR type. `min_size` is the fewest bytes any value of it takes on the wire."""

    min_size: int = 4
    name: str = "value"

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def unpack(self, r: Reader) -> Any:  # pragma: no cover - interface
        raise NotImplementedError


_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")


class _Number(Codec):
    def __init__(self, name: str, fmt: struct.Struct, pack_name: str, unpack_name: str) -> None:
        self.name = name
        self._fmt = fmt
        self.min_size = fmt.size
        self._pack = getattr(xdrlib3.Packer, pack_name)
        self._unpack = getattr(xdrlib3.Unpacker, unpack_name)

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"expected an integer ({self.name}), got {type(v).__name__}")
        try:
            self._fmt.pack(v)
        except struct.error:
            raise ValueError(f"{v} out of range for {self.name}") from None
        self._pack(p, v)

    def unpack(self, r: Reader) -> int:
        r.need(self.min_size, field=self.name)
        return int(self._unpack(r))


INT = _Number("int", _I32, "pack_int", "unpack_int")
UINT = _Number("unsigned int", _U32, "pack_uint", "unpack_uint")
HYPER = _Number("hyper", _I64, "pack_hyper", "unpack_hyper")
UHYPER = _Number("unsigned hyper", _U64, "pack_uhyper", "unpack_uhyper")
#: char, unsigned char, short and enum all take 4 bytes on the wire (XDR has no smaller integer).
CHAR = INT
UCHAR = UINT
SHORT = INT
USHORT = UINT
ENUM = INT

_F64 = struct.Struct(">d")
_F32 = struct.Struct(">f")


class _Float(Codec):
    """double (8 bytes) and float (4 bytes), IEEE 754 big-endian; an int is accepted when packing."""

    def __init__(self, name: str, fmt: struct.Struct) -> None:
        self.name = name
        self._fmt = fmt
        self.min_size = fmt.size

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"expected a number ({self.name}), got {type(v).__name__}")
        try:
            data = self._fmt.pack(v)
        except (struct.error, OverflowError):
            raise ValueError(f"{v} out of range for {self.name}") from None
        p.pack_fopaque(len(data), data)

    def unpack(self, r: Reader) -> float:
        r.need(self.min_size, field=self.name)
        return float(self._fmt.unpack(bytes(r.unpack_fopaque(self.min_size)))[0])


DOUBLE = _Float("double", _F64)
FLOAT = _Float("float", _F32)


class _Bool(Codec):
    """bool: 4 bytes, 0 or 1; anything else on the wire is malformed."""

    name = "bool"

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        if not isinstance(v, bool | int) or v not in (0, 1):
            raise ValueError(f"expected a bool, got {v!r}")
        p.pack_uint(int(v))

    def unpack(self, r: Reader) -> bool:
        r.need(4, field=self.name)
        v = r.unpack_uint()
        if v > 1:
            raise ProtocolError(f"{r.what}: bool must be 0 or 1, got {v}")
        return bool(v)


BOOL = _Bool()


def check_string_len(n: int, *, limit: int, r: Reader, field: str) -> None:
    if n > limit:
        raise ProtocolError(f"{r.what}: {field} declares {n} bytes, more than the limit {limit}")
    r.need((n + 3) & ~3, field=field)


class String(Codec):
    """remote_nonnull_string (string<max>), as str."""

    def __init__(self, limit: int = REMOTE_STRING_MAX) -> None:
        self.limit = limit
        self.name = "string"

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        if not isinstance(v, str):
            raise TypeError(f"expected str, got {type(v).__name__}")
        b = v.encode(_ENC, _ERRS)
        if len(b) > self.limit:
            raise ValueError(f"string of {len(b)} bytes exceeds the protocol limit {self.limit}")
        p.pack_string(b)

    def unpack(self, r: Reader) -> str:
        r.need(4, field="string length")
        n = r.unpack_uint()
        check_string_len(n, limit=self.limit, r=r, field="string")
        return bytes(r.unpack_fstring(n)).decode(_ENC, _ERRS)


class Opaque(Codec):
    """opaque<max>, as bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.name = "opaque"

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        if not isinstance(v, bytes | bytearray | memoryview):
            raise TypeError(f"expected bytes, got {type(v).__name__}")
        if len(v) > self.limit:
            raise ValueError(f"opaque of {len(v)} bytes exceeds the protocol limit {self.limit}")
        p.pack_opaque(bytes(v))

    def unpack(self, r: Reader) -> bytes:
        r.need(4, field="opaque length")
        n = r.unpack_uint()
        check_string_len(n, limit=self.limit, r=r, field="opaque")
        return bytes(r.unpack_fopaque(n))


class FixedOpaque(Codec):
    """opaque[n] (remote_uuid is opaque[16]): exactly n bytes, no length word."""

    def __init__(self, n: int, name: str = "uuid") -> None:
        self.n = n
        self.min_size = (n + 3) & ~3
        self.name = name

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        if not isinstance(v, bytes | bytearray) or len(v) != self.n:
            raise ValueError(f"{self.name} must be exactly {self.n} bytes")
        p.pack_fopaque(self.n, bytes(v))

    def unpack(self, r: Reader) -> bytes:
        r.need(self.min_size, field=self.name)
        return bytes(r.unpack_fopaque(self.n))


UUID = FixedOpaque(VIR_UUID_BUFLEN)


class CharArray(Codec):
    """char x[n] (node_get_info.model): n ints of 4 bytes each, read as a NUL-terminated string."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.min_size = 4 * n
        self.name = f"char[{n}]"

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        b = v.encode(_ENC, _ERRS) if isinstance(v, str) else bytes(v)
        if len(b) > self.n:
            raise ValueError(f"{self.name} holds at most {self.n} bytes")
        b = b.ljust(self.n, b"\0")
        for c in b:
            p.pack_int(c - 256 if c > 127 else c)

    def unpack(self, r: Reader) -> str:
        r.need(self.min_size, field=self.name)
        raw = bytes(r.unpack_int() & 0xFF for _ in range(self.n))
        return raw.split(b"\0", 1)[0].decode(_ENC, _ERRS)


class Optional(Codec):
    """An XDR optional (`T *x`, also remote_string): a 0/1 flag, then the value when 1. None = absent."""

    def __init__(self, inner: Codec) -> None:
        self.inner = inner
        self.name = f"optional {inner.name}"

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        if v is None:
            p.pack_uint(0)
        else:
            p.pack_uint(1)
            self.inner.pack(p, v)

    def unpack(self, r: Reader) -> Any:
        r.need(4, field=self.name)
        flag = r.unpack_uint()
        if flag == 0:
            return None
        if flag != 1:
            raise ProtocolError(f"{r.what}: {self.name} flag must be 0 or 1, got {flag}")
        return self.inner.unpack(r)


class Array(Codec):
    """T x<max>: a count, then that many elements; decoded as a tuple."""

    def __init__(self, inner: Codec, limit: int) -> None:
        self.inner = inner
        self.limit = limit
        self.name = f"{inner.name}<{limit}>"

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        items = list(v)
        if len(items) > self.limit:
            raise ValueError(f"{len(items)} items exceed the protocol limit {self.limit}")
        p.pack_uint(len(items))
        for item in items:
            self.inner.pack(p, item)

    def unpack(self, r: Reader) -> tuple[Any, ...]:
        r.need(4, field=f"{self.name} count")
        n = r.unpack_uint()
        if n > self.limit:
            raise ProtocolError(f"{r.what}: {self.name} declares {n} items, more than the limit {self.limit}")
        r.need(n * self.inner.min_size, field=f"{n} items of {self.name}")
        unpack = self.inner.unpack
        return tuple(unpack(r) for _ in range(n))


class FixedArray(Codec):
    """T x[n]: exactly n elements, no count; decoded as a tuple."""

    def __init__(self, inner: Codec, n: int) -> None:
        self.inner = inner
        self.n = n
        self.min_size = n * inner.min_size
        self.name = f"{inner.name}[{n}]"

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        items = list(v)
        if len(items) != self.n:
            raise ValueError(f"{self.name} needs exactly {self.n} items, got {len(items)}")
        for item in items:
            self.inner.pack(p, item)

    def unpack(self, r: Reader) -> tuple[Any, ...]:
        r.need(self.min_size, field=self.name)
        unpack = self.inner.unpack
        return tuple(unpack(r) for _ in range(self.n))


class XdrUnion(Codec):
    """A discriminated union: the discriminant, then the arm it selects (void arms carry nothing).

    Values are `factory(discriminant, value)` (a dataclass with the discriminant's field and `value`);
    a discriminant no arm names (and no default) is refused both ways.
    """

    def __init__(
        self,
        name: str,
        discriminant: Codec,
        arms: dict[int, tuple[str, Codec] | None],
        default: tuple[str, Codec] | None,
        factory: Callable[..., Any],
    ) -> None:
        self.name = name
        self.discriminant = discriminant
        self.arms = arms
        self.default = default
        self.factory = factory
        self.min_size = discriminant.min_size
        self._disc_field = dataclasses.fields(factory)[0].name

    def _arm(self, d: int) -> tuple[str, Codec] | None:
        if d in self.arms:
            return self.arms[d]
        if self.default is not None:
            return self.default
        raise KeyError(d)

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        d = getattr(v, self._disc_field)
        try:
            arm = self._arm(d)
        except KeyError:
            raise ValueError(f"{self.name}: no arm for {self._disc_field}={d!r}") from None
        self.discriminant.pack(p, d)
        if arm is not None:
            arm[1].pack(p, v.value)

    def unpack(self, r: Reader) -> Any:
        d = self.discriminant.unpack(r)
        try:
            arm = self._arm(d)
        except KeyError:
            raise ProtocolError(f"{r.what}: {self.name}: unknown {self._disc_field} {d}") from None
        return self.factory(d, None if arm is None else arm[1].unpack(r))


class Struct(Codec):
    """A struct: fields in wire order, built into `factory(*values)` when unpacked."""

    def __init__(self, name: str, fields: Sequence[tuple[str, Codec]], factory: Callable[..., Any]) -> None:
        self.name = name
        self.fields = tuple(fields)
        self.factory = factory
        self.min_size = sum(c.min_size for _, c in self.fields)

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        for fname, codec in self.fields:
            codec.pack(p, getattr(v, fname))

    def pack_values(self, p: xdrlib3.Packer, values: Sequence[Any], *, where: str) -> None:
        """Pack positional values (call arguments); a bad one is named in the error."""
        for (fname, codec), value in zip(self.fields, values, strict=True):
            try:
                codec.pack(p, value)
            except (TypeError, ValueError) as e:
                raise type(e)(f"{where}: argument {fname}={_short(value)}: {e}") from None
            except AttributeError as e:  # not the struct the field needs (e.g. a name for a Domain)
                raise TypeError(f"{where}: argument {fname}={_short(value)}: {e}") from None

    def unpack(self, r: Reader) -> Any:
        return self.factory(*[codec.unpack(r) for _, codec in self.fields])


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
