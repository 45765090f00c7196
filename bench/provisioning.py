"""Exact vs greedy provisioning: what the min-cost cover saves over the paper's cheapest-rho rule, and
what it costs to compute.

1. `--catalogs` random catalogs: `--max-types` machine types or fewer (price 0.05-4.00 $/h, mu
   0.05-5.00 rollouts/s, on a cent grid), `--units` units in all at most, and a target mu_target drawn
   uniformly between 1% and 100% of the catalog's throughput. The baseline is greedy (the paper's
   rule, pruned) on the same catalog and target. One line: the saving 1 - exact / greedy (min,
   median, p90, max, mean, share of catalogs with a saving > 0) and the summed solve times.
2. Solve time on one `--big-units` catalog of `--big-types` types, at 1%, 10% and 50% of its
   throughput: greedy and exact, best of `--repeat`. Then the same for `--big-units` units that are
   all distinct (no grouping possible: the solver's worst case, bounded by its time limit).

    .venv/bin/python bench/provisioning.py [--catalogs 200] [--seed 0] [--units 40] [--max-types 8]

Prints one JSON line per measurement with its parameters.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time


def _catalog(rng: random.Random, types: int, units: int, distinct: bool = False) -> list:
    from echo2sdk.core.provisioning import WorkerOffer

    def machine() -> tuple[float, float]:
        return rng.randint(5, 400) / 100, rng.randint(5, 500) / 100

    if distinct:
        return [WorkerOffer(f"u{i}", rng.uniform(0.05, 4.0), rng.uniform(0.05, 5.0)) for i in range(units)]
    kinds = [machine() for _ in range(types)]
    counts = [1] * types  # every type at least once, the rest of the units spread at random
    for _ in range(units - types):
        counts[rng.randrange(types)] += 1
    return [WorkerOffer(f"t{t}-{i}", c, mu) for t, ((c, mu), n) in enumerate(zip(kinds, counts)) for i in range(n)]


def _timed(fn, *args, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return out, best


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def savings(args: argparse.Namespace) -> dict:
    from echo2sdk.core.provisioning import select_cheapest, select_exact

    rng = random.Random(args.seed)
    saved, t_greedy, t_exact, infeasible = [], 0.0, 0.0, 0
    for _ in range(args.catalogs):
        types = rng.randint(1, args.max_types)
        offers = _catalog(rng, types, rng.randint(types, max(types, args.units)))
        mu_target = rng.uniform(0.01, 1.0) * sum(o.mu for o in offers)
        greedy, dt_g = _timed(select_cheapest, offers, mu_target)
        exact, dt_e = _timed(select_exact, offers, mu_target)
        t_greedy, t_exact = t_greedy + dt_g, t_exact + dt_e
        assert exact.cost_per_hour <= greedy.cost_per_hour and exact.feasible == greedy.feasible
        infeasible += not exact.feasible
        saved.append(1 - exact.cost_per_hour / greedy.cost_per_hour if greedy.cost_per_hour > 0 else 0.0)
    return {
        "saving_min": min(saved),
        "saving_median": statistics.median(saved),
        "saving_p90": _quantile(saved, 0.9),
        "saving_max": max(saved),
        "saving_mean": statistics.fmean(saved),
        "share_with_saving": sum(s > 1e-12 for s in saved) / len(saved),
        "infeasible_catalogs": infeasible,
        "greedy_s_total": t_greedy,
        "exact_s_total": t_exact,
    }


def big(rng: random.Random, units: int, types: int, distinct: bool, repeat: int) -> list[dict]:
    from echo2sdk.core.provisioning import select_cheapest, select_exact

    offers = _catalog(rng, types, units, distinct)
    rows = []
    for share in (0.01, 0.1, 0.5):
        mu_target = share * sum(o.mu for o in offers)
        greedy, dt_g = _timed(select_cheapest, offers, mu_target, repeat=repeat)
        exact, dt_e = _timed(select_exact, offers, mu_target, repeat=repeat)
        rows.append({
            "target_share": share,
            "greedy_s": dt_g,
            "exact_s": dt_e,
            "greedy_cost_per_hour": greedy.cost_per_hour,
            "exact_cost_per_hour": exact.cost_per_hour,
            "saving": 1 - exact.cost_per_hour / greedy.cost_per_hour,
            "chosen": len(exact.chosen),
        })
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--catalogs", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--units", type=int, default=40, help="units per random catalog, at most")
    p.add_argument("--max-types", type=int, default=8, help="machine types per random catalog, at most")
    p.add_argument("--big-units", type=int, default=10_000)
    p.add_argument("--big-types", type=int, default=300)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    t0 = time.perf_counter()
    from echo2sdk.core.provisioning import WorkerOffer, select_exact

    select_exact([WorkerOffer("a", 1.0, 1.0), WorkerOffer("b", 0.5, 0.4)], 0.3)  # imports scipy, starts HiGHS
    print(json.dumps({"bench": "provisioning", "mode": "first_call", "s": time.perf_counter() - t0}))
    params = {"catalogs": args.catalogs, "seed": args.seed, "units": args.units, "max_types": args.max_types}
    print(json.dumps({"bench": "provisioning", "mode": "random_catalogs", **params, **savings(args)}))
    rng = random.Random(args.seed)
    for distinct in (False, True):
        types = args.big_units if distinct else args.big_types
        for row in big(rng, args.big_units, types, distinct, args.repeat):
            print(json.dumps({"bench": "provisioning", "mode": "big_catalog", "units": args.big_units, "types": types,
                              "distinct": distinct, "repeat": args.repeat, "seed": args.seed, **row}))


if __name__ == "__main__":
    main()
