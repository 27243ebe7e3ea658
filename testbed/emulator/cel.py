"""A small subset of CEL, enough for the `x-kubernetes-validations` rules CRDs write for cross-field
checks: `self` and field selection (`self.a.b`), `has(self.a.b)`, string/int/bool literals, `==`, `!=`,
`!`, `&&`, `||` and parentheses.

A real API server (>= 1.25) compiles every rule when the CRD is created and refuses one that does not
compile; the emulator does the same for rules outside this subset ("not supported by the emulator"), so
a rule it cannot check is never silently accepted. Semantics as CEL's where they matter here: `&&`/`||`
are commutative over errors (`false && error` is false, `true || error` is true), selecting an absent
field is an error ("no such key"), `has()` tests presence without selecting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

_TOKEN = re.compile(r"""\s*(?:(?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")|(?P<int>\d+)|"""
                    r"""(?P<op>==|!=|&&|\|\||[!().])|(?P<id>[A-Za-z_][A-Za-z0-9_]*))""")


class CelError(ValueError):
    """A rule that does not compile (at CRD creation) or fails at evaluation (e.g. no such key)."""


@dataclass(frozen=True)
class _Node:
    op: str  # lit | sel | has | not | and | or | eq | ne
    args: tuple[Any, ...]


def _tokens(rule: str) -> list[str]:
    out, pos = [], 0
    while pos < len(rule):
        if rule[pos:].strip() == "":
            break
        m = _TOKEN.match(rule, pos)
        if m is None or m.end() == pos:
            raise CelError(f"unexpected character at offset {pos}: {rule[pos:pos + 10]!r}")
        out.append(m.group().strip())
        pos = m.end()
    return out


class _Parser:
    def __init__(self, rule: str) -> None:
        self.toks = _tokens(rule)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise CelError(f"expected {want or 'an expression'}, got {tok or 'the end'}")
        self.i += 1
        return tok

    def parse(self) -> _Node:
        node = self.or_()
        if self.peek() is not None:
            raise CelError(f"unexpected {self.peek()!r}")
        return node

    def or_(self) -> _Node:
        node = self.and_()
        while self.peek() == "||":
            self.take()
            node = _Node("or", (node, self.and_()))
        return node

    def and_(self) -> _Node:
        node = self.cmp()
        while self.peek() == "&&":
            self.take()
            node = _Node("and", (node, self.cmp()))
        return node

    def cmp(self) -> _Node:
        node = self.unary()
        if self.peek() in ("==", "!="):
            op = "eq" if self.take() == "==" else "ne"
            node = _Node(op, (node, self.unary()))
        return node

    def unary(self) -> _Node:
        if self.peek() == "!":
            self.take()
            return _Node("not", (self.unary(),))
        return self.primary()

    def primary(self) -> _Node:
        tok = self.take()
        if tok == "(":
            node = self.or_()
            self.take(")")
            return node
        if tok == "has":
            self.take("(")
            path = self.selection(self.take())
            self.take(")")
            if not path:
                raise CelError("has() needs a field selection, e.g. has(self.x)")
            return _Node("has", tuple(path))
        if tok[0] in "'\"":
            return _Node("lit", (bytes(tok[1:-1], "utf-8").decode("unicode_escape"),))
        if tok.isdigit():
            return _Node("lit", (int(tok),))
        if tok in ("true", "false"):
            return _Node("lit", (tok == "true",))
        return _Node("sel", tuple(self.selection(tok)))

    def selection(self, first: str) -> list[str]:
        if first != "self":
            raise CelError(f"undeclared reference to {first!r} (the emulator supports self, has(), "
                           "literals, ==, !=, !, &&, ||)")
        path = []
        while self.peek() == ".":
            self.take()
            name = self.take()
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise CelError(f"expected a field name after '.', got {name!r}")
            path.append(name)
        return path


@lru_cache(maxsize=1024)
def compile_rule(rule: str) -> _Node:
    """Parsed once per rule text: a rule is checked on every write of every object of its CRD, and the
    tree (frozen nodes, tuples) is never mutated. A rule that does not compile raises each time."""
    return _Parser(rule).parse()


def _select(value: Any, path: tuple[str, ...], *, test: bool) -> Any:
    for i, name in enumerate(path):
        if not isinstance(value, dict):
            raise CelError(f"no such key: {name}")
        if name not in value:
            if test and i == len(path) - 1:
                return False
            raise CelError(f"no such key: {name}")
        value = value[name]
    return True if test else value


def evaluate(node: _Node, self_value: Any) -> Any:
    op, args = node.op, node.args
    if op == "lit":
        return args[0]
    if op == "sel":
        return _select(self_value, args, test=False)
    if op == "has":
        return _select(self_value, args, test=True)
    if op == "not":
        return not _bool(evaluate(args[0], self_value))
    if op in ("and", "or"):
        short = op == "or"  # the value that decides: true for ||, false for &&
        err: CelError | None = None
        for arg in args:
            try:
                if _bool(evaluate(arg, self_value)) is short:
                    return short
            except CelError as e:
                err = err or e
        if err is not None:
            raise err
        return not short
    left, right = evaluate(args[0], self_value), evaluate(args[1], self_value)
    if type(left) is not type(right):
        raise CelError(f"no such overload: {type(left).__name__} {'==' if op == 'eq' else '!='} "
                       f"{type(right).__name__}")
    return (left == right) if op == "eq" else (left != right)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelError(f"no such overload: expected bool, got {type(value).__name__}")
    return value


def check(rule: str, self_value: Any) -> bool:
    return bool(_bool(evaluate(compile_rule(rule), self_value)))
