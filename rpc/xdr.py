"""XDR codecs (RFC 4506) for the protocol's types, with the protocol's limits.

Each codec encodes a Python value by appending to a bytearray (`enc`) and decodes one from a buffer at a
position (`dec(buf, pos) -> (value, new_pos)`), with `struct` doing the byte work: encoding and decoding
small calls is on every call's path, so runs of fixed-size fields inside a struct are read with one
precompiled `struct.Struct`. `pack(packer, v)` / `unpack(reader)` wrap the same code for callers that
hold an xdrlib3 Packer or a `Reader`.

Limits are checked before anything is allocated: a string or list whose declared length exceeds the
protocol's maximum, or the bytes actually left in the packet, is refused with ProtocolError without
reading it. Every codec knows its smallest wire size (`min_size`) so a list count can be checked against
the bytes left before a single element is built. Malformed input raises ProtocolError (a short buffer:
"truncated"); bad values to encode raise TypeError/ValueError naming the expected type or the limit.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Sequence
from typing import Any, cast

import xdrlib3

from .constants import REMOTE_STRING_MAX, VIR_UUID_BUFLEN
from .errors import ProtocolError

_ENC = "utf-8"
# surrogateescape: a name that is not valid UTF-8 still round-trips byte for byte back to the daemon.
_ERRS = "surrogateescape"
_U32 = struct.Struct(">I")
_u32_pack = _U32.pack
_u32_unpack_from = _U32.unpack_from
_PAD = (b"", b"\0\0\0", b"\0\0", b"\0")  # indexed by length % 4
Decoded = tuple[Any, int]


class Reader(xdrlib3.Unpacker):
    """xdrlib3's Unpacker plus the bounds checks hostile input needs; codecs read its buffer directly."""

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


def decode_all(dec: Callable[[bytes, int], Decoded], payload: bytes, *, what: str) -> Any:
    """`dec` (a codec's dec) must consume `payload` exactly; ProtocolError prefixed with `what` otherwise."""
    try:
        value, pos = dec(payload, 0)
    except ProtocolError as e:
        raise ProtocolError(f"{what}: {e}") from None
    except (struct.error, IndexError):
        raise ProtocolError(f"{what}: truncated") from None
    if pos != len(payload):
        raise ProtocolError(f"{what}: {len(payload) - pos} unexpected trailing bytes")
    return value


class Codec:
    """One XDR type. `min_size` is the fewest bytes any value of it takes on the wire.

    `fmt` is set on fixed-size codecs that a `struct` format can read whole (no validation needed):
    a Struct reads a run of them with one unpack.
    """

    min_size: int = 4
    name: str = "value"
    fmt: str | None = None

    def _ensure(self) -> None:
        """Make this codec (and what it holds) ready for its fast path; see Struct."""

    def enc(self, out: bytearray, v: Any) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def dec(self, buf: bytes, pos: int) -> Decoded:  # pragma: no cover - interface
        raise NotImplementedError

    def pack(self, p: xdrlib3.Packer, v: Any) -> None:
        out = bytearray()
        self.enc(out, v)
        p.pack_fopaque(len(out), bytes(out))  # a multiple of 4 already: no padding added

    def unpack(self, r: Reader) -> Any:
        try:
            value, pos = self.dec(r.get_buffer(), r.get_position())
        except ProtocolError as e:
            raise ProtocolError(f"{r.what}: {e}") from None
        except (struct.error, IndexError):
            raise ProtocolError(f"{r.what}: truncated") from None
        r.set_position(pos)
        return value


def _need(buf: bytes, pos: int, n: int, field: str) -> None:
    if pos + n > len(buf):
        raise ProtocolError(f"{field} needs {n} bytes, only {len(buf) - pos} left in the packet")


