"""Write the reference tables of docs/reference/ from the code, between their markers.

Why generated: a hand-kept table of policy keys, metrics, flags or alerts drifts from the code the
day someone adds one. Each table here is read from the one place its subject is declared:

* policy keys: the validator's schema (`scheduler/policy/schema.py`, through the CRD schema
  `scheduler/policy/crd.py` builds from it) and the model's defaults (`scheduler/policy/model.py`);
* metrics: the registries that export them (`scheduler/server/metrics.py`,
  `scheduler/state/metrics.py`, `slots/autoscaler/metrics.py`, `slots/worker/metrics.py`);
* CLI: `slotsched ... --help`, run with a fixed width and no `SLOTSCHED_*` variables;
* alerts: the PrometheusRules under deploy/;
* refusal reasons: the one table of them (`scheduler/api/reasons.py`).

`python scripts/gen_docs.py` rewrites the text between `<!-- BEGIN generated: NAME -->` and
`<!-- END generated: NAME -->`; `--check` writes nothing and exits 1 naming each stale block
(tests/test_docs_reference.py runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a clone without installing

REFERENCE = ROOT / "docs" / "reference"
RULE_FILES = (
    "deploy/base/prometheus-rules.yaml",
    "deploy/components/redis/alerts/prometheus-rules.yaml",
    "deploy/components/autoscaler/prometheus-rules.yaml",
)
# The subcommands whose --help the CLI reference shows, in the order of `slotsched --help`.
CLI_COMMANDS: tuple[tuple[str, ...], ...] = (
    (),
    ("serve",),
    ("status",),
    ("policy", "validate"),
    ("policy", "apply"),
    ("policy", "crd"),
    ("simulate",),
    ("worker",),
    ("demo",),
    ("trace", "import"),
    ("trace", "samples"),
)
HELP_COLUMNS = "100"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


# --- policy keys ---------------------------------------------------------------------------------


def _defaults() -> dict[str, str]:
    """Key path -> the model's default, for the keys the schema's numeric tables map to fields."""
    from scheduler.policy import model, schema

    sections: list[tuple[tuple[str, ...], type, tuple[schema.Num, ...]]] = [
        (("spec.pool", "spec.pools[]"), model.PoolSpec, schema.POOL_FIELDS),
        (("spec.timing",), model.TimingSpec, schema.TIMING_FIELDS),
        (("spec.queue",), model.QueueSpec, schema.QUEUE_FIELDS),
        (("spec.limits",), model.LimitsSpec, schema.LIMITS_FIELDS),
        (("spec.fairness",), model.FairnessSpec, schema.FAIRNESS_FIELDS),
        (("spec.budgets[]",), model.BudgetSpec, schema.BUDGET_FIELDS),
        (("spec.budgets[].feedback",), model.BudgetFeedback, schema.BUDGET_FEEDBACK_FIELDS),
        (("spec.autoscaler", "spec.pools[].autoscaler"), model.AutoscalerSpec, schema.AUTOSCALER_FIELDS),
        (
            ("spec.autoscaler.weights", "spec.pools[].autoscaler.weights"),
            model.AutoscalerSpec,
            schema.WEIGHT_FIELDS,
        ),
        (
            ("spec.autoscaler.scaleUp", "spec.pools[].autoscaler.scaleUp"),
            model.AutoscalerSpec,
            schema.SCALE_UP_FIELDS,
        ),
        (
            ("spec.autoscaler.scaleDown", "spec.pools[].autoscaler.scaleDown"),
            model.AutoscalerSpec,
            schema.SCALE_DOWN_FIELDS,
        ),
        (
            ("spec.autoscaler.recycle", "spec.pools[].autoscaler.recycle"),
            model.AutoscalerSpec,
            schema.RECYCLE_FIELDS,
        ),
        (
            ("spec.autoscaler.forecast", "spec.pools[].autoscaler.forecast"),
            model.ForecastSpec,
            schema.FORECAST_FIELDS,
        ),
    ]
    out: dict[str, str] = {}
    for prefixes, cls, fields in sections:
        by_attr = {f.name: f for f in dataclasses.fields(cls)}
        for num in fields:
            f = by_attr.get(num.attr)
            if f is None or f.default is dataclasses.MISSING or f.default is None:
                continue
            for prefix in prefixes:
                out[f"{prefix}.{num.key}"] = schema.fmt_number(f.default)
    return out


def _type(s: dict[str, Any]) -> str:
    if s.get("x-kubernetes-int-or-string"):
        return "integer or percent"
    t = str(s.get("type", "any"))
    if t == "array" and "items" in s:
        item = s["items"]
        inner = "object" if item.get("type") == "object" else str(item.get("type", "any"))
        return f"list of {inner}"
    return t + (" or null" if s.get("nullable") else "")


def _bounds(s: dict[str, Any]) -> str:
    parts = []
    if "minimum" in s:
        op = ">" if s.get("exclusiveMinimum") else ">="
        parts.append(f"{op} {s['minimum']:g}")
    if "maximum" in s:
        parts.append(f"<= {s['maximum']:g}")
    if "maxLength" in s:
        parts.append(f"at most {s['maxLength']} chars")
    if "minItems" in s:
        parts.append(f"at least {s['minItems']} item")
    if "enum" in s:
        parts.append("one of " + ", ".join(map(str, s["enum"])))
    return ", ".join(parts)


def _walk(s: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, s
    for key, sub in (s.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}" if path else key)
    item = s.get("items")
    if isinstance(item, dict) and item.get("properties"):
        for key, sub in item["properties"].items():
            yield from _walk(sub, f"{path}[].{key}")


def policy_keys() -> str:
    from scheduler.policy.crd import policy_schema

    defaults = _defaults()
    rows = ["| key | type | bounds | default | what |", "| --- | --- | --- | --- | --- |"]
    schema = policy_schema()
    for path, s in _walk(schema["properties"]["spec"], "spec"):
        if path == "spec":
            continue
        rows.append(
            f"| `{path}` | {_type(s)} | {_cell(_bounds(s))} | {defaults.get(path, '')} "
            f"| {_cell(str(s.get('description', '')))} |"
        )
    return "\n".join(rows)


# --- metrics -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MetricRow:
    name: str
    kind: str
    labels: tuple[str, ...]
    doc: str


def _suffixed(name: str, kind: str) -> str:
    return f"{name}_total" if kind == "counter" and not name.endswith("_total") else name


def _objects(holder: object) -> Iterator[MetricRow]:
    """prometheus_client metric objects held as attributes (their label names, even unused)."""
    for metric in vars(holder).values():
        name = getattr(metric, "_name", None)
        if isinstance(name, str) and name.startswith("slotsched_"):
            kind = str(metric._type)  # noqa: SLF001 - prometheus_client keeps these private
            yield MetricRow(_suffixed(name, kind), kind, tuple(metric._labelnames), metric._documentation)  # noqa: SLF001


def _server_rows() -> Iterator[MetricRow]:
    """The scheduler's collector, scraped once against the built-in policy's core."""
    from scheduler.core.pools import Pools
    from scheduler.policy.defaults import default_policy
    from scheduler.server.metrics import Metrics

    m = Metrics()
    core = Pools(default_policy())
    m.bind(core.describe, core.describe_all)
    for collector in list(m.registry._collector_to_names):  # noqa: SLF001 - every collector, once
        for family in collector.collect():
            if not family.name.startswith("slotsched_"):
                continue
            labels: tuple[str, ...] = ()
            for sample in family.samples:
                labels = tuple(k for k in sample.labels if k not in ("le", "quantile"))
                break
            labels = tuple(getattr(family, "_labelnames", ()) or labels)
            yield MetricRow(_suffixed(family.name, family.type), family.type, labels, family.documentation)


def _sources() -> list[tuple[str, str, Callable[[], Iterator[MetricRow]]]]:
    from prometheus_client import CollectorRegistry

    from scheduler.state.metrics import StateMetrics
    from slots.autoscaler.metrics import AutoscalerMetrics
    from slots.worker.metrics import WorkerMetrics

    return [
        (
            "scheduler",
            "The scheduler's `/metrics` (`serve --metrics-listen`), every mode. `pool` is the pool "
            "of the decision (`default` for a policy of one pool; empty for a refusal before "
            "placement: a pool the policy lacks, none named of several, none matching).",
            _server_rows,
        ),
        (
            "state",
            "The scheduler with `--state redis…`. The `pool` label is there with `--leadership pool` only.",
            lambda: _objects(StateMetrics(CollectorRegistry(), pools=True)),
        ),
        (
            "autoscaler",
            "The scheduler with `--autoscaler`. The `pool` label is there when the policy has "
            "several pools (`spec.pools`) only.",
            lambda: _objects(AutoscalerMetrics(CollectorRegistry(), pooled=True)),
        ),
        (
            "worker",
            "Each reference worker's `/metrics` (`worker --metrics-listen`).",
            lambda: _objects(WorkerMetrics()),
        ),
    ]


def metrics(source: str) -> str:
    for name, note, rows in _sources():
        if name != source:
            continue
        out = [note, "", "| metric | type | labels | what |", "| --- | --- | --- | --- |"]
        for r in sorted(rows(), key=lambda r: r.name):
            labels = ", ".join(f"`{x}`" for x in r.labels)
            out.append(f"| `{r.name}` | {r.kind} | {labels} | {_cell(r.doc)} |")
        return "\n".join(out)
    raise KeyError(source)


# --- CLI -----------------------------------------------------------------------------------------


def _help(words: tuple[str, ...]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTSCHED_")}
    env["COLUMNS"] = HELP_COLUMNS
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *words, "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    return out.stdout.rstrip()


def cli() -> str:
    parts = []
    for words in CLI_COMMANDS:
        title = " ".join(("slotsched", *words))
        parts.append(f"### `{title}`\n\n```text\n{_help(words)}\n```")
    return "\n\n".join(parts)


# --- alerts --------------------------------------------------------------------------------------


def _alert_comments(text: str) -> dict[str, str]:
    """Each alert's comment lines (between `- alert:` and `expr:`): why it fires, what to check."""
    out: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"\s*- alert: (\S+)", line)
        if m:
            current = m.group(1)
            out[current] = ""
            continue
        if current is not None:
            c = re.match(r"\s*# ?(.*)", line)
            if c:
                out[current] = (out[current] + " " + c.group(1)).strip()
            else:
                current = None
    return out


