"""`echo2 simulate launch`: launch latency and spot preemptions against early activation, on the simulator.

Real machines take minutes to start (about 2-6 min per cloud VM), and spot machines get preempted. The
scheduler counts a launching machine as *pending* capacity, measures the lead time L (activation to
first heartbeat) and the preemption rate lambda, and with ``anticipate`` keeps
``mu_pool + mu_pending - lambda * L * mu_pool`` at mu_target: it activates a spare before a preemption
leaves the pool short for a whole launch (:mod:`echo2sdk.core.scheduler`).

The grid: launch latency (0 s, or 2-6 min with a mode of 3 min) x preemption rate per machine-hour x
early activation off/on, on the paper's 8B deployment with the mixed-price catalog of Table 2
(:func:`echo2sdk.sim.paper.mixed_pool`), several seeds each. ``docs/simulation.md`` holds the table.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from echo2sdk.sim.engine import simulate
from echo2sdk.sim.paper import base_config, mixed_pool
from echo2sdk.sim.results import timed_grid

__all__ = ["LAUNCHES", "launch_grid", "launch_lines", "run_launch"]

# launch latency of a machine that is off: seconds, or (lo, mode, hi) triangular
LAUNCHES: dict[str, float | tuple[float, float, float]] = {"0 s": 0.0, "2-6 min": (120.0, 180.0, 360.0)}


def launch_grid(
    *,
    rates: tuple[float, ...] = (0.0, 0.3, 1.0),
    launches: dict[str, float | tuple[float, ...]] | None = None,
    seeds: tuple[int, ...] = (0, 1, 2, 3),
    steps: int = 40,
    gamma: float = 1.0,
) -> dict[str, Any]:
    """Every (launch latency, preemption rate, early activation) cell over `seeds`: mean (and worst) bubble
    ratio, cost per step (steady state), machines up or launching, preemptions, activations and releases.
    gamma = 1.0 (as in Table 4) provisions the pool tightly, so the scheduler's replacements are what keeps
    it at mu_min; at the paper's 1.1 the headroom absorbs most outages."""
    launches = LAUNCHES if launches is None else launches
    rows = []
    for launch_name, launch in launches.items():
        for rate in rates:
            for anticipate in (False, True):
                runs = [
                    simulate(base_config(mixed_pool(), steps=steps, seed=s, gamma=gamma, launch_s=launch,
                                         preempt_per_hour=rate, anticipate=anticipate))
                    for s in seeds
                ]
                bubbles = [r.bubble_ratio for r in runs]
                rows.append({
                    "launch": launch_name,
                    "launch_s": launch,
                    "preempt_per_hour": rate,
                    "anticipate": anticipate,
                    "bubble_ratio": statistics.fmean(bubbles),
                    "bubble_ratio_max": max(bubbles),
                    "cost_per_step": statistics.fmean(r.cost_per_step_steady for r in runs),
                    "wait_s": statistics.fmean(r.learner_wait_s for r in runs),
                    "machines_mean": statistics.fmean(r.machines_mean for r in runs),
                    "preemptions": statistics.fmean(sum(f["kind"] == "preempt" for f in r.faults) for r in runs),
                    "activations": statistics.fmean(sum(a["kind"] == "activate" for a in r.actions) for r in runs),
                    "releases": statistics.fmean(sum(a["kind"] == "release" for a in r.actions) for r in runs),
                    "wall_h": statistics.fmean(r.wall_s for r in runs) / 3600,
                    "per_seed": [{"seed": s, "bubble_ratio": r.bubble_ratio, "cost_per_step": r.cost_per_step_steady}
                                 for s, r in zip(seeds, runs)],
                })
    return {"steps": steps, "seeds": list(seeds), "gamma": gamma, "pool": "mixed (Table 2)", "rows": rows}


def launch_lines(results: dict[str, Any]) -> list[str]:
    """The grid as a Markdown table, with a line of its settings."""
    lines = [
        f"launch latency x preemptions x early activation: mixed pool, gamma {results['gamma']:g}, "
        f"{results['steps']} steps, mean over seeds {results['seeds']}",
        "",
        "| launch | preemptions /machine-h | early activation | bubble (worst seed) | cost/step | machines | "
        "preemptions | activations | releases |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['launch']} | {r['preempt_per_hour']:g} | {'on' if r['anticipate'] else 'off'} | "
            f"{100 * r['bubble_ratio']:.2f} % ({100 * r['bubble_ratio_max']:.2f} %) | ${r['cost_per_step']:.3f} | "
            f"{r['machines_mean']:.2f} | {r['preemptions']:.1f} | {r['activations']:.1f} | {r['releases']:.1f} |"
        )
    return lines


def run_launch(out: str | Path, *, quick: bool = False) -> dict[str, Any]:
    """Run the grid (`quick`: 2 seeds x 24 steps, a smoke run), write DIR/launch.json, return the results."""
    return timed_grid(out, "launch", lambda: launch_grid(seeds=(0, 1), steps=24) if quick else launch_grid())
