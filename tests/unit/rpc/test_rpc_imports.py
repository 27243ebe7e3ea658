"""rpc/ has no import cycle, counting imports made only for type checking: each module can be read
(and replaced, as the generated ones are) on its own, and the protocol core imports no I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import rpc

PACKAGE = Path(rpc.__file__).parent


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        name = path.stem
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(a.name for a in node.names)
        edges[name] = deps - {name}
    return edges


def test_no_module_imports_itself_back_through_others() -> None:
    edges = graph()
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        for dep in sorted(edges.get(node, ())):
            if dep in stack:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep != "__init__":
                visit(dep, [*stack, dep])

    for module in sorted(edges):
        if module != "__init__":
            visit(module, [module])
    assert cycles == []


def test_the_protocol_core_imports_no_io() -> None:
    for name in ("protocol", "framing", "messages", "trace"):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        imported = {
            a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }
        imported |= {
            (n.module or "").split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.level == 0
        }
        assert not imported & {"asyncio", "socket", "asyncssh", "time", "selectors"}, name