class _Number(Codec):
    def __init__(self, name: str, fmt: str) -> None:
        self.name = name
        self.fmt = fmt
        s = struct.Struct(">" + fmt)
        self.min_size = s.size
        self._pack = s.pack
        self._unpack_from = s.unpack_from

    def enc(self, out: bytearray, v: Any) -> None:
        if v.__class__ is not int and (isinstance(v, bool) or not isinstance(v, int)):
            raise TypeError(f"expected an integer ({self.name}), got {type(v).__name__}")
        try:
            out += self._pack(v)
        except struct.error:
            raise ValueError(f"{v} out of range for {self.name}") from None

    def dec(self, buf: bytes, pos: int) -> Decoded:
        return self._unpack_from(buf, pos)[0], pos + self.min_size


INT = _Number("int", "i")
UINT = _Number("unsigned int", "I")
HYPER = _Number("hyper", "q")
UHYPER = _Number("unsigned hyper", "Q")
#: char, unsigned char, short and enum all take 4 bytes on the wire (XDR has no smaller integer).
CHAR = INT
UCHAR = UINT
SHORT = INT
USHORT = UINT
ENUM = INT


class _Float(Codec):
    """double (8 bytes) and float (4 bytes), IEEE 754 big-endian; an int is accepted when encoding."""

    def __init__(self, name: str, fmt: str) -> None:
        self.name = name
        self.fmt = fmt
        s = struct.Struct(">" + fmt)
        self.min_size = s.size
        self._pack = s.pack
        self._unpack_from = s.unpack_from

    def enc(self, out: bytearray, v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"expected a number ({self.name}), got {type(v).__name__}")
        try:
            out += self._pack(v)
        except (struct.error, OverflowError):
            raise ValueError(f"{v} out of range for {self.name}") from None

    def dec(self, buf: bytes, pos: int) -> Decoded:
        return float(self._unpack_from(buf, pos)[0]), pos + self.min_size


DOUBLE = _Float("double", "d")
FLOAT = _Float("float", "f")


class _Bool(Codec):
    """bool: 4 bytes, 0 or 1; anything else on the wire is malformed."""

    name = "bool"

    def enc(self, out: bytearray, v: Any) -> None:
        if not isinstance(v, int) or v not in (0, 1):
            raise ValueError(f"expected a bool, got {v!r}")
        out += _u32_pack(int(v))

    def dec(self, buf: bytes, pos: int) -> Decoded:
        (v,) = _u32_unpack_from(buf, pos)
        if v > 1:
            raise ProtocolError(f"bool must be 0 or 1, got {v}")
        return v == 1, pos + 4


BOOL = _Bool()


class String(Codec):
    """string<max> (remote_nonnull_string), as str."""

    def __init__(self, limit: int = REMOTE_STRING_MAX) -> None:
        self.limit = limit
        self.name = "string"

    def enc(self, out: bytearray, v: Any) -> None:
        if v.__class__ is not str and not isinstance(v, str):
            raise TypeError(f"expected str, got {type(v).__name__}")
        b = v.encode(_ENC, _ERRS)
        n = len(b)
        if n > self.limit:
            raise ValueError(f"string of {n} bytes exceeds the protocol limit {self.limit}")
        out += _u32_pack(n)
        out += b
        out += _PAD[n & 3]

    def dec(self, buf: bytes, pos: int) -> Decoded:
        (n,) = _u32_unpack_from(buf, pos)
        pos += 4
        if n > self.limit:
            raise ProtocolError(f"string declares {n} bytes, more than the limit {self.limit}")
        end = pos + ((n + 3) & ~3)
        if end > len(buf):
            _need(buf, pos, end - pos, "string")
        return str(buf[pos : pos + n], _ENC, _ERRS), end


