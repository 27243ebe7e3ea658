"""The proxy test image: built once by build-image.sh, cached, and served over HTTP from host0.

The cache key is the sha256 of build-image.sh itself, so the image is rebuilt exactly when its recipe
changes and otherwise reused across labs and `lab down`. A file lock keeps concurrent `lab up`s (several
developers, several test sessions) from building it twice at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from egress_kvm.log import get_logger
from testbed.lab.layout import IMAGE_PORT, LabLayout, cache_root
from testbed.lab.procs import LabError, run
from testbed.lab.web import IMAGE_SERVER, serve

log = get_logger("lab")
RECIPE = Path(__file__).with_name("build-image.sh")
TOOLS = ("mmdebstrap", "grub-mkimage", "sfdisk", "mke2fs", "qemu-img")


def recipe_key() -> str:
    return hashlib.sha256(RECIPE.read_bytes()).hexdigest()[:16]


def images_dir() -> Path:
    return cache_root() / "images"


def cached_image_path() -> Path:
    return images_dir() / f"debian12-proxy-{recipe_key()}.qcow2"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def ensure_image() -> tuple[Path, str]:
    """The cached image and its sha256, building it first if this recipe has not been built yet."""
    path = cached_image_path()
    digest_file = path.with_name(path.name + ".sha256")
    images_dir().mkdir(parents=True, exist_ok=True)
    with (images_dir() / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds the image cached
        if not (path.exists() and digest_file.exists()):
            for tool in TOOLS:
                if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
                    raise LabError(f"building the test image needs {tool} (run scripts/setup)")
            log.info("building the test image from Debian's archive", recipe=str(RECIPE), key=recipe_key())
            t0 = time.monotonic()
            env_path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
            out = run(["env", f"PATH={env_path}", "bash", str(RECIPE), str(path)], timeout=1800)
            digest_file.write_text(_sha256(path) + "\n")
            log.info("test image built", path=str(path), seconds=round(time.monotonic() - t0, 1),
                     detail=out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "")
    return path, digest_file.read_text().strip()


def serve_image(lab: LabLayout) -> dict[str, Any]:
    """Build or reuse the image, serve it from host0's bridge (:8081), and describe it for lab.json."""
    cached, digest = ensure_image()
    host0 = lab.host(0)
    directory = lab.state_dir / "image"
    directory.mkdir(parents=True, exist_ok=True)
    served = directory / cached.name
    if not served.exists():
        try:
            os.link(cached, served)  # same filesystem: no copy of a few hundred MB
        except OSError:
            shutil.copyfile(cached, served)
    serve(host0, name=IMAGE_SERVER, directory=directory, port=IMAGE_PORT)
    return {"url": f"http://{host0.gateway}:{IMAGE_PORT}/{served.name}", "sha256": digest,
            "size": served.stat().st_size, "format": "qcow2"}
