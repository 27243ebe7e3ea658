"""A parser for the XDR language (RFC 4506 section 6) as libvirt's .x protocol files use it.

It reads what remote_protocol.x, virnetprotocol.x and virkeepaliveprotocol.x contain: consts, enums,
structs, unions (switch on an int or enum, stacked cases, default, void arms), typedefs, fixed `[N]`,
variable `<N>`/`<>` and optional `*` declarations. `%` lines (C passed through to rpcgen) are skipped.
Comments are kept only where they carry meaning: the `/** @generate: ... */` block before each member
of the procedure enum becomes that member's annotations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class XParseError(ValueError):
    pass


@dataclass(frozen=True)
class Decl:
    """One declaration. `kind`: plain, fixed ([size]), var (<size>, size None = unbounded), optional (*).

    `type` is a base type name (int, unsigned int, hyper, unsigned hyper, char, unsigned char, short,
    unsigned short, bool, float, double, string, opaque) or the name of a declared type.
    """

    name: str
    type: str
    kind: str = "plain"
    size: str | None = None


@dataclass(frozen=True)
class Struct:
    name: str
    fields: tuple[Decl, ...]


@dataclass(frozen=True)
class Arm:
    cases: tuple[str, ...]  # empty: the default arm
    decl: Decl | None  # None: void


@dataclass(frozen=True)
class Union:
    name: str
    discriminant: Decl
    arms: tuple[Arm, ...]


@dataclass(frozen=True)
class EnumMember:
    name: str
    value: str
    annotations: tuple[tuple[str, str], ...] = ()  # ("generate", "both"), ("acl", "domain:read"), ...


@dataclass(frozen=True)
class Enum:
    name: str
    members: tuple[EnumMember, ...]


@dataclass(frozen=True)
class Typedef:
    decl: Decl


@dataclass
class Spec:
    """Everything one or more .x files declare, in file order."""

    consts: dict[str, str] = field(default_factory=dict)
    types: dict[str, Struct | Union | Enum | Typedef] = field(default_factory=dict)

    def add(self, name: str, item: Struct | Union | Enum | Typedef) -> None:
        if name in self.types or name in self.consts:
            raise XParseError(f"{name} declared twice")
        self.types[name] = item


_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>/\*.*?\*/)
  | (?P<line>//[^\n]*)
  | (?P<num>-?0[xX][0-9a-fA-F]+|-?\d+)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[{}();,=<>\[\]*:])
    """,
    re.VERBOSE | re.DOTALL,
)
_ANNOTATION = re.compile(r"@(\w+):\s*([^\n*]*?)\s*(?:\*/)?$", re.MULTILINE)


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, line) tokens; `%` passthrough lines dropped, line comments dropped."""
    text = re.sub(r"^%.*$", "", text, flags=re.MULTILINE)
    out: list[tuple[str, str, int]] = []
    pos = 0
    line = 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise XParseError(f"line {line}: unexpected {text[pos : pos + 20]!r}")
        kind = m.lastgroup or ""
        if kind not in ("ws", "line"):
            out.append((kind, m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str, spec: Spec) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.spec = spec
        self.comment: str | None = None  # the last comment seen, for enum annotations

    # -- token helpers -------------------------------------------------------------------------
    def _skip_comments(self) -> None:
        while self.i < len(self.toks) and self.toks[self.i][0] == "comment":
            self.comment = self.toks[self.i][1]
            self.i += 1

    def peek(self) -> str | None:
        self._skip_comments()
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def next(self) -> str:
        self._skip_comments()
        if self.i >= len(self.toks):
            raise XParseError("unexpected end of file")
        tok = self.toks[self.i][1]
        self.i += 1
        return tok

    def expect(self, want: str) -> None:
        line = self.toks[self.i][2] if self.i < len(self.toks) else -1
        got = self.next()
        if got != want:
            raise XParseError(f"line {line}: expected {want!r}, got {got!r}")

    def ident(self) -> str:
        tok = self.next()
        if not re.fullmatch(r"[A-Za-z_]\w*", tok):
            raise XParseError(f"expected a name, got {tok!r}")
        return tok

    def value(self) -> str:
        """A constant: a number or a const's name (resolved later)."""
        return self.next()

    # -- grammar ---------------------------------------------------------------------------------
    def parse(self) -> None:
        while self.peek() is not None:
            kw = self.next()
            if kw == "const":
                name = self.ident()
                self.expect("=")
                if name in self.spec.consts:
                    raise XParseError(f"const {name} declared twice")
                self.spec.consts[name] = self.value()
                self.expect(";")
            elif kw == "typedef":
                decl = self.declaration()
                if decl is None:
                    raise XParseError("typedef void")
                self.spec.add(decl.name, Typedef(decl))
                self.expect(";")
            elif kw == "struct":
                name = self.ident()
                self.spec.add(name, Struct(name, self.struct_body()))
                self.expect(";")
            elif kw == "union":
                name = self.ident()
                self.spec.add(name, self.union_body(name))
                self.expect(";")
            elif kw == "enum":
                name = self.ident()
                self.spec.add(name, Enum(name, self.enum_body()))
                self.expect(";")
            else:
                raise XParseError(f"unexpected {kw!r} at top level")

    def struct_body(self) -> tuple[Decl, ...]:
        self.expect("{")
        fields = []
        while self.peek() != "}":
            decl = self.declaration()
            if decl is None:
                raise XParseError("void field in a struct")
            fields.append(decl)
            self.expect(";")
        self.expect("}")
        return tuple(fields)

    def union_body(self, name: str) -> Union:
        self.expect("switch")
        self.expect("(")
        disc = self.declaration()
        if disc is None:
            raise XParseError(f"union {name}: void discriminant")
        self.expect(")")
        self.expect("{")
        arms: list[Arm] = []
        cases: list[str] = []
        while self.peek() != "}":
            tok = self.next()
            if tok == "case":
                cases.append(self.value())
                self.expect(":")
                if self.peek() == "case":
                    continue  # stacked cases share the next arm
            elif tok == "default":
                self.expect(":")
                cases = []
            else:
                raise XParseError(f"union {name}: expected case or default, got {tok!r}")
            arms.append(Arm(tuple(cases), self.declaration()))
            self.expect(";")
            cases = []
        self.expect("}")
        return Union(name, disc, tuple(arms))

    def enum_body(self) -> tuple[EnumMember, ...]:
        self.expect("{")
        members = []
        while True:
            self.comment = None
            name = self.ident()
            doc = self.comment
            self.expect("=")
            value = self.value()
            notes = tuple((k, v) for k, v in _ANNOTATION.findall(doc)) if doc else ()
            members.append(EnumMember(name, value, notes))
            tok = self.next()
            if tok == "}":
                return tuple(members)
            if tok != ",":
                raise XParseError(f"enum member {name}: expected ',' or '}}', got {tok!r}")

    def type_spec(self) -> str:
        tok = self.next()
        if tok == "unsigned":
            if self.peek() in ("int", "hyper", "char", "short", "long"):
                return f"unsigned {self.next()}"
            return "unsigned int"
        if tok in ("struct", "enum", "union"):
            raise XParseError(f"inline {tok} definitions are not supported")
        return tok

    def declaration(self) -> Decl | None:
        t = self.type_spec()
        if t == "void":
            return None
        if self.peek() == "*":
            self.next()
            return Decl(self.ident(), t, "optional")
        name = self.ident()
        if self.peek() == "[":
            self.next()
            size = self.value()
            self.expect("]")
            return Decl(name, t, "fixed", size)
        if self.peek() == "<":
            self.next()
            size = None if self.peek() == ">" else self.value()
            self.expect(">")
            return Decl(name, t, "var", size)
        if t in ("string", "opaque"):
            raise XParseError(f"{name}: {t} needs a size")
        return Decl(name, t)


def parse(text: str, spec: Spec | None = None) -> Spec:
    """Parse one .x file's text into `spec` (a new one if None); later files may use earlier names."""
    spec = spec if spec is not None else Spec()
    _Parser(text, spec).parse()
    return spec


def resolve(spec: Spec, value: str, external: dict[str, int]) -> int:
    """A const expression's integer value: a literal, a const of the spec, or an external C constant."""
    seen = set()
    while True:
        if re.fullmatch(r"-?0[xX][0-9a-fA-F]+", value):
            return int(value, 16)
        if re.fullmatch(r"-?\d+", value):
            return int(value)
        if value in seen:
            raise XParseError(f"const {value} refers to itself")
        seen.add(value)
        if value in spec.consts:
            value = spec.consts[value]
        elif value in external:
            return external[value]
        else:
            for item in spec.types.values():
                if isinstance(item, Enum):
                    for m in item.members:
                        if m.name == value:
                            value = m.value
                            break
                    else:
                        continue
                    break
            else:
                raise XParseError(f"unknown constant {value}")
