"""The image's dependency set (deploy/image-dependencies.txt, what the Containerfile installs) holds no
libvirt binding, only wheels, and covers everything the operator process imports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPS = ROOT / "deploy" / "image-dependencies.txt"


def _pinned() -> dict[str, tuple[str, str]]:
    out = {}
    for line in DEPS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)\s+#\s+(\S+)", line)
        assert m, f"unparsable line in {DEPS.name}: {line!r}"
        out[_norm(m.group(1))] = (m.group(2), m.group(3))
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_no_libvirt_and_only_wheels() -> None:
    pinned = _pinned()
    assert pinned, "empty dependency list"
    for name, (_version, wheel) in pinned.items():
        assert "libvirt" not in name and "libvirt" not in wheel.lower(), name
        assert wheel.endswith(".whl"), f"{name} would be built from source: {wheel}"
        assert "-cp311-" in wheel or "-abi3-" in wheel or "-none-any" in wheel, wheel


def test_every_declared_dependency_is_pinned() -> None:
    pinned = _pinned()
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for spec in declared:
        name = _norm(re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0])
        assert name in pinned, f"{spec} is missing from {DEPS.name}: run scripts/image-dependencies"


def test_the_list_covers_what_the_operator_imports() -> None:
    # Import what `egress-kvm run` and `preflight` load, in a fresh interpreter, and map every
    # third-party module to its distribution: each must be in the image's list.
    code = (
        "import sys, json, importlib.metadata as md\n"
        "baseline = set(sys.modules)  # what site/.pth files load in any interpreter\n"
        "import egress_kvm.cli, egress_kvm.operator.process, egress_kvm.controller.manager\n"
        "import egress_kvm.providers.registry, egress_kvm.commands.run, egress_kvm.commands.preflight\n"
        "dists = md.packages_distributions()\n"
        "std = set(sys.stdlib_module_names)\n"
        "tops = {m.split('.')[0] for m in set(sys.modules) - baseline} - std\n"
        "tops -= {'egress_kvm', 'rpc', 'cython_runtime'}  # ours; Cython's per-extension shim\n"
        "print(json.dumps(sorted({d for t in tops for d in dists.get(t, ['?' + t])})))\n")
    used = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                     text=True, timeout=120).stdout)
    pinned = _pinned()
    # "?_x": private modules no distribution claims (Cython shims, _sysconfigdata, __mp_main__).
    missing = [d for d in used if _norm(d) not in pinned and not d.startswith("?_")]
    assert not missing, f"imported by the operator but not in the image: {missing}"
    assert not any("libvirt" in d.lower() for d in used)


def test_containerfile_installs_exactly_the_list_as_non_root() -> None:
    text = (ROOT / "Containerfile").read_text()
    instructions = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "libvirt" not in instructions.lower()
    assert "--no-deps" in instructions and "-r deploy/image-dependencies.txt" in instructions
    assert "--only-binary=:all:" in instructions
    users = re.findall(r"^USER\s+(\S+)", instructions, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert "apt-get" not in instructions  # nothing from the distro beyond the base image


def test_image_copies_no_test_bed() -> None:
    """The Containerfile copies the operator's packages only: the emulator and lab stay out of the image."""
    copied = re.findall(r"^COPY\s+(?!--from)(\S+)", (ROOT / "Containerfile").read_text(), re.MULTILINE)
    assert "egress_kvm" in copied and "rpc" in copied
    assert not [c for c in copied if c.startswith("testbed")], copied


def test_operator_code_never_imports_test_bed() -> None:
    offenders = []
    for folder in ("egress_kvm", "rpc"):
        for path in (ROOT / folder).rglob("*.py"):
            for line in path.read_text().splitlines():
                if re.match(r"\s*(from|import)\s+testbed\b", line):
                    offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert offenders == []


def test_run_loads_no_test_bed_module() -> None:
    """`egress-kvm run` builds only its own parser: nothing of `testbed` is imported on the way."""
    code = ("import sys; from egress_kvm.cli import build_parser; "
            "build_parser('run').parse_args(['run', '--namespace=x']); import egress_kvm.operator.process; "
            "print(sorted(m for m in sys.modules if m == 'testbed' or m.startswith('testbed.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    # The same check can fail: building every command's parser does load the test bed's commands.
    code_all = code.replace("build_parser('run')", "build_parser()")
    out = subprocess.run([sys.executable, "-c", code_all], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert "testbed.commands.lab" in out.stdout
