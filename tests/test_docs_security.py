"""docs/security.md names the test behind each guarantee: every name it gives must be a test that
exists, or the threat model claims a proof that is gone (a renamed or deleted test).

References: `tests/<file>.py::<test>` (a `[param-id]` suffix must occur in that file), `::<test>`
for the file named earlier on the same line, bare `test_<name>` (a test of some tests/ file, as
in the table of tests/test_security_table.py), and a bare `tests/<file>.py` (it must exist).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "security.md"

_REF = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)(?:\[([^\]`]*)\])?")
_BARE = re.compile(r"`(test_\w+)")
_FILE = re.compile(r"`(tests/[\w/]+\.py)`")


def _defines(text: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\(", text, re.MULTILINE) is not None


def reference_problems(doc: str, root: Path = ROOT) -> list[str]:
    """Each reference in `doc` that names no existing test, described."""
    problems: list[str] = []
    sources: dict[str, str] = {}

    def source(path: str) -> str | None:
        if path not in sources:
            file = root / path
            sources[path] = file.read_text(encoding="utf-8") if file.is_file() else ""
        return sources[path] or None

    every_test_file = sorted(str(p.relative_to(root)) for p in (root / "tests").glob("test_*.py"))
    for n, line in enumerate(doc.splitlines(), 1):
        current: str | None = None
        for m in _REF.finditer(line):
            path, name, param = m.groups()
            current = path or current
            if current is None:
                problems.append(f"line {n}: `::{name}` with no tests/<file>.py before it")
                continue
            text = source(current)
            if text is None:
                problems.append(f"line {n}: {current} does not exist")
            elif not _defines(text, name):
                problems.append(f"line {n}: {current} defines no {name}")
            elif param and f'"{param}"' not in text and f"'{param}'" not in text:
                problems.append(f"line {n}: {current} has no parameter id {param!r} for {name}")
        for m in _FILE.finditer(line):
            if source(m.group(1)) is None:
                problems.append(f"line {n}: {m.group(1)} does not exist")
        for m in _BARE.finditer(line):
            name = m.group(1)
            if not any(_defines(source(f) or "", name) for f in every_test_file):
                problems.append(f"line {n}: no tests/test_*.py defines {name}")
    return problems


def test_every_test_the_threat_model_names_exists() -> None:
    doc = DOC.read_text(encoding="utf-8")
    assert len(_REF.findall(doc)) >= 30  # the parser still reads the doc's references
    assert reference_problems(doc) == []


def test_no_placeholder_rows_remain() -> None:
    doc = DOC.read_text(encoding="utf-8")
    assert "(see " not in doc.replace("(see Credentials)", ""), "a placeholder row is left"


def test_a_missing_test_is_caught() -> None:
    doc = "\n".join(
        [
            "| a | `tests/test_docs_security.py::test_no_such_test` |",
            "| b | `tests/test_nope.py::test_x` |",
            "| c | `::test_orphan` |",
            "| d | `tests/test_docs_security.py::test_a_missing_test_is_caught[no-such-id]` |",
            "| e | `test_bare_name_nowhere` |",
            "| f | `tests/test_gone.py` |",
            "| ok | `tests/test_docs_security.py::test_no_placeholder_rows_remain`, "
            "`::test_a_missing_test_is_caught`, `tests/test_docs_security.py` |",
        ]
    )
    problems = reference_problems(doc)
    assert [p.split(":")[0] for p in problems] == [f"line {n}" for n in range(1, 7)], problems
