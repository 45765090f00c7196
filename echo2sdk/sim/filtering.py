"""`echo2 simulate filter`: dynamic sampling against the capacity rule, on the simulator.

Dynamic sampling drops every GRPO group whose members all got the same reward (zero advantage: nothing to learn).
Only a fraction (1 - f) of the rollouts is then useful, and f moves with the policy's accuracy p: for binary
rewards and group size G, f = p^G + (1 - p)^G if every prompt is as hard, more where they are not
(:func:`echo2sdk.core.capacity.filter_rate`, beta-binomial with a prompt concentration nu). The paper's rule
sizes the pool on every rollout, mu_min = kappa R / (kappa T_train - T_bcast): with f > 0 that pool yields
(1 - f) of what the learner consumes. Sizing it on useful rollouts (R / (1 - f) generated per step) restores the
overlap.

The grid: filter rate f x provisioning on raw or on useful rollouts, on the paper's 8B deployment with 64 RTX 5090s
to choose from (:func:`echo2sdk.sim.paper.paper_pool`), several seeds each; `docs/simulation.md` holds the table.
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
                pool: int = 64, gamma: float = 1.1) -> dict[str, Any]:
    """Every (f, provisioning) cell over `seeds`, with `pool` RTX 5090s to choose from (enough for f = 0.8 sized on
    useful rollouts): mean (and worst) bubble ratio, learner wait per step, machines up, cost per step (steady
    state, the learner's included), mu_min and mu_target of the calibration (raw rollouts/s) and the measured
    filter rate."""
    rows = []
    for f in rates:
        for basis in ("raw", "useful"):
            runs = [simulate(base_config(paper_pool(pool), steps=steps, seed=s, gamma=gamma, filter_rate=f,
                                         provision_for=basis)) for s in seeds]
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
                "per_seed": [{"seed": s, "bubble_ratio": r.bubble_ratio, "cost_per_step": r.cost_per_step_steady}
                             for s, r in zip(seeds, runs)],
            })
    return {"steps": steps, "seeds": list(seeds), "gamma": gamma, "pool": f"{pool} x RTX 5090", "rows": rows}


def filter_lines(results: dict[str, Any]) -> list[str]:
    """The grid as a Markdown table, with a line of its settings."""
    lines = [
        f"filter rate x provisioning basis: {results['pool']}, gamma {results['gamma']:g}, {results['steps']} steps, "
        f"mean over seeds {results['seeds']}",
        "",
        "| f | sized on | mu_target (raw rollouts/s) | machines | bubble (worst seed) | wait/step | cost/step | "
        "measured f |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['filter_rate']:g} | {r['provision_for']} | {r['mu_target']:.2f} | {r['machines_mean']:.2f} | "
            f"{100 * r['bubble_ratio']:.1f} % ({100 * r['bubble_ratio_max']:.1f} %) | {r['wait_s']:.0f} s | "
            f"${r['cost_per_step']:.3f} | {r['measured_filter_rate']:.2f} |"
        )
    return lines


def run_filter(out: str | Path, *, quick: bool = False) -> dict[str, Any]:
    """Run the grid (`quick`: 1 seed x 16 steps, a smoke run), write DIR/filter.json, return the results."""
    return timed_grid(out, "filter", lambda: filter_grid(seeds=(0,), steps=16) if quick else filter_grid())
