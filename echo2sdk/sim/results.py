"""What a simulated run measured (SimResult), summarized from its ledger, publications and buffer."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from echo2sdk.core import capacity
from echo2sdk.sim.accounting import Ledger
from echo2sdk.sim.inputs import SimConfig

__all__ = ["SimResult", "summarize", "publication_rows", "timed_grid"]


@dataclass
class SimResult:
    """What a simulated run measured. Times are virtual seconds."""

    steps: int
    wall_s: float  # virtual time from start to the last step's end
    bubble_ratio: float  # T_idle / (T_idle + T_train,active), the first batch's fill excluded
    bubble_ratio_all: float  # the same with the first fill
    learner_wait_s: float  # mean idle time per step (first fill excluded)
    t_train_s: float  # median step time
    t_bcast_s: float | None  # median over publications of T_bcast to q = 1/gamma of the active workers
    t_bcast_all_s: float | None  # ... to all of them
    T_bcast_calibrated: float
    mu_min: float | None
    mu_target: float | None
    machines_initial: int
    machines_max: int
    machines_mean: float
    cost_total: float
    cost_per_step: float  # everything, the first batch's fill included
    cost_per_step_steady: float  # from the first step on (the paper's steady-state accounting)
    cost_per_hour_workers: float  # time-averaged
    staleness_hist: dict[int, int]  # rollouts consumed at each staleness v_t - v
    staleness_max: int
    buffer: dict[str, Any]  # StalenessBuffer.stats(), counted in GRPO groups
    actions: list[dict[str, Any]]
    publications: list[dict[str, Any]]
    timeline: list[tuple[float, float, float]]  # (t, mu_pool seen by the scheduler, true rate of active workers)
    faults: list[dict[str, Any]]
    initial_active: list[str]
    step_log: list[tuple[float, float]]
    delivered_log: list[tuple[float, int]]
    ready_log: list[tuple[float, str]]
    stuck: str | None
    groups_filtered: int = 0  # dropped for zero reward variance (dynamic sampling)
    filter_rate: float = 0.0  # measured: groups_filtered / groups completed (f_after with skipping)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timed_grid(out: str | Path, name: str, grid: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a scenario's `grid`, note its elapsed seconds, write DIR/<name>.json and return the results (the
    `echo2 simulate` scenarios launch and filter)."""
    t0 = time.perf_counter()
    results = grid()
    results["elapsed_s"] = time.perf_counter() - t0
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=2))
    return results


def publication_rows(
    published: Mapping[int, Mapping[str, Any]], q: float
) -> tuple[list[float], list[float], list[dict[str, Any]]]:
    """Per publication, in version order: T_bcast to a fraction q of the workers it was sent to and to all of
    them (None until they installed). Returns (the T_bcast_q measured, the T_bcast_all measured, one row per
    publication)."""
    tq, tall, pubs = [], [], []
    for v, p in sorted(published.items()):
        exp = p["expected"]
        got = sorted(t - p["t0"] for n, t in p["installed"].items() if n in exp)
        b_q = capacity.t_bcast_quantile(got, len(exp), q) if exp else None
        b_all = got[-1] if exp and len(got) == len(exp) else None
        if b_q is not None:
            tq.append(b_q)
        if b_all is not None:
            tall.append(b_all)
        pubs.append({"version": v, "t0": p["t0"], "workers": len(exp), "t_bcast_s": b_q, "t_bcast_all_s": b_all,
                     "kind": p["kind"], "bytes": p["net"].snapshot_bytes})
    return tq, tall, pubs


def summarize(
    cfg: SimConfig,
    ledger: Ledger,
    published: Mapping[int, Mapping[str, Any]],
    buffer_stats: dict[str, Any],
    *,
    steps_done: int,
    wall: float,
    initial: Sequence[str],
    t_bcast_cal: float,
    mu_min: float | None,
    mu_target: float | None,
    stuck: str | None,
) -> SimResult:
    """The SimResult of a run that took `steps_done` steps in `wall` virtual seconds, from `initial` active
    workers (`buffer_stats`: StalenessBuffer.stats(), one record per GRPO group)."""
    tq, tall, pubs = publication_rows(published, 1 / cfg.gamma)
    hist = {int(k): v * cfg.group_size for k, v in buffer_stats["staleness_hist"].items()}
    cost_total = ledger.cost_workers + cfg.learner_price_per_hour * wall / 3600
    steps = max(1, steps_done)
    busy, idle, fill, seen = ledger.busy_time, ledger.idle, ledger.first_fill, ledger.machines_seen
    return SimResult(
        steps=steps_done,
        wall_s=wall,
        bubble_ratio=capacity.bubble_ratio(idle, busy),
        bubble_ratio_all=capacity.bubble_ratio(idle + fill, busy) if busy > 0 else 0.0,
        learner_wait_s=idle / max(1, steps_done - 1),
        t_train_s=statistics.median(ledger.step_times) if ledger.step_times else 0.0,
        t_bcast_s=statistics.median(tq) if tq else None,
        t_bcast_all_s=statistics.median(tall) if tall else None,
        T_bcast_calibrated=t_bcast_cal,
        mu_min=mu_min,
        mu_target=mu_target,
        machines_initial=len(initial),
        machines_max=max(seen, default=len(initial)),
        machines_mean=statistics.fmean(seen) if seen else float(len(initial)),
        cost_total=cost_total,
        cost_per_step=cost_total / steps,
        cost_per_step_steady=(cost_total - ledger.cost_at_first_step) / steps,
        cost_per_hour_workers=ledger.cost_workers / (wall / 3600) if wall > 0 else 0.0,
        staleness_hist=hist,
        staleness_max=max(hist, default=0),
        buffer=buffer_stats,
        actions=ledger.actions,
        publications=pubs,
        timeline=ledger.timeline,
        faults=ledger.fault_log,
        initial_active=list(initial),
        step_log=ledger.step_log,
        delivered_log=ledger.delivered_log,
        ready_log=ledger.ready_log,
        stuck=stuck,
        groups_filtered=ledger.groups_filtered,
        filter_rate=ledger.groups_filtered / max(1, ledger.groups_filtered + buffer_stats["admitted"]),
    )
