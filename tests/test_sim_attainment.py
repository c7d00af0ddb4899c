"""Fair-share attainment (scheduler/sim/attainment.py): the water-filling, the entitlement by the
policy's contract, and the ratio a platform reads per tenant and class."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.sim.attainment import Point, Quotas, attainment, entitlements, water_fill

W1 = Quotas(1.0, 0, 0, 100, None)  # weight 1, no Guaranteed, no nominal: everything is shared


@pytest.mark.parametrize(
    ("capacity", "demands", "weights", "want"),
    [
        # everyone fits: each gets its demand
        (10, {"a": 3, "b": 4}, {"a": 1, "b": 1}, {"a": 3, "b": 4}),
        # equal weights, both over: equal split
        (10, {"a": 30, "b": 40}, {"a": 1, "b": 1}, {"a": 5, "b": 5}),
        # a light tenant gets all it asks, the rest goes to the heavy one
        (10, {"a": 2, "b": 40}, {"a": 1, "b": 1}, {"a": 2, "b": 8}),
        # weights 2:1 when both are over
        (9, {"a": 30, "b": 40}, {"a": 2, "b": 1}, {"a": 6, "b": 3}),
        # three tenants, the lightest filled, the other two split what is left by weight
        (12, {"a": 1, "b": 40, "c": 40}, {"a": 1, "b": 1, "c": 2}, {"a": 1, "b": 11 / 3, "c": 22 / 3}),
        # no capacity, or no demand
        (0, {"a": 3}, {"a": 1}, {"a": 0}),
        (5, {"a": 0, "b": 2}, {"a": 1, "b": 1}, {"a": 0, "b": 2}),
    ],
)
def test_water_fill(
    capacity: float, demands: dict[str, float], weights: dict[str, float], want: dict[str, float]
) -> None:
    got = water_fill(capacity, demands, weights)
    assert got == pytest.approx(want)


@pytest.mark.parametrize(
    ("capacity", "tenants", "quotas", "want"),
    [
        # Guaranteed within quota first, then nominal, then the remainder by weight: a tenant
        # asking 3 Guaranteed (quota 2) + 4 Burstable (nominal 1) + 5 BestEffort on 8 slots
        # beside a BestEffort-only tenant asking 10: 2 G, 1 nominal, then 5 shared 2.5 / 2.5,
        # which goes to its Burstable before its BestEffort.
        (
            8,
            {"a": ((2, 2, 0), (1, 2, 5)), "b": ((0, 0, 4), (0, 0, 6))},
            {"a": Quotas(1.0, 2, 1, 10, None), "b": W1},
            {"a": (2.0, 3.5, 0.0), "b": (0.0, 0.0, 2.5)},
        ),
        # a BestEffort limit caps the claim: the rest goes to the other tenant
        (
            6,
            {"a": ((0, 0, 1), (0, 0, 9)), "b": ((0, 0, 1), (0, 0, 9))},
            {"a": Quotas(1.0, 0, 0, 0, 2), "b": W1},
            {"a": (0.0, 0.0, 2.0), "b": (0.0, 0.0, 4.0)},
        ),
    ],
)
def test_entitlements(
    capacity: int,
    tenants: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]],
    quotas: dict[str, Quotas],
    want: dict[str, tuple[float, float, float]],
) -> None:
    got = entitlements(Point(capacity, tenants), quotas)
    assert {n: pytest.approx(v) for n, v in got.items()} == want


def test_attainment_per_class_and_backlog() -> None:
    """Only the samples where the tenant had work (held or waiting) count: a light tenant that
    held 1 of its 2 fair slots has attainment 0.5; the heavy one held 3 where 2 were its share,
    then all 4 while alone (its share: its whole demand), so (3 + 4) / (2 + 4)."""
    quotas = {"light": W1, "heavy": W1}
    points = [
        Point(4, {"light": ((0, 0, 1), (0, 0, 1)), "heavy": ((0, 0, 3), (0, 0, 5))}),
        Point(4, {"light": ((0, 0, 0), (0, 0, 0)), "heavy": ((0, 0, 4), (0, 0, 0))}),
    ]
    a = attainment(points, quotas)
    assert a.ratio("light", "besteffort") == pytest.approx(0.5)
    assert a.ratio("heavy", "besteffort") == pytest.approx(7 / 6)
    assert a.ratio("light", "burstable") is None  # no work of that class
    assert a.minimum() == pytest.approx(0.5)
    assert a.tenant_json("light") == {
        "guaranteed": None,
        "burstable": None,
        "besteffort": 0.5,
        "all": 0.5,
    }


_tenant = st.tuples(
    st.floats(0.1, 4.0),  # weight
    st.integers(0, 3),  # guaranteed quota
    st.integers(0, 3),  # nominal
    st.integers(0, 6),  # demand G
    st.integers(0, 6),  # demand B
    st.integers(0, 6),  # demand BE
)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 20), st.lists(_tenant, min_size=1, max_size=6))
def test_served_exactly_fair_is_attainment_one(
    capacity: int, specs: list[tuple[float, int, int, int, int, int]]
) -> None:
    """Water-filling is correct (no more than the capacity, nobody above its capped demand, the
    remainder all handed out unless every claim is met, and max-min: whoever got less than its
    claim has at least the level per weight of every other's shared part), and a tenant held at
    exactly its entitlement at every sample has attainment 1 (at most 1 + rounding)."""
    quotas = {f"t{i}": Quotas(w, g, nom, nom + 6, None) for i, (w, g, nom, *_r) in enumerate(specs)}
    demand = {f"t{i}": (dg, db, dbe) for i, (*_q, dg, db, dbe) in enumerate(specs)}
    fair = entitlements(Point(capacity, {n: ((0, 0, 0), d) for n, d in demand.items()}), quotas)
    total = sum(sum(e) for e in fair.values())
    claim = {n: min(d[0], quotas[n].guaranteed) + d[1] + d[2] for n, d in demand.items()}
    assert total <= capacity + 1e-9
    assert total == pytest.approx(min(capacity, sum(claim.values())))
    for n, e in fair.items():
        assert min(e) >= -1e-9 and sum(e) <= claim[n] + 1e-9
    # max-min over the shared part (beyond Guaranteed and nominal), when the base fits
    base = {n: min(d[0], quotas[n].guaranteed) + min(d[1], quotas[n].nominal) for n, d in demand.items()}
    if sum(base.values()) <= capacity:
        shared = {n: sum(fair[n]) - base[n] for n in fair}
        short = [n for n in fair if sum(fair[n]) < claim[n] - 1e-9]
        for n in short:
            for m in fair:
                assert shared[n] / quotas[n].weight >= shared[m] / quotas[m].weight - 1e-6
    # Held exactly the entitlement (rounded down to whole slots), the rest of the demand waiting:
    # the same demand, so the same entitlement, and attainment at most 1.
    held = {n: (int(e[0]), int(e[1]), int(e[2])) for n, e in fair.items()}
    wait = {n: tuple(d - h for d, h in zip(demand[n], held[n], strict=True)) for n in fair}
    points = [Point(capacity, {n: (held[n], (wait[n][0], wait[n][1], wait[n][2])) for n in fair})]
    again = entitlements(points[0], quotas)
    assert [x for n in fair for x in again[n]] == pytest.approx([x for n in fair for x in fair[n]])
    a = attainment(points, quotas)
    for n in fair:
        r = a.ratio(n, "all")
        assert r is None or r <= 1 + 1e-9
