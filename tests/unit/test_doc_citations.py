"""Code cites only documents inside the repo (one place for each fact, readable by whoever has the repo):
every `*.md` named in the operator's, rpc's and the test bed's source exists at the path it names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(r"[A-Za-z0-9_./-]+\.md\b")


def test_every_cited_document_is_in_the_repo() -> None:
    missing = []
    for package in ("egress_kvm", "rpc", "testbed"):
        for source in sorted((ROOT / package).rglob("*.py")):
            for name in CITED.findall(source.read_text(encoding="utf-8")):
                if not (ROOT / name).is_file():
                    missing.append(f"{source.relative_to(ROOT)}: {name}")
    assert missing == []
