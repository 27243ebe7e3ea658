"""The operator image, built and run on a machine with no container daemon and no registry to pull from.

The Containerfile names public bases (python:3.11-slim-bookworm to build, distroless python3-debian12
:nonroot to run) and takes others through its BUILDER / RUNTIME build args. Here both are stand-ins made
from Debian 12 packages with mmdebstrap and `podman import`: a builder with python3 and pip, and a
runtime holding python3.11 and its libraries only (no shell, no package manager, no CA store, like
distroless; uid 65532 in /etc/passwd as `nonroot`). Podman runs as root with runc (crun fails on this
kernel's hybrid cgroups) and with capped rlimits (its defaults exceed what this machine allows).

Every image is tagged by a hash of its recipe, so an unchanged recipe is never built twice: the bases
by their mmdebstrap command, the operator image by the Containerfile, the files it copies and the bases.

TLS to the package registries may be re-signed by a local CA: the build gets the system CA bundle as the
build secret `ca-bundle` (mounted for one RUN step, never in a layer), with CA_CANARY appended so a
test can prove that nothing of it reached the image.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTAINERFILE = REPO / "Containerfile"
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CA_CANARY = "# egress-kvm build secret canary 5f0c2a7e: this line must never be in an image"
CACHE_DIR = Path.home() / ".cache" / "egress-kvm"
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
# Fixed, not the commit time: the cache key is the content, so an unchanged tree is not rebuilt per
# commit. 1980-01-01 is the earliest time a zip (a wheel) can hold.
SOURCE_DATE_EPOCH = 315532800
NONROOT_UID = 65532
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_RECIPE_VERSION = 1  # bump to rebuild every base after a change this file's data does not show


def podman() -> list[str]:
    return ["podman", "--runtime", "runc", "--events-backend", "file"]


def ulimits() -> list[str]:
    """podman's default nofile/nproc exceed this machine's hard limits: cap them at what it allows."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if hard == resource.RLIM_INFINITY else hard
    return [f"--ulimit=nofile={nofile}:{nofile}", "--ulimit=nproc=32768:32768"]


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "building and running the image needs root (podman as root, mmdebstrap)"
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (scripts/setup installs them)"
    return None


@dataclass(frozen=True, kw_only=True)
class BaseRecipe:
    """A base image made from Debian packages: mmdebstrap's options and the image config podman sets."""

    name: str
    mmdebstrap: tuple[str, ...]
    config: tuple[str, ...]  # `podman import --change` instructions

    @property
    def tag(self) -> str:
        recipe = json.dumps([_RECIPE_VERSION, SUITE, MIRROR, self.mmdebstrap, self.config])
        return f"localhost/egress-kvm-{self.name}:{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"


# What distroless python3-debian12:nonroot holds that the operator needs: python3.11 and the libraries
# its stdlib links (libssl, libffi, ...), a passwd naming uid 65532, HOME, no shell. The extract variant
# unpacks packages without running their scripts, so no dpkg, apt or sh comes along.
_RUNTIME_HOOK = (
    'set -e; ln -sf python3.11 "$1/usr/bin/python3"; '
    'printf "root:x:0:0:root:/root:/sbin/nologin\\n'
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\\n"'
    ' > "$1/etc/passwd"; printf "root:x:0:\\nnonroot:x:65532:\\n" > "$1/etc/group"; '
    'mkdir -p "$1/home/nonroot" "$1/tmp"; chown 65532:65532 "$1/home/nonroot"; chmod 1777 "$1/tmp"; '
    'rm -rf "$1/var/lib/apt/lists" "$1/var/cache/apt"')
RUNTIME_BASE = BaseRecipe(
    name="runtime-base",
    mmdebstrap=("--variant=extract", "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
                "--include=python3.11-minimal,libpython3.11-stdlib,tzdata",
                f"--extract-hook={_RUNTIME_HOOK}"),
    config=(f"ENV {PATH_ENV}", f"USER {NONROOT_UID}:{NONROOT_UID}", "WORKDIR /home/nonroot"))
# What python:3.11-slim-bookworm offers the build stage: a shell, python3 with pip.
BUILDER_BASE = BaseRecipe(
    name="builder-base",
    mmdebstrap=("--variant=apt", "--include=python3,python3-pip,ca-certificates"),
    config=(f"ENV {PATH_ENV}",))


@dataclass(frozen=True, kw_only=True)
class BuiltImage:
    ref: str
    cached: bool  # True: an image of this recipe already existed, nothing was built
    seconds: float  # wall time of this call (bases included when they were built)


def _run(argv: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} ... exited {out.returncode}:\n{out.stderr[-4000:]}")
    return out


def image_exists(ref: str) -> bool:
    return subprocess.run([*podman(), "image", "exists", ref], capture_output=True).returncode == 0


@contextmanager
def _build_lock() -> Iterator[None]:
    """One build at a time on this machine (two would only duplicate work: tags are content-addressed)."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (CACHE_DIR / "image-build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_base(recipe: BaseRecipe) -> str:
    if image_exists(recipe.tag):
        return recipe.tag
    with tempfile.TemporaryDirectory(prefix="egress-kvm-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        _run(["mmdebstrap", "--quiet", *recipe.mmdebstrap, SUITE, str(rootfs), MIRROR],
             env={**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)})
        changes = [arg for c in recipe.config for arg in ("--change", c)]
        _run([*podman(), "import", *changes, str(rootfs), recipe.tag])
    return recipe.tag


def copied_sources(containerfile: Path = CONTAINERFILE) -> list[str]:
    """The build-context paths the Containerfile's COPY instructions read (not COPY --from)."""
    text = re.sub(r"\\\n", " ", containerfile.read_text())
    sources: list[str] = []
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "COPY" and not any(p.startswith("--from") for p in parts):
            sources += [p for p in parts[1:-1] if not p.startswith("--")]
    return sources


