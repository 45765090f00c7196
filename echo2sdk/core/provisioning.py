"""Which workers to activate: the cheapest pool that reaches mu_target (paper §3.3-3.4, §4.3).

Symbols as in the paper:

- ``c_i``        price of worker i in $/h
- ``mu_i``       its throughput in rollouts/s
- ``rho_i``      unit throughput cost c_i / mu_i, in $/h per (rollout/s)
- ``mu_target``  gamma * mu_min(kappa), with mu_min from :func:`echo2sdk.core.capacity.mu_min`

Two solvers choose the set A of workers to activate:

- ``"greedy"`` (:func:`select_cheapest`): the paper's rule. Rank by increasing rho_i, take the cheapest
  prefix whose summed mu_i reaches mu_target, then drop the workers the rest no longer needs.
- ``"exact"`` (:func:`select_exact`, the default): the minimum-cost cover

      minimise sum_i c_i x_i   subject to   sum_i mu_i x_i >= mu_target,   x_i in {0, 1}

  solved with SciPy's HiGHS MILP. Identical (c_i, mu_i) units are one integer variable in
  0..count, and the LP relaxation's bound fixes the types that no cover cheaper than greedy's can
  leave out or use, so even 10,000 distinct machines leave the solver a small problem. The greedy
  prefix can overshoot badly: with machine b (0.55 $/h, 4.5 rollouts/s) and d (0.12 $/h, 0.7 rollouts/s)
  and mu_target = 0.63, greedy takes b (lower rho) where d alone suffices at 4.6x less. The exact
  answer never costs more than greedy's (it falls back to greedy's when the solver fails or runs out of
  time without a cheaper answer).

:func:`select_random` is the paper's "w/o Cost" ablation. :func:`provision` is the deployment
decision `echo2 plan` and the simulator share: T_bcast depends on how many workers get the snapshot,
so the selection and T_bcast are iterated to a fixed point. The live scheduler measures T_bcast
instead and calls :func:`select` (``Scheduler.provision``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from echo2sdk.core import capacity
from echo2sdk.errors import CapacityError

__all__ = [
    "SOLVERS",
    "WorkerOffer",
    "Selection",
    "Provision",
    "unit_cost",
    "by_unit_cost",
    "check_solver",
    "select",
    "select_cheapest",
    "select_exact",
    "select_random",
    "provision",
]

SOLVERS = ("exact", "greedy")
Solver = Literal["exact", "greedy"]

_REL = 1e-9  # relative tolerance when comparing a capacity against the target
_ROUNDS = 12  # fixed-point rounds of provision() at most


def unit_cost(price_per_hour: float, mu: float) -> float:
    """rho_i = c_i / mu_i, in $/h per (rollout/s)."""
    return capacity.quantity("price_per_hour", price_per_hour, allow_zero=True) / capacity.quantity("mu", mu)


@dataclass(frozen=True)
class WorkerOffer:
    """A worker that can be activated: its name, price c_i ($/h) and throughput mu_i (rollouts/s)."""

    name: str
    price_per_hour: float
    mu: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise CapacityError(f"worker name must be a non-empty string, got name={self.name!r}")
        capacity.quantity(f"price_per_hour of worker {self.name!r}", self.price_per_hour, allow_zero=True)
        capacity.quantity(f"mu of worker {self.name!r}", self.mu)

    @property
    def rho(self) -> float:
        """rho_i = c_i / mu_i."""
        return self.price_per_hour / self.mu


def by_unit_cost(offers: Iterable[WorkerOffer]) -> list[WorkerOffer]:
    """Offers by increasing rho; ties by lower price, then name (deterministic)."""
    return sorted(offers, key=lambda o: (o.rho, o.price_per_hour, o.name))


@dataclass(frozen=True)
class Selection:
    """Which workers a provisioning rule activates, and whether they reach mu_target."""

    chosen: tuple[WorkerOffer, ...]
    mu_target: float
    mu_pool: float
    cost_per_hour: float
    feasible: bool

    @property
    def shortfall(self) -> float:
        """Rollouts/s missing to reach mu_target (0 when feasible)."""
        return max(0.0, self.mu_target - self.mu_pool)

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.chosen]


def _selection(chosen: Sequence[WorkerOffer], mu_target: float) -> Selection:
    mu_pool = sum(o.mu for o in chosen)
    return Selection(
        chosen=tuple(chosen),
        mu_target=mu_target,
        mu_pool=mu_pool,
        cost_per_hour=sum(o.price_per_hour for o in chosen),
        feasible=mu_pool >= mu_target * (1 - _REL),
    )


def _prefix(ordered: Sequence[WorkerOffer], mu_target: float) -> Selection:
    mu_target = capacity.quantity("mu_target", mu_target)
    pool, n = 0.0, 0
    for o in ordered:
        if pool >= mu_target * (1 - _REL):
            break
        pool += o.mu
        n += 1
    return _selection(ordered[:n], mu_target)


def _prune(chosen: Sequence[WorkerOffer], mu_target: float) -> Selection:
    """Drop every chosen worker, most expensive first, that the rest no longer needs (order kept)."""
    pool = sum(o.mu for o in chosen)
    dropped: set[str] = set()
    for o in sorted(chosen, key=lambda o: (-o.price_per_hour, -o.rho, o.name)):
        if pool - o.mu >= mu_target * (1 - _REL):
            dropped.add(o.name)
            pool -= o.mu
    return _selection([o for o in chosen if o.name not in dropped], mu_target)


def select_cheapest(offers: Iterable[WorkerOffer], mu_target: float) -> Selection:
    """The greedy solver, paper §3.4: the cheapest-rho prefix whose summed mu reaches mu_target (all of
    them if none does).

    The last worker of a prefix can overshoot by a lot (a big machine after many small ones); the
    prefix is then pruned: every chosen worker, most expensive first, is dropped when the rest still
    reaches mu_target. Pruning never raises the cost and keeps the selection feasible.
    """
    sel = _prefix(by_unit_cost(_distinct(offers)), mu_target)
    return _prune(sel.chosen, sel.mu_target) if sel.feasible else sel


def select_exact(offers: Iterable[WorkerOffer], mu_target: float, *, time_limit_s: float = 5.0) -> Selection:
    """The exact solver: the minimum-cost set of workers whose summed mu_i reaches mu_target.

    An infeasible target gives greedy's answer (everything, feasible=False). Among identical
    (c_i, mu_i) units the first names are taken; the chosen workers come in cheapest-rho order.
    Never costlier than :func:`select_cheapest`, whose answer is returned when the solver fails, stops
    at ``time_limit_s`` without a cheaper answer, or finds none cheaper.
    """
    offers = _distinct(offers)
    mu_target = capacity.quantity("mu_target", mu_target)
    time_limit_s = capacity.quantity("time_limit_s", time_limit_s)
    greedy = select_cheapest(offers, mu_target)
    if not greedy.feasible or greedy.cost_per_hour == 0:
        return greedy
    groups: dict[tuple[float, float], list[WorkerOffer]] = {}
    for o in by_unit_cost(offers):  # units of one (c_i, mu_i) type, by name
        groups.setdefault((o.price_per_hour, o.mu), []).append(o)
    types, counts = list(groups), [len(g) for g in groups.values()]
    mu_need = mu_target * (1 - _REL)
    lo, hi = _fix_by_lp_bound(types, counts, mu_need, greedy.cost_per_hour)
    x = _solve_cover(types, lo, hi, mu_need, time_limit_s)  # units of each type
    if x is None:
        return greedy
    chosen = [o for g, k in zip(groups.values(), x, strict=True) for o in g[:k]]
    exact = _prune(by_unit_cost(chosen), mu_target)
    return exact if exact.feasible and exact.cost_per_hour < greedy.cost_per_hour else greedy


def _fix_by_lp_bound(
    types: list[tuple[float, float]], counts: list[int], mu_need: float, upper: float
) -> tuple[list[int], list[int]]:
    """Bounds lo <= x_g <= hi that every cover cheaper than `upper` (greedy's cost) satisfies.

    The LP relaxation takes types by increasing rho up to the critical type k; its bound is
    L = lambda * mu_need + sum_{rho_g < lambda} r_g n_g with lambda = rho_k and reduced costs
    r_g = c_g - lambda * mu_g, and any cover x costs at least L + sum_g |r_g| * |x_g - x*_g|. So a
    type with r_g > upper - L cannot be used at all, one with -r_g > upper - L must be used in full.
    On a large catalog of distinct machines this leaves the solver a small core. `types` come by rho.
    """
    lam, lp, have = 0.0, 0.0, 0.0
    for (c, mu), n in zip(types, counts, strict=True):
        lam = c / mu  # lambda: rho of the critical type
        if have + n * mu >= mu_need:
            lp += c * (mu_need - have) / mu
            break
        have, lp = have + n * mu, lp + n * c
    else:  # rounding left the LP short of mu_need: no bound, no fixing
        return [0] * len(counts), list(counts)
    slack = upper - lp + 1e-9 * max(1.0, upper)
    lo = [n if lam * mu - c > slack else 0 for (c, mu), n in zip(types, counts, strict=True)]
    hi = [0 if c - lam * mu > slack else n for (c, mu), n in zip(types, counts, strict=True)]
    return lo, hi


def _solve_cover(
    types: list[tuple[float, float]], lo: list[int], hi: list[int], mu_need: float, time_limit_s: float
) -> list[int] | None:
    """HiGHS: minimise sum_g c_g x_g s.t. sum_g mu_g x_g >= mu_need, x_g integer in lo[g]..hi[g].
    Types with lo = hi are left out of the model. Returns x, or None when the solver found no answer."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    free = [g for g in range(len(types)) if lo[g] < hi[g]]
    need = mu_need - sum(mu * n for (_, mu), n in zip(types, lo, strict=True))
    x = list(lo)
    if need <= 0 or not free:
        return x if need <= 0 else None
    res = milp(
        np.array([types[g][0] for g in free]),
        constraints=LinearConstraint(np.array([[types[g][1] for g in free]]), lb=need, ub=np.inf),
        integrality=np.ones(len(free)),
        bounds=Bounds(np.array([lo[g] for g in free], dtype=float), np.array([hi[g] for g in free], dtype=float)),
        options={"time_limit": time_limit_s, "mip_rel_gap": 0.0, "presolve": False, "disp": False},  # presolve: slower here
    )
    if res.x is None:
        return None
    for g, v in zip(free, res.x, strict=True):
        x[g] = min(hi[g], max(lo[g], round(v)))
    return x


def select_random(offers: Iterable[WorkerOffer], mu_target: float, rng: random.Random) -> Selection:
    """The "w/o Cost" ablation: a uniformly random order, activated until mu_target is reached."""
    ordered = sorted(_distinct(offers), key=lambda o: o.name)
    rng.shuffle(ordered)
    return _prefix(ordered, mu_target)


def select(offers: Iterable[WorkerOffer], mu_target: float, solver: Solver = "exact") -> Selection:
    """The cheapest selection by `solver`: "exact" (:func:`select_exact`) or "greedy" (:func:`select_cheapest`)."""
    return (select_exact if check_solver(solver) == "exact" else select_cheapest)(offers, mu_target)


def check_solver(solver: object) -> Solver:
    """`solver` if it is one of SOLVERS; CapacityError naming it otherwise."""
    if solver not in SOLVERS:
        raise CapacityError(f"solver must be 'exact' or 'greedy', got solver={solver!r}")
    return solver  # type: ignore[return-value]


def _distinct(offers: Iterable[WorkerOffer]) -> list[WorkerOffer]:
    offers = list(offers)
    seen: set[str] = set()
    for o in offers:
        if o.name in seen:
            raise CapacityError(f"worker names must be distinct, got {o.name!r} twice")
        seen.add(o.name)
    return offers


@dataclass(frozen=True)
class Provision:
    """What :func:`provision` decided: the selection, the T_bcast it was computed with, mu_min (None
    when kappa * T_train <= T_bcast: then no pool keeps the learner busy and the selection is the whole
    catalog, infeasible) and the number of fixed-point rounds."""

    selection: Selection
    T_bcast: float
    mu_min: float | None
    rounds: int

    @property
    def chosen(self) -> list[WorkerOffer]:
        return list(self.selection.chosen)

    @property
    def feasible(self) -> bool:
        return self.selection.feasible


def provision(
    offers: Sequence[WorkerOffer],
    *,
    T_train: float,
    R: float,
    kappa: int,
    gamma: float,
    t_bcast: float | None = None,
    estimate_t_bcast: Callable[[list[WorkerOffer]], float] | None = None,
    solver: Solver = "exact",
    order: Literal["rho", "random"] = "rho",
    rng: random.Random | None = None,
) -> Provision:
    """The deployment decision: the workers that reach mu_target = gamma * mu_min(kappa) at least cost
    (by `solver`; order="random" is the w/o-Cost ablation instead).

    With `t_bcast` given it is one selection. Otherwise ``estimate_t_bcast(workers)`` gives T_bcast
    for a set of workers; it is measured first on every offer, then on the selection itself, until the
    selection repeats (at most 12 rounds): more workers can mean a longer broadcast, a higher mu_min and
    so more workers.
    """
    offers = _distinct(offers)
    if not offers:
        raise CapacityError("provision needs at least one worker offer, got offers=[]")
    if (t_bcast is None) == (estimate_t_bcast is None):
        raise CapacityError("provision needs exactly one of t_bcast or estimate_t_bcast")
    capacity.mu_min(T_train, 0.0, R, kappa)  # validates T_train, R, kappa
    capacity.mu_target(1.0, gamma)  # validates gamma
    solver = check_solver(solver)
    if order not in ("rho", "random"):
        raise CapacityError(f"order must be 'rho' or 'random', got order={order!r}")
    rng = rng or random.Random(0)
    chosen, seen = offers, set()
    for rounds in range(1, _ROUNDS + 1):
        T_bcast = capacity.quantity("T_bcast", t_bcast if estimate_t_bcast is None else estimate_t_bcast(chosen), allow_zero=True)
        if kappa * T_train <= T_bcast:  # eq. (1) cannot hold: the whole catalog is the best there is
            return Provision(_selection(offers, math.inf), T_bcast, None, rounds)
        mu_min = capacity.mu_min(T_train, T_bcast, R, kappa)
        mu_target = capacity.mu_target(mu_min, gamma)  # mu_target = gamma * mu_min
        if order == "random":
            sel = select_random(offers, mu_target, random.Random(rng.random()))
        else:
            sel = select(offers, mu_target, solver)
        key = tuple(sel.names)
        if estimate_t_bcast is None or key in seen:
            break
        seen.add(key)
        chosen = list(sel.chosen)
    return Provision(sel, T_bcast, mu_min, rounds)
