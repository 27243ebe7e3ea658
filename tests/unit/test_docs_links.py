"""The docs' relative links lead somewhere: every `[text](path#anchor)` in the repository's Markdown names
a file that exists and, with an anchor, a heading that file has (GitHub's slugs). A user reads the docs
first; a section renamed while another page still points at its old name strands them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _markdown_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in out.stdout.split()]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for m in re.finditer(r"^#+\s+(.+)$", FENCE.sub("", path.read_text()), re.MULTILINE):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        seen.setdefault(f"{base}-{n}" if n else base, 1)
    return set(seen)


@pytest.mark.parametrize(("heading", "expected"), [
    ("Install on a real cluster from zero", "install-on-a-real-cluster-from-zero"),
    ("Check a host from the operator's point of view: preflight",
     "check-a-host-from-the-operators-point-of-view-preflight"),
    ("`--zap-*` flags", "--zap--flags"),
    ("RBAC and its trade-off", "rbac-and-its-trade-off"),
])
def test_slug_is_githubs(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_every_relative_link_and_anchor_exists() -> None:
    broken = []
    for md in _markdown_files():
        for m in LINK.finditer(FENCE.sub("", md.read_text())):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # http(s):, mailto:
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{md.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