class Opaque(Codec):
    """opaque<max>, as bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.name = "opaque"

    def enc(self, out: bytearray, v: Any) -> None:
        if not isinstance(v, bytes | bytearray | memoryview):
            raise TypeError(f"expected bytes, got {type(v).__name__}")
        n = len(v)
        if n > self.limit:
            raise ValueError(f"opaque of {n} bytes exceeds the protocol limit {self.limit}")
        out += _u32_pack(n)
        out += v
        out += _PAD[n & 3]

    def dec(self, buf: bytes, pos: int) -> Decoded:
        (n,) = _u32_unpack_from(buf, pos)
        pos += 4
        if n > self.limit:
            raise ProtocolError(f"opaque declares {n} bytes, more than the limit {self.limit}")
        end = pos + ((n + 3) & ~3)
        _need(buf, pos, end - pos, "opaque")
        return bytes(buf[pos : pos + n]), end


class FixedOpaque(Codec):
    """opaque[n] (remote_uuid is opaque[16]): exactly n bytes, no length word."""

    def __init__(self, n: int, name: str = "uuid") -> None:
        self.n = n
        self.min_size = (n + 3) & ~3
        self.name = name
        self.fmt = f"{n}s" + "x" * (self.min_size - n)
        self._pad = b"\0" * (self.min_size - n)

    def enc(self, out: bytearray, v: Any) -> None:
        if not isinstance(v, bytes | bytearray) or len(v) != self.n:
            raise ValueError(f"{self.name} must be exactly {self.n} bytes")
        out += v
        out += self._pad

    def dec(self, buf: bytes, pos: int) -> Decoded:
        end = pos + self.min_size
        _need(buf, pos, self.min_size, self.name)
        return bytes(buf[pos : pos + self.n]), end


UUID = FixedOpaque(VIR_UUID_BUFLEN)


class CharArray(Codec):
    """char x[n] (node_get_info.model): n ints of 4 bytes each, read as a NUL-terminated string."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.min_size = 4 * n
        self.name = f"char[{n}]"
        self._s = struct.Struct(f">{n}i")

    def enc(self, out: bytearray, v: Any) -> None:
        b = v.encode(_ENC, _ERRS) if isinstance(v, str) else bytes(v)
        if len(b) > self.n:
            raise ValueError(f"{self.name} holds at most {self.n} bytes")
        out += self._s.pack(*(c - 256 if c > 127 else c for c in b.ljust(self.n, b"\0")))

    def dec(self, buf: bytes, pos: int) -> Decoded:
        _need(buf, pos, self.min_size, self.name)
        raw = bytes(c & 0xFF for c in self._s.unpack_from(buf, pos))
        return raw.split(b"\0", 1)[0].decode(_ENC, _ERRS), pos + self.min_size


class Optional(Codec):
    """An XDR optional (`T *x`, also remote_string): a 0/1 flag, then the value when 1. None = absent."""

    def __init__(self, inner: Codec) -> None:
        self.inner = inner
        self.name = f"optional {inner.name}"

    def _ensure(self) -> None:
        self.inner._ensure()

    def enc(self, out: bytearray, v: Any) -> None:
        if v is None:
            out += b"\0\0\0\0"
        else:
            out += b"\0\0\0\1"
            self.inner.enc(out, v)

    def dec(self, buf: bytes, pos: int) -> Decoded:
        (flag,) = _u32_unpack_from(buf, pos)
        if flag == 0:
            return None, pos + 4
        if flag != 1:
            raise ProtocolError(f"{self.name} flag must be 0 or 1, got {flag}")
        return self.inner.dec(buf, pos + 4)


class Array(Codec):
    """T x<max>: a count, then that many elements; decoded as a tuple."""

    def __init__(self, inner: Codec, limit: int) -> None:
        self.inner = inner
        self.limit = limit
        self.name = f"{inner.name}<{limit}>"

    def _ensure(self) -> None:
        self.inner._ensure()

    def enc(self, out: bytearray, v: Any) -> None:
        items = v if isinstance(v, list | tuple) else list(v)
        if len(items) > self.limit:
            raise ValueError(f"{len(items)} items exceed the protocol limit {self.limit}")
        out += _u32_pack(len(items))
        enc = self.inner.enc
        for item in items:
            enc(out, item)

    def dec(self, buf: bytes, pos: int) -> Decoded:
        (n,) = _u32_unpack_from(buf, pos)
        pos += 4
        if n > self.limit:
            raise ProtocolError(f"{self.name} declares {n} items, more than the limit {self.limit}")
        _need(buf, pos, n * self.inner.min_size, f"{n} items of {self.name}")
        dec = self.inner.dec
        items: list[Any] = []
        append = items.append
        for _ in range(n):
            item, pos = dec(buf, pos)
            append(item)
        return tuple(items), pos


