"""Which workers to activate (paper §3.4): the greedy rule, the exact min-cost cover, the fixed point."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo2sdk.core import capacity, provisioning
from echo2sdk.core.provisioning import (
    WorkerOffer,
    by_unit_cost,
    provision,
    select,
    select_cheapest,
    select_exact,
    select_random,
    unit_cost,
)
from echo2sdk.errors import CapacityError

# ---------------------------------------------------------------- static selection (§3.4)

OFFERS = [
    WorkerOffer("a100", 3.06, 1.0),  # rho 3.06
    WorkerOffer("5090-a", 0.35, 0.3),  # rho 1.167
    WorkerOffer("5090-b", 0.35, 0.3),
    WorkerOffer("4090", 0.29, 0.2),  # rho 1.45
    WorkerOffer("h100", 2.90, 1.2),  # rho 2.417
]


def test_unit_cost_is_price_over_mu():
    assert unit_cost(0.35, 0.25) == pytest.approx(1.4)
    assert [o.name for o in by_unit_cost(OFFERS)] == ["5090-a", "5090-b", "4090", "h100", "a100"]


def test_select_cheapest_takes_the_lowest_rho_prefix_that_reaches_the_target():
    sel = select_cheapest(OFFERS, mu_target=0.7)
    assert sel.names == ["5090-a", "5090-b", "4090"]
    assert sel.feasible and sel.mu_pool == pytest.approx(0.8) and sel.cost_per_hour == pytest.approx(0.99)
    assert select_cheapest(OFFERS, mu_target=0.6).names == ["5090-a", "5090-b"]  # exactly reached


def test_select_cheapest_reports_an_infeasible_target_with_its_shortfall():
    sel = select_cheapest(OFFERS, mu_target=5.0)
    assert not sel.feasible and len(sel.chosen) == len(OFFERS)
    assert sel.shortfall == pytest.approx(5.0 - 3.0)


def test_select_cheapest_drops_workers_the_prefix_no_longer_needs():
    # The rho prefix for 1.0 is 5090-a, 5090-b, 4090 (0.8), then h100 (2.0): the h100 alone suffices.
    sel = select_cheapest(OFFERS, mu_target=1.0)
    assert sel.names == ["h100"] and sel.cost_per_hour == pytest.approx(2.90)


def test_random_selection_also_reaches_the_target_but_costs_more_on_average():
    pool = [WorkerOffer(f"5090-{i}", 0.35, 0.3) for i in range(10)] + [
        WorkerOffer(f"a100-{i}", 3.06, 1.0) for i in range(3)
    ]
    rng = random.Random(1)
    cheap = select_cheapest(pool, 2.4)
    assert cheap.names == [f"5090-{i}" for i in range(8)] and cheap.cost_per_hour == pytest.approx(2.8)
    picks = [select_random(pool, 2.4, rng) for _ in range(200)]
    assert all(s.feasible for s in picks)
    assert sum(s.cost_per_hour for s in picks) / len(picks) > 1.5 * cheap.cost_per_hour


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "w", "price_per_hour": -1.0, "mu": 1.0}, "price_per_hour of worker 'w'.*-1.0"),
        ({"name": "w", "price_per_hour": 1.0, "mu": 0.0}, "mu of worker 'w'.*0.0"),
        ({"name": "w", "price_per_hour": 1.0, "mu": float("nan")}, "mu of worker 'w'.*nan"),
        ({"name": "", "price_per_hour": 1.0, "mu": 1.0}, "name"),
    ],
)
def test_bad_offers_name_the_field_and_value(kwargs, message):
    with pytest.raises(CapacityError, match=message):
        WorkerOffer(**kwargs)


def test_duplicate_names_are_refused():
    with pytest.raises(CapacityError, match="'x' twice"):
        select_cheapest([WorkerOffer("x", 1, 1), WorkerOffer("x", 2, 1)], 1.0)


def test_duplicate_names_are_refused_by_every_solver():
    for solver in ("exact", "greedy"):
        with pytest.raises(CapacityError, match="'x' twice"):
            select([WorkerOffer("x", 1, 1), WorkerOffer("x", 2, 1)], 1.0, solver)


# ---------------------------------------------------------------- the exact min-cost cover


def test_the_issues_example_exact_is_4_6x_cheaper_than_greedy():
    # b has the lower rho (0.122 vs 0.171), so greedy takes it; d alone reaches the target.
    catalog = [WorkerOffer("b", 0.55, 4.5), WorkerOffer("d", 0.12, 0.7)]
    greedy, exact = select(catalog, 0.63, "greedy"), select(catalog, 0.63)
    assert greedy.names == ["b"] and greedy.cost_per_hour == pytest.approx(0.55)
    assert exact.names == ["d"] and exact.cost_per_hour == pytest.approx(0.12) and exact.feasible
    assert greedy.cost_per_hour / exact.cost_per_hour == pytest.approx(4.58, abs=0.01)


def test_an_infeasible_target_gets_greedys_answer_everything():
    exact = select_exact(OFFERS, 5.0)
    assert exact == select_cheapest(OFFERS, 5.0)
    assert not exact.feasible and len(exact.chosen) == len(OFFERS) and exact.shortfall == pytest.approx(2.0)


def test_identical_units_are_taken_by_name_and_answers_repeat():
    pool = [WorkerOffer(f"w{i:02d}", 0.35, 0.3) for i in reversed(range(20))] + [WorkerOffer("big", 3.0, 1.0)]
    first = select_exact(pool, 2.0)
    assert first.names == [f"w{i:02d}" for i in range(7)] and first.cost_per_hour == pytest.approx(7 * 0.35)
    assert all(select_exact(list(reversed(pool)), 2.0) == first for _ in range(3))


def test_free_workers_are_used_but_none_beyond_the_need():
    pool = [WorkerOffer(f"free{i}", 0.0, 0.5) for i in range(4)] + [WorkerOffer("paid", 1.0, 3.0)]
    sel = select_exact(pool, 1.2)
    assert sel.cost_per_hour == 0.0 and len(sel.chosen) == 3


def test_a_solver_failure_or_a_costlier_answer_falls_back_to_greedy(monkeypatch):
    greedy = select_cheapest(OFFERS, 0.7)
    monkeypatch.setattr(provisioning, "_solve_cover", lambda *a: None)
    assert select_exact(OFFERS, 0.7) == greedy
    monkeypatch.setattr(provisioning, "_solve_cover", lambda types, *a: [len(OFFERS)] * len(types))  # everything
    assert select_exact(OFFERS, 0.7) == greedy


def _brute_force_cost(offers: list[WorkerOffer], mu_target: float) -> float | None:
    best = None
    for k in range(len(offers) + 1):
        for subset in itertools.combinations(offers, k):
            if sum(o.mu for o in subset) >= mu_target * (1 - 1e-9):
                cost = sum(o.price_per_hour for o in subset)
                best = cost if best is None else min(best, cost)
    return best


# machine types on a cent / centi-rollout grid (as catalogs are), 1-3 units of each
_types = st.lists(
    st.tuples(st.integers(0, 400), st.integers(1, 500), st.integers(1, 3)), min_size=1, max_size=6
)


def _catalog(types: list[tuple[int, int, int]], max_units: int) -> list[WorkerOffer]:
    offers = [WorkerOffer(f"t{t}-{i}", cents / 100, mu / 100) for t, (cents, mu, n) in enumerate(types) for i in range(n)]
    return offers[:max_units]


@settings(max_examples=200, deadline=None)
@given(types=_types, share=st.floats(0.01, 1.2), exact_hit=st.booleans())
def test_exact_is_the_brute_force_optimum_and_never_costlier_than_greedy(types, share, exact_hit):
    offers = _catalog(types, 10)
    total = sum(o.mu for o in offers)
    # a target some subset reaches exactly, or a share of the whole catalog (above 1: infeasible)
    mu_target = sum(o.mu for o in offers[: max(1, round(share * len(offers)))]) if exact_hit else share * total
    greedy, exact = select_cheapest(offers, mu_target), select_exact(offers, mu_target)
    assert exact.feasible == greedy.feasible
    assert exact.cost_per_hour <= greedy.cost_per_hour
    if exact.feasible:
        assert exact.mu_pool >= mu_target * (1 - 1e-9)
        assert exact.cost_per_hour == pytest.approx(_brute_force_cost(offers, mu_target), abs=1e-9)
    else:
        assert exact == greedy


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_types=st.integers(1, 40), share=st.floats(0.001, 1.1))
def test_exact_is_never_costlier_than_greedy_on_larger_catalogs(seed, n_types, share):
    rng = random.Random(seed)
    offers = [WorkerOffer(f"t{t}-{i}", rng.randint(0, 400) / 100, rng.randint(1, 500) / 100)
              for t in range(n_types) for i in range(rng.randint(1, 20))]
    mu_target = share * sum(o.mu for o in offers)
    greedy, exact = select_cheapest(offers, mu_target), select_exact(offers, mu_target)
    assert exact.feasible == greedy.feasible
    assert exact.cost_per_hour <= greedy.cost_per_hour
    assert not exact.feasible or exact.mu_pool >= mu_target * (1 - 1e-9)


def test_the_lp_bound_fixes_types_no_cheaper_cover_can_avoid_or_use():
    # LP: 'cheap' in full (rho 1), then 'mid' is critical (lambda = 2); L = 1 + 2 * 0.5 = 2, greedy costs 3
    types, counts = [(1.0, 1.0), (2.0, 1.0), (9.0, 1.0), (30.0, 2.0)], [1, 1, 1, 1]
    lo, hi = provisioning._fix_by_lp_bound(types, counts, 1.5, 3.0)
    assert lo == [0, 0, 0, 0]  # r_cheap = -1 is within the slack 3 - 2 = 1 (plus a rounding tolerance)
    assert hi == [1, 1, 0, 0]  # r = 7 and 26 > 1: any cover using them costs more than 3
    lo, hi = provisioning._fix_by_lp_bound(types, counts, 1.5, 2.5)
    assert lo == [1, 0, 0, 0] and hi == [1, 1, 0, 0]  # r_cheap = -1 > slack 0.5: skipping 'cheap' costs too much


def test_a_10000_unit_catalog_is_solved():
    rng = random.Random(7)
    types = [(rng.randint(5, 400) / 100, rng.randint(5, 500) / 100) for _ in range(300)]
    counts = [rng.randint(1, 80) for _ in types]  # about 12,000 units, cut to 10,000
    offers = [WorkerOffer(f"t{t}-{i}", c, mu) for t, ((c, mu), n) in enumerate(zip(types, counts)) for i in range(n)]
    offers = offers[:10_000]
    assert len(offers) == 10_000
    total = sum(o.mu for o in offers)
    for share in (0.001, 0.05, 0.5):
        greedy, exact = select_cheapest(offers, share * total), select_exact(offers, share * total)
        assert exact.feasible and exact.mu_pool >= share * total * (1 - 1e-9)
        assert exact.cost_per_hour <= greedy.cost_per_hour


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: select_exact(OFFERS, -1.0), r"mu_target must be > 0, got mu_target=-1.0"),
        (lambda: select_exact(OFFERS, float("nan")), r"mu_target must be a finite number, got mu_target=nan"),
        (lambda: select_exact(OFFERS, 1.0, time_limit_s=0), r"time_limit_s must be > 0, got time_limit_s=0"),
        (lambda: select(OFFERS, 1.0, "fast"), r"solver must be 'exact' or 'greedy', got solver='fast'"),
        (lambda: unit_cost(1.0, 0), r"mu must be > 0, got mu=0"),
    ],
)
def test_bad_selection_inputs_name_the_field_and_value(call, message):
    with pytest.raises(CapacityError, match=message):
        call()


# ---------------------------------------------------------------- provision: the T_bcast fixed point


def test_provision_with_a_given_t_bcast_is_one_selection():
    p = provision(OFFERS, T_train=100.0, R=64, kappa=2, gamma=1.1, t_bcast=40.0)
    mu_target = capacity.mu_target(capacity.mu_min(100.0, 40.0, 64, 2), 1.1)
    assert p.rounds == 1 and p.T_bcast == 40.0 and p.mu_min == pytest.approx(capacity.mu_min(100.0, 40.0, 64, 2))
    assert p.selection == select_exact(OFFERS, mu_target) and p.feasible


def test_provision_iterates_t_bcast_with_the_selection_to_a_fixed_point():
    pool = [WorkerOffer(f"w{i}", 0.35, 0.3) for i in range(30)]
    calls = []

    def estimate(workers):  # a longer broadcast for more workers
        calls.append(len(workers))
        return 20.0 + 2.0 * len(workers)

    p = provision(pool, T_train=100.0, R=256, kappa=2, gamma=1.1, estimate_t_bcast=estimate)
    assert calls[0] == 30 and p.rounds > 2
    assert p.T_bcast == estimate(p.chosen)  # the selection was made with its own T_bcast
    assert p.feasible and p.selection.mu_pool >= capacity.mu_target(capacity.mu_min(100.0, p.T_bcast, 256, 2), 1.1)


def test_provision_when_no_pool_can_hide_the_broadcast():
    p = provision(OFFERS, T_train=10.0, R=64, kappa=2, gamma=1.1, t_bcast=25.0)
    assert p.mu_min is None and not p.feasible and len(p.chosen) == len(OFFERS)


def test_provision_random_order_is_the_ablation():
    pool = [WorkerOffer(f"5090-{i}", 0.35, 0.3) for i in range(10)] + [WorkerOffer(f"a100-{i}", 3.06, 1.0) for i in range(3)]
    kw = {"T_train": 100.0, "R": 64, "kappa": 2, "gamma": 1.1, "t_bcast": 40.0}
    cheap = provision(pool, **kw)
    picks = [provision(pool, order="random", rng=random.Random(s), **kw) for s in range(20)]
    assert all(p.feasible for p in picks)
    assert max(p.selection.cost_per_hour for p in picks) > cheap.selection.cost_per_hour


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"T_train": -1.0}, r"T_train must be > 0, got T_train=-1.0"),
        ({"gamma": 0.9}, r"gamma.*0.9"),
        ({"solver": "lp"}, r"solver must be 'exact' or 'greedy', got solver='lp'"),
        ({"order": "cheapest"}, r"order must be 'rho' or 'random', got order='cheapest'"),
        ({"t_bcast": None}, r"exactly one of t_bcast or estimate_t_bcast"),
        ({"t_bcast": None, "estimate_t_bcast": lambda ws: -1.0}, r"T_bcast must be >= 0, got T_bcast=-1.0"),
    ],
)
def test_bad_provision_inputs_name_the_field_and_value(kwargs, message):
    args = {"T_train": 100.0, "R": 64, "kappa": 2, "gamma": 1.1, "t_bcast": 40.0, **kwargs}
    with pytest.raises(CapacityError, match=message):
        provision(OFFERS, **args)