def alert_rows() -> list[dict[str, str]]:
    import yaml

    rows = []
    for rel in RULE_FILES:
        text = (ROOT / rel).read_text(encoding="utf-8")
        comments = _alert_comments(text)
        doc = yaml.safe_load(text)
        for group in doc["spec"]["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                rows.append(
                    {
                        "alert": rule["alert"],
                        "severity": rule.get("labels", {}).get("severity", ""),
                        "for": rule.get("for", ""),
                        "expr": " ".join(rule["expr"].split()),
                        "summary": rule.get("annotations", {}).get("summary", ""),
                        "why": comments.get(rule["alert"], ""),
                        "file": rel,
                    }
                )
    return rows


def alerts() -> str:
    out = ["| alert | severity | for | fires when | source |", "| --- | --- | --- | --- | --- |"]
    for r in alert_rows():
        out.append(
            f"| `{r['alert']}` | {r['severity']} | {r['for']} | `{_cell(r['expr'])}` | `{r['file']}` |"
        )
    out.append("")
    out += [f"- `{r['alert']}`: {r['summary']}. {r['why']}".rstrip() for r in alert_rows()]
    return "\n".join(out)


# --- refusal reasons ---------------------------------------------------------------------------


def refusals() -> str:
    from scheduler.api import reasons

    out = [
        "| reason (metric label) | ErrorInfo reason | status | try again | retry-after | SDK error "
        "| what to do |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in reasons.REASONS:
        info = f"`{r.info}`" if r.info else "none"
        core = " (the core's)" if r.core else ""
        out.append(
            f"| `{r.metric}`{core} | {info} | {r.status} | {r.retry.value} | {r.retry_after.value} "
            f"| `{r.error}` | {_cell(r.hint)} |"
        )
    return "\n".join(out)


# --- the blocks and their files ------------------------------------------------------------------

BLOCKS: dict[str, tuple[Path, Callable[[], str]]] = {
    "policy-keys": (REFERENCE / "policy.md", policy_keys),
    "metrics-scheduler": (REFERENCE / "metrics.md", lambda: metrics("scheduler")),
    "metrics-state": (REFERENCE / "metrics.md", lambda: metrics("state")),
    "metrics-autoscaler": (REFERENCE / "metrics.md", lambda: metrics("autoscaler")),
    "metrics-worker": (REFERENCE / "metrics.md", lambda: metrics("worker")),
    "alerts": (REFERENCE / "alerts.md", alerts),
    "cli": (REFERENCE / "cli.md", cli),
    "refusals": (REFERENCE / "refusals.md", refusals),
}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN generated: {re.escape(name)} -->\n)(.*?)(<!-- END generated: {re.escape(name)} -->)",
        flags=re.S,
    )


def regenerate(check: bool) -> list[str]:
    """Rewrite every block (or, with check, only compare): the names of the stale blocks."""
    stale = []
    texts: dict[Path, str] = {}
    for name, (path, render) in BLOCKS.items():
        text = texts.get(path) or path.read_text(encoding="utf-8")
        m = _block(name).search(text)
        if m is None:
            raise SystemExit(f"{path.relative_to(ROOT)}: no markers for the generated block {name!r}")
        body = render().rstrip("\n") + "\n"
        new = text[: m.start(2)] + body + text[m.end(2) :]
        if new != text:
            stale.append(f"{path.relative_to(ROOT)}: {name}")
        texts[path] = new
    if not check:
        for path, text in texts.items():
            path.write_text(text, encoding="utf-8")
    return stale


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale block")
    args = p.parse_args()
    stale = regenerate(check=args.check)
    if args.check and stale:
        print("stale generated blocks (run python scripts/gen_docs.py):\n  " + "\n  ".join(stale))
        return 1
    if not args.check:
        print("regenerated: " + (", ".join(stale) or "nothing changed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
