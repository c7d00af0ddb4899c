"""The README's layout row for deploy/ names every component and overlay that is there, and no other."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _named(row: str, folder: str) -> set[str]:
    m = re.search(rf"`{folder}/` \(([^)]*)\)", row)
    assert m, f"the deploy/ row names no {folder}/ list"
    return set(re.findall(r"`([a-z0-9-]+)`", m.group(1)))


def test_the_layout_row_lists_every_component_and_overlay() -> None:
    readme = (ROOT / "README.md").read_text()
    row = next(ln for ln in readme.splitlines() if ln.startswith("| `deploy/` |"))
    for folder in ("components", "overlays"):
        there = {p.name for p in (ROOT / "deploy" / folder).iterdir() if p.is_dir()}
        assert _named(row, folder) == there, folder
    assert "`crd/`" in row
