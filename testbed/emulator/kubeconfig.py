"""The kubeconfig that points kubectl and kubernetes-asyncio at an emulator: plain HTTP, no credentials
(the emulator accepts and ignores any bearer token)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

NAME = "emulator"


def kubeconfig(url: str, *, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": NAME, "cluster": {"server": url}}],
        "users": [{"name": NAME, "user": {}}],
        "contexts": [{"name": NAME, "context": {"cluster": NAME, "user": NAME, "namespace": namespace}}],
        "current-context": NAME,
    }


def write(path: str | os.PathLike[str], url: str, *, namespace: str = "default") -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(yaml.safe_dump(kubeconfig(url, namespace=namespace), sort_keys=False))
    os.chmod(tmp, 0o600)
    tmp.replace(p)
    return p
