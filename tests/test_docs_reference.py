"""The docs stay true to the code: the reference tables of docs/reference/ are what
scripts/gen_docs.py makes from the code now (policy keys from the validator's schema, metrics
from their registries, CLI from --help, alerts from the rules); the operators guide says what to
do for every alert; the SDK guide names every QoS member; the README stays a front page whose
links lead somewhere."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_generated_block_matches_the_code() -> None:
    stale = _gen_docs().regenerate(check=True)
    assert not stale, f"regenerate with `python scripts/gen_docs.py`: {stale}"


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        # The series issue 39 found documented without their pool label.
        ("metrics-scheduler", "| `slotsched_refusals_total` | counter | `pool`, `reason`, `tenant` |"),
        ("metrics-scheduler", "| `slotsched_grants_total` | counter | `pool`, `class`, `tenant` |"),
        ("policy-keys", "| `spec.pools[].name` |"),
        ("policy-keys", "| `spec.fairness.shareWindowSeconds` | number | >= 0 | 0 |"),
        ("cli", "### `slotsched serve`"),
        ("alerts", "| `SlotschedNoLeader` | critical | 1m |"),
    ],
)
def test_a_generated_block_holds(block: str, expected: str) -> None:
    gen = _gen_docs()
    _, render = gen.BLOCKS[block]
    assert expected in render()


def test_the_operators_guide_says_what_to_do_for_every_alert() -> None:
    guide = (DOCS / "operators.md").read_text(encoding="utf-8")
    section = guide.split("## When an alert fires", 1)[1].split("\n## ", 1)[0]
    alerts = [row["alert"] for row in _gen_docs().alert_rows()]
    assert len(alerts) >= 10
    missing = [a for a in alerts if f"- `{a}`" not in section]
    assert not missing, f"docs/operators.md, 'When an alert fires', lacks {missing}"


def test_the_sdk_guide_and_the_readme_name_every_qos_member() -> None:
    from scheduler.client import QoS

    guide = (DOCS / "agent-runtimes.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for member in QoS:
        assert f"`QoS.{member.name}`" in guide, member
        assert f"`QoS.{member.name}`" in readme, member
        assert f'`"{member.value}"`' in guide, member


def test_no_doc_calls_the_policy_kind_cluster_scoped() -> None:
    crd = (ROOT / "deploy" / "crd" / "schedulingpolicies.slotsched.dev.yaml").read_text(encoding="utf-8")
    assert "scope: Namespaced" in crd
    guide = (DOCS / "platform-teams.md").read_text(encoding="utf-8")
    assert "**Namespaced**" in guide
    for path in [ROOT / "README.md", *DOCS.rglob("*.md"), ROOT / "deploy" / "crd" / "kustomization.yaml"]:
        assert "cluster-scoped" not in path.read_text(encoding="utf-8"), path


def test_the_overlay_table_lists_every_overlay() -> None:
    guide = (DOCS / "operators.md").read_text(encoding="utf-8")
    rows = {m.group(1) for m in re.finditer(r"^\| `([a-z0-9-]+)` \|", guide.split("## Deploy", 1)[1], re.M)}
    overlays = {p.name for p in (ROOT / "deploy" / "overlays").iterdir() if p.is_dir()}
    assert overlays <= rows, overlays - rows


MAX_CELL = 250  # characters: a sentence or two (the deploy/ row's lists are one)


def _table_cells(text: str) -> list[str]:
    cells = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|[\s:|-]+\|$", line):
            cells += [c.strip() for c in line.strip().strip("|").split(" | ")]
    return cells


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 260
    long = [c for c in _table_cells(readme) if len(c) > MAX_CELL]
    assert not long, f"README table cells over two sentences: {long}"
    for guide in ("agent-runtimes.md", "platform-teams.md", "operators.md", "security.md"):
        assert f"(docs/{guide})" in readme, guide


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_every_relative_link_of_the_docs_leads_to_a_file() -> None:
    broken = []
    for path in _markdown_files():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_sdk_guide_examples_run_against_a_server() -> None:
    """docs/agent-runtimes.md's async and sync examples, as written, against `serve`'s defaults."""
    import subprocess

    from tests.grpc_fixtures import running_server

    text = (DOCS / "agent-runtimes.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    runnable = [b for b in blocks if "asyncio.run(" in b or "with Client(" in b]
    assert len(runnable) == 2, "the guide's async and sync examples"
    with running_server() as server:  # no policy: dev mode, built-in policy, static pool
        for code in runnable:
            code = code.replace('"127.0.0.1:50051"', repr(server.target))
            out = subprocess.run(
                [sys.executable, "-c", code],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert out.returncode == 0, out.stderr
            assert re.search(r"^holding \S+/\d+", out.stdout, flags=re.M), out.stdout
