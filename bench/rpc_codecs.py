"""Benchmark: encode/decode of small calls by rpc's procedure table, against another revision's.

    .venv/bin/python bench/rpc_codecs.py --baseline 8727be3 [--calls 20000] [--rounds 7]

The baseline revision's rpc/ is extracted (git archive) into a temporary directory and imported as a
second package, so both run in one process, alternating rounds, on the same values; the best round of
each counts and the spread (best..median) is printed. No I/O: this is the CPU a call's payload costs
before it reaches the socket, on the path every call takes (Procedure.encode_args / decode_ret).
Prints a markdown table (docs/performance.md holds the last one).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_baseline(rev: str, into: Path) -> Any:
    """That revision's rpc/ as the package `rpc_baseline`."""
    data = subprocess.run(["git", "archive", rev, "rpc"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into)  # our own git archive
    (into / "rpc").rename(into / "rpc_baseline")
    sys.path.insert(0, str(into))
    return importlib.import_module("rpc_baseline")


def cases(mod: Any) -> list[tuple[str, Callable[[], Any]]]:
    table = importlib.import_module(f"{mod.__name__}.procedures").BY_NUMBER
    dom = mod.Domain("vm-1", bytes(range(16)), 3)
    vol = mod.StorageVol("default", "disk.qcow2", "/var/lib/libvirt/images/disk.qcow2")
    lib, lookup, state, listing, volinfo = table[157], table[23], table[212], table[273], table[98]
    r_lib = lib.encode_ret(9000000)
    r_lookup = lookup.encode_ret(dom)
    r_state = state.encode_ret(state.ret.factory(1, 1))
    r_list = listing.encode_ret(listing.ret.factory((dom,) * 10, 10))
    return [
        ("decode `connect_get_lib_version` reply", lambda: lib.decode_ret(r_lib)),
        ("encode `domain_lookup_by_name(name)`", lambda: lookup.encode_args(("vm-1",))),
        ("decode `domain_lookup_by_name` reply", lambda: lookup.decode_ret(r_lookup)),
        ("encode `domain_get_state(dom, 0)`", lambda: state.encode_args((dom, 0))),
        ("decode `domain_get_state` reply", lambda: state.decode_ret(r_state)),
        ("encode `storage_vol_get_info(vol)`", lambda: volinfo.encode_args((vol,))),
        ("decode `connect_list_all_domains` reply, 10 domains", lambda: listing.decode_ret(r_list)),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="git revision to compare with (e.g. 8727be3)")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    import rpc

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = load_baseline(args.baseline, Path(tmp))
        pairs = list(zip(cases(base), cases(rpc), strict=True))
        times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for (name, _), _ in pairs}
        for _ in range(args.rounds):
            for (name, old), (_, new) in pairs:
                for side, fn in ((0, old), (1, new)):
                    t = time.perf_counter()
                    for _ in range(args.calls):
                        fn()
                    times[name][side].append((time.perf_counter() - t) / args.calls * 1e6)
    print(f"baseline {args.baseline} vs HEAD {head.stdout.strip()}: best (median) of {args.rounds} rounds "
          f"x {args.calls} calls, alternating\n")
    print("| payload | baseline | this tree | ratio (best) |")
    print("|---|---|---|---|")
    for name, (old, new) in times.items():
        print(f"| {name} | {min(old):.2f} us ({statistics.median(old):.2f}) "
              f"| {min(new):.2f} us ({statistics.median(new):.2f}) | {min(new) / min(old):.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
