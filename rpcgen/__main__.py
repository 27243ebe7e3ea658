"""`python -m rpcgen [--out DIR]`: regenerate the protocol modules from the vendored .x files.

Writes rpc/protocol_constants.py, rpc/types.py, rpc/procedures.py, rpc/methods.py and
docs/rpc-procedures.md under DIR (default: this checkout).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import generate

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rpcgen", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT, help="root to write rpc/ and docs/ under")
    args = ap.parse_args(argv)
    for rel, text in generate(ROOT / "rpc" / "protocol").items():
        path = args.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
