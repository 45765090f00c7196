"""`echo2 simulate filter`: dynamic sampling against the capacity rule, on the simulator.

Dynamic sampling drops every GRPO group whose members all got the same reward (zero advantage: nothing to learn).
Only a fraction (1 - f) of the rollouts is then useful, and f moves with the policy's accuracy p: for binary
rewards and group size G, f = p^G + (1 - p)^G if every prompt is as hard, more where they are not
(:func:`echo2sdk.core.capacity.filter_rate`, beta-binomial with a prompt concentration nu). The paper's rule
sizes the pool on every rollout, mu_min = kappa R / (kappa T_train - T_bcast): with f > 0 that pool yields
(1 - f) of what the learner consumes. Sizing it on useful rollouts (R / (1 - f) generated per step) restores the
overlap.

The learner's pre-rollout prompt filter skips a share s of the drawn prompts (those recently zero-variance) before
they are generated: if each would have been zero-variance with probability p (its precision), the generated groups
are zero-variance at f_after = (f - s p) / (1 - s) (:attr:`echo2sdk.sim.inputs.SimConfig.filter_rate_after`), so a
pool sized on useful rollouts needs R / (1 - f_after) raw ones a step instead of R / (1 - f).

The grid: filter rate f x provisioning on raw or on useful rollouts x skip rate (0, and the one asked for), on the
paper's 8B deployment with 64 RTX 5090s to choose from (:func:`echo2sdk.sim.paper.paper_pool`), several seeds each;
`docs/simulation.md` holds the table.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from echo2sdk.sim.engine import simulate
from echo2sdk.sim.paper import base_config, paper_pool
from echo2sdk.sim.results import timed_grid

__all__ = ["filter_grid", "filter_lines", "run_filter"]


def filter_grid(*, rates: tuple[float, ...] = (0.0, 0.5, 0.8), seeds: tuple[int, ...] = (0, 1, 2), steps: int = 40,
                pool: int = 64, gamma: float = 1.1, skip_rates: tuple[float, ...] = (0.0,),
                skip_precision: float = 1.0) -> dict[str, Any]:
    """Every (f, provisioning, skip rate) cell over `seeds`, with `pool` RTX 5090s to choose from (enough for f = 0.8
    sized on useful rollouts): mean (and worst) bubble ratio, learner wait per step, machines up, cost per step
    (steady state, the learner's included), mu_min and mu_target of the calibration (raw rollouts/s), the filter rate
    of the generated groups predicted (f_after; f itself at skip rate 0) and measured. Every cell's configuration is
    checked before the first run, so a bad skip rate fails at once."""
    cells = [(f, basis, s) for f in rates for basis in ("raw", "useful") for s in skip_rates]
    configs = {cell: [base_config(paper_pool(pool), steps=steps, seed=seed, gamma=gamma, filter_rate=cell[0],
                                  provision_for=cell[1], skip_rate=cell[2], skip_precision=skip_precision)
                      for seed in seeds] for cell in cells}
    rows = []
    for (f, basis, s), cfgs in configs.items():
        runs = [simulate(c) for c in cfgs]
        bubbles = [r.bubble_ratio for r in runs]
        rows.append({
            "filter_rate": f,
            "provision_for": basis,
            "bubble_ratio": statistics.fmean(bubbles),
            "bubble_ratio_max": max(bubbles),
            "wait_s": statistics.fmean(r.learner_wait_s for r in runs),
            "machines_mean": statistics.fmean(r.machines_mean for r in runs),
            "cost_per_step": statistics.fmean(r.cost_per_step_steady for r in runs),
            "mu_min": statistics.fmean(r.mu_min or 0.0 for r in runs),
            "mu_target": statistics.fmean(r.mu_target or 0.0 for r in runs),
            "measured_filter_rate": statistics.fmean(r.filter_rate for r in runs),
            "wall_h": statistics.fmean(r.wall_s for r in runs) / 3600,
            "per_seed": [{"seed": c.seed, "bubble_ratio": r.bubble_ratio, "cost_per_step": r.cost_per_step_steady}
                         for c, r in zip(cfgs, runs)],
            "skip_rate": s,
            "skip_precision": skip_precision,
            "filter_rate_after": cfgs[0].filter_rate_after,
        })
    return {"steps": steps, "seeds": list(seeds), "gamma": gamma, "pool": f"{pool} x RTX 5090", "rows": rows,
            "skip_rates": list(skip_rates), "skip_precision": skip_precision}


def filter_lines(results: dict[str, Any]) -> list[str]:
    """The grid as a Markdown table, with a line of its settings, and per f > 0 what skipping changes on the pool
    sized on useful rollouts (workers needed and cost per step)."""
    p = results.get("skip_precision", 1.0)
    lines = [
        f"filter rate x provisioning basis x skip rate (precision {p:g}): {results['pool']}, gamma "
        f"{results['gamma']:g}, {results['steps']} steps, mean over seeds {results['seeds']}",
        "",
        "| f | sized on | skip rate | f after | mu_target (raw rollouts/s) | machines | bubble (worst seed) | "
        "wait/step | cost/step | measured f |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = results["rows"]
    for r in rows:
        lines.append(
            f"| {r['filter_rate']:g} | {r['provision_for']} | {r.get('skip_rate', 0.0):g} | "
            f"{r.get('filter_rate_after', r['filter_rate']):.2f} | {r['mu_target']:.2f} | {r['machines_mean']:.2f} | "
            f"{100 * r['bubble_ratio']:.1f} % ({100 * r['bubble_ratio_max']:.1f} %) | {r['wait_s']:.0f} s | "
            f"${r['cost_per_step']:.3f} | {r['measured_filter_rate']:.2f} |"
        )
    base = {r["filter_rate"]: r for r in rows if r["provision_for"] == "useful" and not r.get("skip_rate")}
    notes = [
        f"- f = {r['filter_rate']:g}, skip rate {r['skip_rate']:g} (f after {r['filter_rate_after']:.2f}): the pool "
        f"sized on useful rollouts needs {r['machines_mean']:.2f} workers instead of {b['machines_mean']:.2f} and "
        f"costs ${r['cost_per_step']:.3f} instead of ${b['cost_per_step']:.3f} per step"
        for r in rows
        if r["provision_for"] == "useful" and r.get("skip_rate") and r["filter_rate"] > 0
        and (b := base.get(r["filter_rate"])) is not None
    ]
    return lines + ([""] + notes if notes else [])


def run_filter(out: str | Path, *, quick: bool = False, skip_rate: float = 0.0,
               skip_precision: float = 1.0) -> dict[str, Any]:
    """Run the grid (`quick`: 1 seed x 16 steps, a smoke run), with skip rates 0 and `skip_rate` (0 alone when it
    is 0) at `skip_precision`, write DIR/filter.json, return the results."""
    skips = (0.0, skip_rate) if skip_rate else (0.0,)
    kw = {"skip_rates": skips, "skip_precision": skip_precision, **({"seeds": (0,), "steps": 16} if quick else {})}
    return timed_grid(out, "filter", lambda: filter_grid(**kw))
