"""report.md of a comparison: one table, then where slotsched wins and — plainly — where it does not.

Why verdicts are generated: a hand-written conclusion goes stale the day the workload changes.
Each verdict compares slotsched with the best other contender of its group on one figure, and
when slotsched loses, says why from what the winner *is* (its family): a mechanism, with the
numbers that show its price where there is one (work lost, capacity, a longer tail elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduler.sim.compare.contenders import Contender, reference
from scheduler.sim.compare.metrics import RunFigures
from scheduler.sim.compare.tenants import tenant_tables


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool
    kind: str  # s (seconds), n (count), r (ratio), w (worker-seconds)
    topic: str  # which reason explains a loss


METRICS: tuple[Metric, ...] = (
    Metric("g_p50", "Guaranteed within quota p50 time-to-slot", False, "s", "g"),
    Metric("g_p99", "Guaranteed within quota p99 time-to-slot", False, "s", "g"),
    Metric("g_max", "Guaranteed within quota max time-to-slot", False, "s", "g"),
    Metric("sla_misses", "Guaranteed SLA misses (within quota)", False, "n", "g"),
    Metric("gq_p99", "Guaranteed beyond quota p99 time-to-slot", False, "s", "gq"),
    Metric("gq_max", "Guaranteed beyond quota max time-to-slot", False, "s", "gq"),
    Metric("b_p50", "Burstable p50 time-to-slot", False, "s", "b"),
    Metric("b_p99", "Burstable p99 time-to-slot", False, "s", "b"),
    Metric("b_max", "Burstable max time-to-slot", False, "s", "b"),
    Metric("be_p50", "BestEffort p50 time-to-slot", False, "s", "be"),
    Metric("be_p99", "BestEffort p99 time-to-slot", False, "s", "be"),
    Metric("be_max", "BestEffort max wait", False, "s", "be"),
    Metric("jain", "Jain's fairness index (slot-s/weight)", True, "r", "jain"),
    Metric("jain_contended", "Jain under contention (held/weight)", True, "r", "jain"),
    Metric("work_lost", "work lost (slot-s)", False, "w", "work_lost"),
    Metric("preemptions", "preemptions", False, "n", "preemptions"),
    Metric("utilization", "utilization", True, "r", "utilization"),
    Metric("worker_seconds", "worker-seconds", False, "w", "worker_seconds"),
    Metric("scale_actions", "scale actions", False, "n", "scale_actions"),
)


def better(m: Metric, a: float, b: float) -> bool:
    """Is `a` better than `b` by more than noise? Waits: by 0.5 s and 5% (in a closed loop, a few
    seconds of capacity timing move a tail); other figures: by 1% and a step by kind."""
    step, rel = {"s": (0.5, 0.05), "n": (0.5, 0.01), "r": (0.005, 0.01), "w": (1.0, 0.01)}[m.kind]
    margin = max(step, rel * max(abs(a), abs(b)))
    return a > b + margin if m.higher_is_better else a < b - margin


def fmt(m: Metric, v: float) -> str:
    if m.kind == "s":
        return f"{v:.1f} s"
    if m.kind == "r":
        return f"{v:.1%}" if m.key == "utilization" else f"{v:.3f}"
    return f"{v:.0f}"


# ---------------------------------------------------------------- the table


NONE = "—"  # a class with no grant: no wait was measured (not a 0 s wait)
NA = "n/a"  # an average over nothing (no contended sample): no figure, not 1.000


def _waits(f: RunFigures, cls: str) -> str:
    if not f.granted(cls):
        return f"{NONE} (no grants)"
    p50, p99, mx = f.waits[cls]
    return f"{p50:.1f} / {p99:.1f} / {mx:.1f}"


def _beyond(f: RunFigures) -> str:
    n, p99, mx = f.g_beyond_quota
    return f"{n}: {p99:.1f} / {mx:.1f}" if n else "0"


def jain_c(f: RunFigures) -> str:
    return NA if f.jain_contended is None else f"{f.jain_contended:.3f}"


def table(figs: Sequence[RunFigures], target: float) -> list[str]:
    head = [
        "policy",
        "Guaranteed within quota p50/p99/max (s)",
        "G beyond quota: n, p99/max (s)",
        "Burstable p50/p99/max (s)",
        "BestEffort p50/p99/max (s)",
        f"G SLA misses (within quota, > {target:.0f} s)",
        "BE max wait (s)",
        "Jain (slot-s/weight)",
        "Jain under contention",
        "work lost (slot-s)",
        "preemptions",
        "utilization",
        "worker-s",
        "scale actions",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in figs:
        row = [
            (f"**{f.name}**" if f.name.startswith("slotsched") else f.name) + (" †" if f.stop_note else ""),
            _waits(f, "guaranteed"),
            _beyond(f),
            _waits(f, "burstable"),
            _waits(f, "besteffort"),
            str(f.sla_misses),
            f"{f.be_max_wait:.1f}" if f.granted("besteffort") else NONE,
            f"{f.jain:.3f}",
            jain_c(f),
            f"{f.work_lost:.0f}",
            str(f.preemptions),
            f"{f.utilization:.1%}",
            f"{f.worker_seconds:.0f}",
            str(f.scale_actions),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return lines


# ---------------------------------------------------------------- why slotsched lost a figure


@dataclass(frozen=True)
class Ctx:
    metric: Metric
    winner: Contender
    w: RunFigures
    s: RunFigures
    target: float
    checkpoint_s: float


def _pool(f: RunFigures) -> str:
    return f"peak {f.peak_capacity} slots, {f.worker_seconds:.0f} worker-s, utilization {f.utilization:.1%}"


def _same_core(c: Ctx) -> str:
    """Elastic contenders share the slotsched core: only the pool over time differs."""
    return (
        f"both drive the same slotsched core (same order of service, same preemption); only the pool "
        f"differs — {c.winner.name}: {_pool(c.w)}; {c.s.name}: {_pool(c.s)}. In a closed loop, when "
        "capacity arrives during the peak moves the tails."
    )


def _g(c: Ctx) -> str:
    n, fam = c.winner.name, c.winner.family
    if fam == "autoscaler":
        return _same_core(c)
    if fam == "kill":
        return (
            f"{n} evicts a victim the moment a higher class needs its slot, with no checkpoint, so "
            f"Guaranteed never waits for a yield; slotsched lets the victim checkpoint first and promises "
            f"a request within its tenant's quota only grace + checkpoint ({c.target:.0f} s; its max "
            f"within quota here: {c.s.waits['guaranteed'][2]:.1f} s). The price is in the work-lost column: "
            f"{n} threw away {c.w.work_lost:.0f} slot-s of other sessions' work, slotsched "
            f"{c.s.work_lost:.0f}."
        )
    return (
        f"at this load a slot freed (a session ended or went idle) sooner than a victim could checkpoint "
        f"under slotsched, which waits for the checkpoint (up to {c.target:.0f} s). {n} has no bound: a "
        f"Guaranteed request arriving at a full pool waits for some lease to end "
        f"(its Guaranteed max here: {c.w.waits['guaranteed'][2]:.1f} s)."
    )


_IGNORES_QUOTA = {
    "kill": "ignores quotas: any Guaranteed request evicts lower-class work at once, without checkpoint "
    "({lost:.0f} slot-s of work lost)",
    "priority": "ignores quotas: any Guaranteed request goes ahead of every Burstable and BestEffort one",
    "fifo": "ignores quotas and classes: a request beyond quota waits in the one line like any other",
    "no-queue": "ignores quotas: a request beyond quota takes whatever free slot its retry lands on",
}


def _gq(c: Ctx) -> str:
    if c.winner.family == "autoscaler":
        return _same_core(c)
    why = _IGNORES_QUOTA.get(c.winner.family, "does not hold tenants to their quotas").format(
        lost=c.w.work_lost
    )
    return (
        "slotsched holds each tenant to its Guaranteed quota (priority is a budget, design.md): a "
        "request made while the tenant already holds or waits for its whole quota waits for one of the "
        "tenant's own Guaranteed leases to end, however long that runs. Such waits are not covered by "
        f"the grace + checkpoint promise ({c.target:.0f} s), which is for requests within quota "
        f"(slotsched's max within quota: {c.s.waits['guaranteed'][2]:.1f} s). {c.winner.name} {why}."
    )


_B_WINNER = {
    "priority": "serves every Burstable request ahead of all BestEffort, whichever tenant it belongs to",
    "kill": "serves Burstable ahead of BestEffort and evicts BestEffort (without checkpoint) to do so",
    "fifo": "serves in arrival order whatever the tenant, so a large tenant waits no longer than anyone",
    "no-queue": "lets whichever retry lands on a free slot win, whatever the tenant",
}


def _b(c: Ctx) -> str:
    if c.winner.family == "autoscaler":
        return _same_core(c)
    why = _B_WINNER.get(c.winner.family, "had more capacity" if c.winner.family == "autoscaler" else "")
    return (
        "two rules of slotsched. A Burstable request below its nominal gets its slot by "
        f"checkpoint-and-yield, so it waits for a checkpoint ({c.checkpoint_s:g} s here) where a kill is "
        "instant (the median). Burstable work beyond a tenant's nominal is served in the shared tier, "
        "level with BestEffort, by weighted fair share between tenants: the largest tenants' bursts wait "
        "while smaller tenants' work runs — what fair share means, and what lengthens the tail. "
        f"{c.winner.name} {why}." + _fair_price(c)
    )


def _fair_price(c: Ctx) -> str:
    w, s = c.w.jain_contended, c.s.jain_contended
    if w is not None and s is not None and w < s:
        return f" Its Jain index under contention is lower ({w:.3f} against {s:.3f})."
    return ""


def _be(c: Ctx) -> str:
    n, fam = c.winner.name, c.winner.family
    lead = (
        "slotsched serves Guaranteed and Burstable within nominal first and asks BestEffort to yield to "
        "them (and to tenants below their share); every yield starts a new wait, counted in time-to-slot."
    )
    if fam == "autoscaler":
        return _same_core(c)
    if fam == "no-queue":
        return f"{n} ignores class: a BestEffort request that lands on a free slot keeps it. {lead}"
    if fam == "fifo":
        return f"{n} ignores class: BestEffort waits in the same line as everyone, never preempted. {lead}"
    if fam == "priority":
        return f"under {n} BestEffort, once running, is never interrupted. {lead}"
    return f"{lead} {n} did better here ({c.winner.note})."


def _jain(c: Ctx) -> str:
    if c.winner.family == "autoscaler" and c.metric.key == "jain_contended":
        return (
            f"{_same_core(c)} The index is averaged over the samples where someone waits: "
            f"{c.w.contended_samples} under {c.winner.name}, {c.s.contended_samples} under {c.s.name}"
            + (" — too few to mean much." if c.s.contended_samples < 10 else ".")
        )
    if c.winner.family == "autoscaler":
        return (
            _same_core(c) + f" Jain over totals also rises whenever the largest tenant gets less, for "
            f"any reason: under {c.winner.name} it got {c.w.top_tenant_share:.0%} of all slot-seconds, "
            f"under {c.s.name} {c.s.top_tenant_share:.0%}."
        )
    return (
        "Jain's index rewards equal slots per tenant. slotsched equalizes what tenants hold beyond "
        "their guarantees: Guaranteed quotas and Burstable nominals are served first, by design, and "
        "they differ between tenants; a tenant with little demand cannot use its share. "
        f"{c.winner.name} ({c.winner.note}) spread slots more evenly on this workload."
    )


def _work_lost(c: Ctx) -> str:
    return (
        f"slotsched lost {c.s.work_lost:.0f} slot-s: leases revoked after a missed yield deadline, or "
        f"expired under dead holders; {c.winner.name} lost {c.w.work_lost:.0f}."
    )


def _preemptions(c: Ctx) -> str:
    return (
        "slotsched preempts to keep its promises (the Guaranteed floor, Burstable nominals, weighted fair "
        f"share), each time by checkpoint-and-yield (no work lost, a checkpoint of up to "
        f"{c.checkpoint_s:.0f} s). {c.winner.name} {_less(c)} ({c.winner.note}) and pays elsewhere: "
        f"Guaranteed max within quota {c.w.waits['guaranteed'][2]:.1f} s against "
        f"{c.s.waits['guaranteed'][2]:.1f} s, Jain under contention {jain_c(c.w)} against {jain_c(c.s)}, "
        f"work lost {c.w.work_lost:.0f} slot-s."
    )


def _less(c: Ctx) -> str:
    return "never preempts" if c.w.preemptions == 0 else "preempts less"


def _utilization(c: Ctx) -> str:
    if c.winner.family == "autoscaler":
        return (
            f"utilization is the other side of worker-seconds: {c.winner.name} ran a smaller pool "
            f"({_pool(c.w)}). {_HEADROOM}"
        )
    if c.w.work_lost > 0:
        return (
            f"utilization counts busy slot-seconds, and {c.winner.name}'s include {c.w.work_lost:.0f} "
            "slot-s of killed work that had to be run again: busier, not more useful."
        )
    return (
        "slotsched's yielding leases hold their slot through the checkpoint, and idle floor slots are "
        "lent only to preemptible work (a Burstable request within nominal may not take one), so a few "
        f"slots sit idle that {c.winner.name} would fill."
    )


_HEADROOM = (
    "slotsched's autoscaler asks for busy + weighted pending + *floor headroom* (the part of the floor "
    "no Guaranteed session holds or waits for), so a Guaranteed arrival finds a free slot without "
    "preempting anyone; in quiet hours that headroom is idle workers. It scales down only to the "
    "highest recommendation of the last 300 s, and drains by checkpoint-and-yield."
)


def _paid(c: Ctx) -> str:
    w, s = c.w.waits, c.s.waits
    return (
        f"Guaranteed p99 {w['guaranteed'][1]:.1f} s against {s['guaranteed'][1]:.1f} s, "
        f"Burstable p99 {w['burstable'][1]:.0f} s against {s['burstable'][1]:.0f} s, "
        f"BestEffort max {c.w.be_max_wait:.0f} s against {c.s.be_max_wait:.0f} s, "
        f"work lost {c.w.work_lost:.0f} slot-s against {c.s.work_lost:.0f}"
    )


def _worker_seconds(c: Ctx) -> str:
    out = f"{_HEADROOM} {c.winner.name} ran a smaller pool ({_pool(c.w)}); what it paid: {_paid(c)}."
    if c.w.waits["burstable"][1] > 2 * c.s.waits["burstable"][1] + 10:
        out += (
            " A floor-blind autoscaler also shrinks the pool toward the floor: the core lends idle floor "
            "slots only to preemptible work, so Burstable requests within nominal wait beside them."
        )
    return out


def _dominates(c: Ctx) -> str:
    return (
        f"{c.winner.name} ({c.winner.note}) grows the pool only under visible pressure and lets idle "
        f"workers go as soon as nothing waits, so it runs hot ({_pool(c.w)} against {_pool(c.s)}). "
        f"{_HEADROOM} On this workload that caution bought no shorter waits."
    )


def _scale_actions(c: Ctx) -> str:
    return (
        f"{c.winner.name} changed the pool less often ({c.w.scale_actions} against {c.s.scale_actions}): "
        "slotsched's autoscaler follows weighted demand, and agent sessions' bursty demand moves it."
    )


REASONS: dict[str, Callable[[Ctx], str]] = {
    "g": _g,
    "gq": _gq,
    "b": _b,
    "be": _be,
    "jain": _jain,
    "work_lost": _work_lost,
    "preemptions": _preemptions,
    "utilization": _utilization,
    "worker_seconds": _worker_seconds,
    "scale_actions": _scale_actions,
    "dominates": _dominates,
}

WAITS = [
    m
    for m in METRICS
    if m.topic in ("g", "gq", "b", "be") and m.key != "sla_misses" and not m.key.endswith("p50")
]
COST = next(m for m in METRICS if m.key == "worker_seconds")


def _dominating(others: Sequence[Contender], by_name: dict[str, RunFigures], ref: RunFigures) -> list[Loss]:
    """Contenders cheaper than `ref` and no worse on any p99 or max wait: said once, plainly."""
    out = []
    for c in others:
        f = by_name[c.name]
        no_worse = not any(
            better(m, ref.value(m.key), f.value(m.key))
            for m in WAITS
            if ref.measured(m.key) and f.measured(m.key)
        )
        if no_worse and better(COST, f.worker_seconds, ref.worker_seconds):
            out.append(Loss(DOMINATES, c, ref, f))
    return out


DOMINATES = Metric(
    "worker_seconds", "every p99 and max wait, at fewer worker-seconds", False, "w", "dominates"
)


@dataclass(frozen=True)
class Loss:
    metric: Metric
    winner: Contender
    reference: RunFigures
    best: RunFigures


def verdicts(
    contenders: Sequence[Contender], figs: Sequence[RunFigures], target: float, checkpoint_s: float
) -> tuple[list[str], list[str]]:
    """(wins, losses) of slotsched against the best other contender of its group, per figure;
    losses with the same reason and winner are told once."""
    by_name = {f.name: f for f in figs}
    wins: list[str] = []
    found: list[Loss] = []
    for group in dict.fromkeys(c.group for c in contenders):
        ref = by_name.get(reference(group))
        # A run stopped with work left ran a shorter, different race: listed under "Unfinished
        # work", never a winner here.
        everyone = [
            c
            for c in contenders
            if c.group == group
            and c.name != reference(group)
            and c.name in by_name
            and not by_name[c.name].stop_note
        ]
        if ref is None or not everyone:
            continue
        for m in METRICS:
            if group == "static" and m.key in ("worker_seconds", "scale_actions"):
                continue  # one fixed pool: equal by construction
            if not ref.measured(m.key):
                continue  # no such figure (no grant of the class, no contended sample): no verdict
            others = [c for c in everyone if by_name[c.name].measured(m.key)]
            if not others:
                continue
            sv = ref.value(m.key)

            def goodness(c: Contender, m: Metric = m) -> float:
                v = by_name[c.name].value(m.key)
                return v if m.higher_is_better else -v

            best = max(others, key=goodness)
            bv = by_name[best.name].value(m.key)
            if better(m, bv, sv):
                found.append(Loss(m, best, ref, by_name[best.name]))
            elif better(m, sv, bv):
                wins.append(f"- {m.label}: {ref.name} {fmt(m, sv)}, best other {best.name} {fmt(m, bv)}")
            elif fmt(m, sv) == fmt(m, bv):
                wins.append(f"- {m.label}: tie — {ref.name} and {best.name} {fmt(m, sv)}")
            else:
                wins.append(
                    f"- {m.label}: tie — {ref.name} {fmt(m, sv)}, {best.name} {fmt(m, bv)} (within noise)"
                )
        if group != "static":
            found += _dominating(everyone, by_name, ref)
    losses: list[str] = []
    groups: dict[tuple[str, str, str], list[Loss]] = {}
    for loss in found:
        groups.setdefault((loss.metric.topic, loss.winner.name, loss.reference.name), []).append(loss)
    for items in groups.values():
        first = items[0]
        what = "; ".join(
            f"{x.metric.label} {fmt(x.metric, x.best.value(x.metric.key))} against "
            f"{fmt(x.metric, x.reference.value(x.metric.key))}"
            if x.metric is not DOMINATES
            else f"{x.metric.label} ({x.best.worker_seconds:.0f} against {x.reference.worker_seconds:.0f})"
            for x in items
        )
        ctx = Ctx(first.metric, first.winner, first.best, first.reference, target, checkpoint_s)
        losses.append(
            f"- **{first.winner.name}** beats {first.reference.name} on {what}. "
            f"Why: {REASONS[first.metric.topic](ctx)}"
        )
    return wins, losses


def unfinished(figs: Sequence[RunFigures]) -> list[str]:
    """Contenders that left sessions unfinished, and why: a reader must not take a short run's
    figures (fewer worker-seconds, fewer waits measured) for a better one."""
    left = [f for f in figs if f.unfinished or f.stop_note]
    if not left:
        return []
    lines = ["## Unfinished work", ""]
    for f in left:
        if f.stop_note:
            lines.append(f"- **{f.name}** ({f.completed} session(s) completed): {f.stop_note}")
        else:
            lines.append(
                f"- **{f.name}**: {f.unfinished} session(s) unfinished, {f.completed} completed: still "
                "running or waiting when the run stopped (--until)."
            )
    if any(f.stop_note for f in left):
        lines += [
            "",
            "† stopped with work left: its figures cover a shorter run and it takes no part in the verdicts.",
        ]
    return [*lines, ""]


def _na_note(figs: Sequence[RunFigures]) -> list[str]:
    if not any(f.jain_contended is None for f in figs):
        return []
    return [
        f"Jain under contention {NA}: nobody waited at any sample, so there is no contended moment to "
        "average over; it counts neither for nor against that contender.",
        "",
    ]


def _pw(w: dict[str, float | None]) -> str:
    p50, p99 = w["p50"], w["p99"]
    return NONE if p50 is None or p99 is None else f"{p50:.1f} / {p99:.1f}"


def pool_table(figs: Sequence[RunFigures]) -> list[str]:
    """`## Per pool` (a policy of several pools): each contender's figures in each pool."""
    if not any(len(f.pools) > 1 for f in figs):
        return []
    lines = [
        "## Per pool",
        "",
        "Waits p50 / p99 (s) by class, in the pool the session was granted in; every contender runs "
        "each pool on its own (a baseline: one instance per pool, each session in the pool it asked "
        "for first).",
        "",
        "| contender | pool | sessions | grants G/B/BE | G | B | BE | max wait (s) | preemptions "
        "| utilization | slots (peak) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in figs:
        for name, p in f.pools.items():
            g = p["grants"]
            w = p["waits"]
            lines.append(
                f"| {f.name} | {name} | {p['sessions']} | "
                f"{g['guaranteed']}/{g['burstable']}/{g['besteffort']} | "
                f"{_pw(w['guaranteed'])} | {_pw(w['burstable'])} | {_pw(w['besteffort'])} | "
                f"{NONE if p['max_wait_s'] is None else format(p['max_wait_s'], '.1f')} | "
                f"{p['preemptions']} | {p['utilization']:.1%} | {p['capacity']['peak']} |"
            )
    return [*lines, ""]


def render(
    contenders: Sequence[Contender],
    figs: Sequence[RunFigures],
    target: float,
    checkpoint_s: float,
    header: Sequence[str],
    images: Sequence[str],
    no_images: str = "",
) -> str:
    wins, losses = verdicts(contenders, figs, target, checkpoint_s)
    notes = [f"- **{c.name}** ({c.family}): {c.note}" for c in contenders]
    lines = [
        "# slotsched against the baselines",
        "",
        *header,
        "",
        *table(figs, target),
        "",
        "Time-to-slot counts every wait (the first, and each after a yield, a kill or a refusal); for "
        "reject-retry it runs from the first refused attempt to the retry that lands.",
        "",
        "Guaranteed waits are split by quota. *Within quota*: the request was made while its tenant "
        "held or waited for fewer Guaranteed slots than its `guaranteed` quota (in that pool: a "
        "pool's override counts there); the SLA target (grace + "
        f"checkpoint, {target:g} s) is what slotsched promises these, and the misses count only them. "
        "*Beyond quota*: the tenant already held or waited for its whole quota; under slotsched such a "
        "request waits for one of the tenant's own Guaranteed leases to end, and no bound is promised "
        "(baselines that ignore quotas may serve it at once).",
        "",
        *_na_note(figs),
        *tenant_tables(figs),
        *pool_table(figs),
        *unfinished(figs),
        "## Contenders",
        "",
        *notes,
        "",
        "## Where slotsched does not win",
        "",
        *(losses or ["- nowhere on this workload: no other contender beat it on any figure of the table."]),
        "",
        "## Where slotsched wins or ties (waits within 0.5 s and 5% are ties)",
        "",
        *(wins or ["- on no figure of the table."]),
        "",
        "## Figures",
        "",
        *[f"![{name}]({name})" for name in images],
        *([f"- {no_images}"] if no_images else []),
        "",
    ]
    return "\n".join(lines)
