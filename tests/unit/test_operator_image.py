"""The image's dependency set (deploy/image-dependencies.txt, what the Containerfile installs) holds no
libvirt binding, only wheels pinned by hash for one platform, and covers everything the operator process
imports; the build stage builds with a pinned backend. tests/e2e/test_image.py checks the built image."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPS = ROOT / "deploy" / "image-dependencies.txt"
BUILD_DEPS = ROOT / "deploy" / "image-build-dependencies.txt"


def _pinned(path: Path = DEPS) -> dict[str, tuple[str, str]]:
    out = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+) --hash=sha256:[0-9a-f]{64}\s+#\s+(\S+)", line)
        assert m, f"unparsable line in {path.name} (name==version --hash=sha256:... # wheel): {line!r}"
        out[_norm(m.group(1))] = (m.group(2), m.group(3))
    return out


def _instructions() -> str:
    text = (ROOT / "Containerfile").read_text()
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _script_constants() -> dict[str, object]:
    """PYTHON_VERSION and PLATFORMS as scripts/image-dependencies resolves with them."""
    source = (ROOT / "scripts" / "image-dependencies").read_text()
    found = {}
    for name in ("PYTHON_VERSION", "PLATFORMS"):
        m = re.search(rf"^{name} = (.+?)(?:  #.*)?$", source, re.MULTILINE)
        assert m, name
        found[name] = ast.literal_eval(m.group(1))
    return found


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
    instructions = _instructions()
    assert "libvirt" not in instructions.lower()
    assert "--no-deps" in instructions and "-r deploy/image-dependencies.txt" in instructions
    assert "--only-binary=:all:" in instructions
    users = re.findall(r"^USER\s+(\S+)", instructions, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert "apt-get" not in instructions  # nothing from the distro beyond the base image


def _pip_installs() -> list[str]:
    """Each `pip install` command of the Containerfile, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", _instructions())
    return [m.group(0) for m in re.finditer(r"pip install [^&\n]+", joined)]


def test_the_build_installs_for_the_platform_the_list_was_checked_for() -> None:
    """The same --python-version/--platform flags as the resolution, and --require-hashes: pip can put
    no other file in the image (without --platform it picked the builder's manylinux_2_34 wheel)."""
    consts = _script_constants()
    runtime = [cmd for cmd in _pip_installs() if "-r deploy/image-dependencies.txt" in cmd]
    assert len(runtime) == 1, _pip_installs()
    flags = runtime[0].split()
    assert "--require-hashes" in flags and "--no-deps" in flags
    assert flags[flags.index("--python-version") + 1] == consts["PYTHON_VERSION"]
    assert flags[flags.index("--implementation") + 1] == "cp"
    platforms = tuple(flags[i + 1] for i, f in enumerate(flags) if f == "--platform")
    assert platforms == consts["PLATFORMS"]


def test_the_build_backend_is_pinned_and_nothing_else_is_fetched() -> None:
    """setuptools comes from the hash-pinned list; the project's own wheel builds offline without
    isolation (isolation would fetch whatever setuptools PyPI serves that day)."""
    backend = _pinned(BUILD_DEPS)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert {_norm(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in requires} <= set(backend)
    installs = _pip_installs()
    assert [c for c in installs if "-r deploy/image-build-dependencies.txt" in c and "--require-hashes" in c]
    project = [c for c in installs if c.rstrip().endswith(" .")]
    assert len(project) == 1, installs
    for flag in ("--no-index", "--no-build-isolation", "--no-deps"):
        assert flag in project[0].split(), project[0]
    assert len(installs) == 3, installs  # the list, the backend, the project: no other pip install
    assert re.search(r"^ARG SOURCE_DATE_EPOCH=\d+$", _instructions(), re.MULTILINE)


def test_the_build_secret_is_mounted_never_copied() -> None:
    instructions = _instructions()
    assert "--mount=type=secret,id=ca-bundle" in instructions
    assert not re.search(r"^(COPY|ADD)\b.*(\.crt|\.pem|ca-)", instructions, re.MULTILINE | re.IGNORECASE)


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