class FixedArray(Codec):
    """T x[n]: exactly n elements, no count; decoded as a tuple."""

    def __init__(self, inner: Codec, n: int) -> None:
        self.inner = inner
        self.n = n
        self.min_size = n * inner.min_size
        self.name = f"{inner.name}[{n}]"

    def _ensure(self) -> None:
        self.inner._ensure()

    def enc(self, out: bytearray, v: Any) -> None:
        items = list(v)
        if len(items) != self.n:
            raise ValueError(f"{self.name} needs exactly {self.n} items, got {len(items)}")
        for item in items:
            self.inner.enc(out, item)

    def dec(self, buf: bytes, pos: int) -> Decoded:
        _need(buf, pos, self.min_size, self.name)
        items: list[Any] = []
        for _ in range(self.n):
            item, pos = self.inner.dec(buf, pos)
            items.append(item)
        return tuple(items), pos


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
        self._disc_field = dataclasses.fields(cast(Any, factory))[0].name

    def _ensure(self) -> None:
        for arm in (*self.arms.values(), self.default):
            if arm is not None:
                arm[1]._ensure()

    def _arm(self, d: int) -> tuple[str, Codec] | None:
        if d in self.arms:
            return self.arms[d]
        if self.default is not None:
            return self.default
        raise KeyError(d)

    def enc(self, out: bytearray, v: Any) -> None:
        d = getattr(v, self._disc_field)
        try:
            arm = self._arm(d)
        except KeyError:
            raise ValueError(f"{self.name}: no arm for {self._disc_field}={d!r}") from None
        self.discriminant.enc(out, d)
        if arm is not None:
            arm[1].enc(out, v.value)

    def dec(self, buf: bytes, pos: int) -> Decoded:
        d, pos = self.discriminant.dec(buf, pos)
        try:
            arm = self._arm(d)
        except KeyError:
            raise ProtocolError(f"{self.name}: unknown {self._disc_field} {d}") from None
        if arm is None:
            return self.factory(d, None), pos
        value, pos = arm[1].dec(buf, pos)
        return self.factory(d, value), pos


