"""What the informer's cache keeps of a Proxy: only what the controller reads from it.

The cache holds every Proxy in the watch scope for as long as the process runs, so its size is the
operator's memory floor. A Proxy's inline cloud-init (`spec.cloudInit.userData`, up to 64 KiB) is read
fresh from the API server by the reconcile that creates the VM, never from the cache; kubectl's
last-applied-configuration annotation repeats the whole spec (user-data included); managedFields are
server bookkeeping. None of them is kept. The cache answers keys, metadata, status and the rest of the
spec (GC's judgement), and a GC verdict that would delete is always re-checked on a fresh read.
"""

from __future__ import annotations

from .interfaces import Obj

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def trimmed(obj: Obj) -> Obj:
    """A shallow copy of `obj` without the fields above (the original is not modified)."""
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    out["metadata"] = meta
    spec = out.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("cloudInit"), dict) and "userData" in spec["cloudInit"]:
        out["spec"] = {**spec, "cloudInit": {k: v for k, v in spec["cloudInit"].items() if k != "userData"}}
    return out
