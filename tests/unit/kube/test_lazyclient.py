"""kube/lazyclient.py: the same names as kubernetes-asyncio's own packages, imported on first use."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from egress_kvm.kube.lazyclient import PACKAGES, Namespace, read_namespace

DOC = '"""doc"""\n'


@pytest.mark.parametrize(("source", "expected"), [
    (DOC + "from __future__ import absolute_import\n__version__ = '1.0'\n__all__ = ['A']\n"
     "from pkg.a import A\nfrom pkg.b import B as C\nimport pkg.sub as sub\n",
     Namespace({"absolute_import": ("__future__", "absolute_import"), "A": ("pkg.a", "A"),
                "C": ("pkg.b", "B"), "sub": ("pkg.sub", None)},
               {"__version__": "1.0", "__all__": ["A"]})),
    ("", Namespace({}, {})),
    ("import json\n", Namespace({"json": ("json", None)}, {})),
])
def test_read_namespace(source: str, expected: Namespace) -> None:
    assert read_namespace(source) == expected


@pytest.mark.parametrize("source", [
    "from pkg.a import *\n",  # names unknown until run
    "from .a import A\n",  # relative
    "import pkg.sub\n",  # binds `pkg`, a shape these files do not have
    "X = make()\n",  # not a constant
    "if True:\n    from pkg.a import A\n",
    "def f():\n    pass\n",
    "A, B = 1, 2\n",
    "X = {[1]: 2}\n",  # literal_eval raises TypeError, not ValueError: still "anything else", not a crash
])
def test_read_namespace_refuses_anything_else(source: str) -> None:
    assert read_namespace(source) is None


def _run(code: str, stdin: str = "") -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], input=stdin, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


# For every name a package binds, what it is: the same text from the real packages and the lazy ones.
DESCRIBE = """
    import importlib, json, sys, types
    def describe(value):
        if isinstance(value, types.ModuleType):
            return "module " + value.__name__
        if isinstance(value, type):
            return f"class {value.__module__}.{value.__qualname__}"
        if type(value).__name__ == "_Feature":  # from __future__ import ...
            return "feature " + repr(value)
        return repr(value)
    names = json.load(sys.stdin)
    print(json.dumps({pkg: {n: describe(getattr(importlib.import_module(pkg), n)) for n in names[pkg]}
                      for pkg in names}))
"""


def test_lazy_packages_bind_what_the_real_ones_do() -> None:
    eager = json.loads(_run(f"""
        import importlib, json
        import kubernetes_asyncio.client
        print(json.dumps({{pkg: sorted(n for n in vars(importlib.import_module(pkg))
                                       if not n.startswith("__") or n in ("__all__", "__version__"))
                          for pkg in {list(PACKAGES)!r}}}))
    """))
    assert len(eager["kubernetes_asyncio.client.models"]) > 500  # the package as we know it
    real = json.loads(_run(DESCRIBE, json.dumps(eager)))
    lazy = json.loads(_run(textwrap.dedent("""
        import sys
        import egress_kvm.kube.k8s
        from egress_kvm.kube import lazyclient
        assert "kubernetes_asyncio" in sys.modules and not lazyclient.install()  # installed by k8s.py
        assert "kubernetes_asyncio.client.models.v1_pod" not in sys.modules
    """) + textwrap.dedent(DESCRIBE), json.dumps(eager)))
    assert lazy == real


def test_the_operator_loads_few_of_its_modules() -> None:
    out = json.loads(_run("""
        import json, sys
        import egress_kvm.operator.process
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("kubernetes_asyncio"))))
    """))
    assert "kubernetes_asyncio.client.api_client" in out
    assert not [m for m in out if m.startswith("kubernetes_asyncio.client.models.")]
    assert len(out) < 40, out  # the eager import loads ~850


def test_install_leaves_an_imported_package_alone() -> None:
    out = _run("""
        import kubernetes_asyncio.client
        real = kubernetes_asyncio.client
        from egress_kvm.kube import lazyclient
        print(lazyclient.install(), __import__("sys").modules["kubernetes_asyncio.client"] is real)
    """)
    assert out.split() == ["False", "True"]


def test_a_name_the_package_lacks_is_an_attribute_error() -> None:
    out = _run("""
        import egress_kvm.kube.k8s
        import kubernetes_asyncio.client.models as models
        print(hasattr(models, "NoSuchModel"), hasattr(models, "__wrapped__"), models.v1_pod.__name__,
              models.V1Pod.__module__)
    """)
    assert out.split() == ["False", "False", "kubernetes_asyncio.client.models.v1_pod",
                           "kubernetes_asyncio.client.models.v1_pod"]