def _scratch(rel: Path) -> bool:
    """Caches tools leave in the source tree (__pycache__, .ruff_cache, ...): .containerignore keeps
    them out of the build context, so they are no part of the recipe either."""
    return any(part == "__pycache__" or part.startswith(".") for part in rel.parts)


def recipe_hash(*, bases: tuple[str, str], repo: Path = REPO) -> str:
    """Hash of everything the image is built from: the Containerfile, each file it copies, the bases."""
    digest = hashlib.sha256()
    digest.update(json.dumps([bases, SOURCE_DATE_EPOCH]).encode())
    containerfile = repo / CONTAINERFILE.name
    files = [containerfile]
    for src in copied_sources(containerfile):
        path = repo / src
        files += sorted(p for p in path.rglob("*") if p.is_file() and not _scratch(p.relative_to(path))) \
            if path.is_dir() else [path]
    for path in files:
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def build(*, rebuild: bool = False) -> BuiltImage:
    """Build the operator image on local bases, unless one of the same recipe exists (`rebuild` forces
    a build without podman's layer cache, to time a cold build or compare layer digests)."""
    t0 = time.monotonic()
    with _build_lock():
        bases = (ensure_base(BUILDER_BASE), ensure_base(RUNTIME_BASE))
        ref = f"localhost/egress-kvm:{version()}-{recipe_hash(bases=bases)}"
        if image_exists(ref) and not rebuild:
            return BuiltImage(ref=ref, cached=True, seconds=time.monotonic() - t0)
        with tempfile.TemporaryDirectory(prefix="egress-kvm-ca-") as tmp:
            bundle = Path(tmp) / "ca-bundle.pem"
            system = SYSTEM_CA_BUNDLE.read_text() if SYSTEM_CA_BUNDLE.exists() else ""
            bundle.write_text(f"{system}\n{CA_CANARY}\n")
            bundle.chmod(0o600)
            _run([*podman(), "build", "--network=host", "--pull=never", *ulimits(),
                  *(["--no-cache"] if rebuild else []),
                  f"--timestamp={SOURCE_DATE_EPOCH}", f"--build-arg=SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}",
                  f"--build-arg=BUILDER={bases[0]}", f"--build-arg=RUNTIME={bases[1]}",
                  f"--secret=id=ca-bundle,src={bundle}", "-t", ref, "-f", str(CONTAINERFILE), str(REPO)])
    return BuiltImage(ref=ref, cached=False, seconds=time.monotonic() - t0)


def layers(ref: str) -> list[str]:
    """The image's layer digests (RootFS.Layers: the same files give the same digests)."""
    out = _run([*podman(), "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref])
    return [str(digest) for digest in json.loads(out.stdout)]


def image_id(ref: str) -> str:
    return _run([*podman(), "image", "inspect", "--format", "{{.Id}}", ref]).stdout.strip()


def size_bytes(ref: str) -> int:
    return int(_run([*podman(), "image", "inspect", "--format", "{{.Size}}", ref]).stdout)


@contextmanager
def mounted(ref: str) -> Iterator[Path]:
    """The image's root filesystem, read on the host (podman as root can mount an image)."""
    path = Path(_run([*podman(), "image", "mount", ref]).stdout.strip())
    try:
        yield path
    finally:
        subprocess.run([*podman(), "image", "unmount", ref], capture_output=True)


@dataclass(frozen=True, kw_only=True)
class ContainerRun:
    """`podman run` of the operator image as deploy/manager/manager.yaml's securityContext runs it:
    uid/gid 65532, read-only root, every capability dropped, no privilege escalation, /tmp an emptyDir.
    Host network: the emulator listens on loopback and the lab's hosts are routed from the host."""

    image: str
    name: str
    mounts: tuple[tuple[Path, str], ...]  # (host path, path in the container), all read-only

    def argv(self, args: list[str]) -> list[str]:
        vols = [f"--volume={src}:{dst}:ro" for src, dst in self.mounts]
        return [*podman(), "run", "--rm", "--name", self.name, "--network=host", "--read-only",
                f"--user={NONROOT_UID}:{NONROOT_UID}", "--cap-drop=ALL", "--security-opt=no-new-privileges",
                "--tmpfs=/tmp:rw,size=16m,mode=1777", *ulimits(), *vols, self.image, *args]

    def remove(self) -> None:
        """Remove the container if it is still there (its `podman run` was killed, say)."""
        subprocess.run([*podman(), "rm", "--force", "--time=5", self.name], capture_output=True)


def main() -> int:
    """`python -m testbed.image [--rebuild]`: build (or find) the image and print what it cost."""
    import sys
    reason = unavailable_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    built = build(rebuild="--rebuild" in sys.argv[1:])
    how = "cached" if built.cached else "built"
    print(f"{built.ref} {how} in {built.seconds:.1f}s, {size_bytes(built.ref) / 1e6:.1f} MB, "
          f"layers {' '.join(d[7:19] for d in layers(built.ref))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
