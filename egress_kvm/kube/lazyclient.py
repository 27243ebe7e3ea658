"""kubernetes-asyncio's generated packages, each name imported on first use.

The `__init__` of `kubernetes_asyncio`, of its `client`, `client.api` and `client.models` import every API
class and every model: ~850 modules, 29 MiB of the operator's 97 MiB after its imports, for the handful of
names the operator reads. `install` puts in their place package modules with the same names, each imported
from its own module when first read (PEP 562 `__getattr__`), so a model is loaded only if an answer is
deserialised into it. The names are the package's own, read from those `__init__` files with `ast` (not
run); an `__init__` holding anything but imports, constants and its docstring (another release's shape) is
left alone, and the package is imported as usual.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("kubernetes_asyncio", "kubernetes_asyncio.client", "kubernetes_asyncio.client.api",
            "kubernetes_asyncio.client.models")


@dataclass(frozen=True)
class Namespace:
    """What an `__init__` binds: a name from a module (attribute None: the module itself), or a constant."""

    imports: dict[str, tuple[str, str | None]]
    constants: dict[str, object]


def read_namespace(source: str) -> Namespace | None:
    """The names `source` (an `__init__`) binds, or None if it does anything else."""
    imports: dict[str, tuple[str, str | None]] = {}
    constants: dict[str, object] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom):
            if node.level or node.module is None or any(a.name == "*" for a in node.names):
                return None
            for a in node.names:
                imports[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, ast.Import):
            if any(a.asname is None and "." in a.name for a in node.names):
                return None  # `import a.b` binds `a`: not a shape these files have
            for a in node.names:
                imports[a.asname or a.name] = (a.name, None)
        elif isinstance(node, ast.Assign):
            target = node.targets[0] if len(node.targets) == 1 else None
            if not isinstance(target, ast.Name):
                return None
            try:
                constants[target.id] = ast.literal_eval(node.value)
            except (ValueError, TypeError):  # TypeError: a literal that cannot be built ({[1]: 2})
                return None
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):  # a docstring
            return None
    return Namespace(imports, constants)


def install() -> bool:
    """Put the lazy packages in `sys.modules`; False (and nothing changed) if kubernetes_asyncio is already
    imported, missing, or shaped otherwise."""
    if any(name in sys.modules for name in PACKAGES):
        return False
    spec = importlib.util.find_spec(PACKAGES[0])
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    modules: dict[str, types.ModuleType] = {}
    for name in PACKAGES:
        init = root.joinpath(*name.split(".")[1:], "__init__.py")
        try:
            namespace = read_namespace(init.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            namespace = None
        if namespace is None:
            return False
        modules[name] = _package(name, init, namespace)
    sys.modules.update(modules)
    return True


def _package(name: str, init: Path, namespace: Namespace) -> types.ModuleType:
    module = types.ModuleType(name)
    spec = importlib.machinery.ModuleSpec(name, None, origin=str(init), is_package=True)
    spec.submodule_search_locations = [str(init.parent)]
    module.__spec__ = spec
    module.__file__ = str(init)
    module.__path__ = [str(init.parent)]
    vars(module).update(namespace.constants)

    def __getattr__(attr: str) -> object:
        missing = AttributeError(f"module {name!r} has no attribute {attr!r}")
        if attr in namespace.imports:
            source, member = namespace.imports[attr]
        elif attr.startswith("__"):
            raise missing
        else:  # a submodule: the eager package has each as an attribute once its __init__ imported it
            source, member = f"{name}.{attr}", None
        try:
            value: object = importlib.import_module(source)
        except ModuleNotFoundError as e:
            if e.name != source:
                raise
            raise missing from None
        if member is not None:
            value = getattr(value, member)
        setattr(module, attr, value)  # read once: later reads are plain attribute reads
        return value

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module