class Struct(Codec):
    """A struct: fields in wire order, built into `factory(*values)` when decoded.

    Encoding and decoding run on every call, so each Struct compiles its own straight-line `enc`, `dec`
    and `encode_values` (the way dataclasses and namedtuple build their methods): no per-field loop, and
    consecutive fields with a `struct` format (numbers, fixed opaques) are read by one precompiled
    unpack, so a reply of two ints is one call into C. It compiles on first use (with the structs it
    holds), not at import: the table has hundreds of structs and a process uses a few.
    """

    def __init__(self, name: str, fields: Sequence[tuple[str, Codec]], factory: Callable[..., Any]) -> None:
        self.name = name
        self.fields = tuple(fields)
        self.factory = factory
        self.min_size = sum(c.min_size for _, c in self.fields)
        self._names = tuple(n for n, _ in self.fields)
        if not all(n.isidentifier() for n in self._names):
            raise ValueError(f"{name}: field names must be identifiers: {self._names}")
        self._compiled = False

    def _ensure(self) -> None:
        if not self._compiled:
            self._compiled = True  # first: a struct that (indirectly) holds itself compiles once
            for _, c in self.fields:
                c._ensure()
            self._compile()

    def _compile(self) -> None:
        ns: dict[str, Any] = {"bytearray": bytearray, "factory": self.factory}
        n = len(self.fields)
        # enc(out, v): each field's encoder on the attribute of the same name
        lines = ["def enc(out, v):"] + [f"    e{i}(out, v.{f})" for i, f in enumerate(self._names)]
        # encode_values(values, where): positional call arguments; on a bad one, the slow path names it
        args = "".join(f"a{i}, " for i in range(n))
        lines += ["def encode_values(values, *, where):", "    out = bytearray()"]
        if n:
            lines += [f"    {args} = values", "    try:"]
            lines += [f"        e{i}(out, a{i})" for i in range(n)]
            lines += ["    except (TypeError, ValueError, AttributeError):"]
            lines += ["        return named(values, where)"]
        lines += ["    return bytes(out)"]
        # dec(buf, pos): runs of fixed formats in one unpack_from, the rest through their codec's dec
        lines += ["def dec_values(buf, pos):"]
        values: list[str] = []
        run: list[str] = []
        fmt = ""

        def flush() -> None:
            nonlocal fmt
            if run:
                s = struct.Struct(">" + fmt)
                k = f"u{len(ns)}"
                ns[k] = s.unpack_from
                lines.append(f"    {', '.join(run)}, = {k}(buf, pos)")
                lines.append(f"    pos += {s.size}")
                run.clear()
                fmt = ""

        for i, (_, c) in enumerate(self.fields):
            ns[f"e{i}"] = c.enc
            if c.fmt is not None:
                run.append(f"v{i}")
                fmt += c.fmt
            else:
                flush()
                ns[f"d{i}"] = c.dec
                lines.append(f"    v{i}, pos = d{i}(buf, pos)")
            values.append(f"v{i}")
        flush()
        tup = f"({', '.join(values)},)" if values else "()"
        lines += [f"    return {tup}, pos"]
        body = "\n".join(lines[lines.index("def dec_values(buf, pos):") + 1 : -1])
        lines += ["def dec(buf, pos):", body, f"    return factory({', '.join(values)}), pos"]
        ns["named"] = self._encode_values_named
        exec(compile("\n".join(lines), f"<xdr struct {self.name}>", "exec"), ns)
        self.enc = ns["enc"]  # type: ignore[method-assign]
        self.dec = ns["dec"]  # type: ignore[method-assign]
        self.dec_values = ns["dec_values"]  # type: ignore[method-assign]
        self.encode_values = ns["encode_values"]  # type: ignore[method-assign]

    # Until the first use compiles them onto the instance, these compile and then delegate.
    def enc(self, out: bytearray, v: Any) -> None:
        self._ensure()
        self.enc(out, v)

    def dec(self, buf: bytes, pos: int) -> Decoded:
        self._ensure()
        return self.dec(buf, pos)

    def dec_values(self, buf: bytes, pos: int) -> Decoded:
        """The fields' values as a tuple, not built into the factory (call arguments)."""
        self._ensure()
        return self.dec_values(buf, pos)

    def encode_values(self, values: Sequence[Any], *, where: str) -> bytes:
        """Encode positional values (call arguments); a bad one is named in the error."""
        self._ensure()
        return self.encode_values(values, where=where)

    def _encode_values_named(self, values: Sequence[Any], where: str) -> bytes:
        out = bytearray()
        for (fname, codec), value in zip(self.fields, values, strict=True):
            try:
                codec.enc(out, value)
            except (TypeError, ValueError) as e:
                raise type(e)(f"{where}: argument {fname}={_short(value)}: {e}") from None
            except AttributeError as e:  # not the struct the field needs (e.g. a name for a Domain)
                raise TypeError(f"{where}: argument {fname}={_short(value)}: {e}") from None
        return bytes(out)

    def pack_values(self, p: xdrlib3.Packer, values: Sequence[Any], *, where: str) -> None:
        data = self.encode_values(values, where=where)
        p.pack_fopaque(len(data), data)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
