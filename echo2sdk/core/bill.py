"""The run's bill: what its rollouts cost, in rollouts, machine-hours and dollars, and what one point of gain cost.

One owner for billing a worker, so that summary.json's `bill`, `echo2 plot`'s cost.png and the status page agree:

- its price (`price_per_hour`): the config's `scheduler.prices` by worker id first, else the price the worker
  registered with (0 for local workers);
- its billed span (`billed_spans`): from its join to its last heartbeat. summary.json's worker table keeps
  monotonic clock readings, so the spans are placed on the run's clock (seconds from the first step's start, as
  metrics.jsonl's `time_s`) by aligning the newest heartbeat with the run's end.

The gain is read off the metrics rows as summary.json reads it: the mean of the workers' `rollout_accuracy` (every
group completed, the policy's level) over the first and the last `WINDOW` rows, in percentage points; a task that
scores no correctness falls back to `rollout_reward_mean`, in reward units x100. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["WINDOW", "price_per_hour", "billed_spans", "billed", "bill", "mean_of"]

WINDOW = 5  # rows averaged at each end of the run (summary.json's *_first5 / *_last5)


def price_per_hour(worker_id: str, registered: float | None, prices: Mapping[str, float] | None) -> float:
    """A worker's $/h: `prices` (the config's scheduler.prices) by its id first, else the price it registered
    with, 0.0 when it gave none."""
    if prices and worker_id in prices:
        return float(prices[worker_id])
    return float(registered or 0.0)


def billed_spans(workers: Sequence[Mapping[str, Any]], end_s: float) -> list[tuple[float, float]]:
    """Each worker's [join, last heartbeat] on the run's clock (seconds from the first step's start), the newest
    heartbeat aligned with `end_s` (the run's end): summary.json keeps monotonic clock readings. A worker without
    a reading is billed nothing (its span starts and ends at the newest heartbeat)."""
    ref = max((w.get("last_seen", 0.0) for w in workers), default=0.0)
    return [(w.get("joined_at", ref) - ref + end_s, w.get("last_seen", ref) - ref + end_s) for w in workers]


def billed(workers: Sequence[Mapping[str, Any]], prices: Mapping[str, float] | None,
           end_s: float) -> list[tuple[float, float, float]]:
    """(price $/h, join, last heartbeat) per worker of summary.json's `workers` table, in its order."""
    return [(price_per_hour(w["worker_id"], w.get("price_per_hour"), prices), a, b)
            for w, (a, b) in zip(workers, billed_spans(workers, end_s), strict=True)]


def bill(rows: Sequence[Mapping[str, Any]], workers: Sequence[Mapping[str, Any]],
         prices: Mapping[str, float] | None, wall_s: float | None = None) -> dict[str, Any]:
    """The run's bill from its metrics rows, summary.json's `workers` table and the config's scheduler.prices.

    `wall_s` is the run's end on its clock (default: the last row's `time_s`); the totals do not depend on it, the
    spans' placement does. Returns:

    - `measure`: "accuracy" (the rows' `rollout_accuracy`), or "reward" (`rollout_reward_mean`) when no row has an
      accuracy (the task scores no correctness);
    - `rollouts_generated`: the rows' `rollouts` summed (every completed rollout, filtered or not);
    - `machine_hours`: worker-hours billed, each worker from its join to its last heartbeat;
    - `cost_usd`: those hours at each worker's price (0.0 when every price is 0: local workers);
      both null without a worker table (a run that ended before summary.json);
    - `accuracy_first5`, `accuracy_last5`: the measure's mean over the first and the last five rows (null where
      none of them has it);
    - `gain_points`: last5 - first5, x100 (percentage points of accuracy; reward units x100);
    - `rollouts_per_point`, `machine_hours_per_point`, `usd_per_point`: each total per point of gain; null when
      the gain is not positive (a run that did not improve has no price per point) or unknown.
    """
    key = "rollout_accuracy" if any(r.get("rollout_accuracy") is not None for r in rows) else "rollout_reward_mean"
    first, last = mean_of(rows[:WINDOW], key), mean_of(rows[-WINDOW:], key)
    gain = None if first is None or last is None else 100 * (last - first)
    end = wall_s if wall_s is not None else rows[-1]["time_s"] if rows else 0.0
    spans = billed(workers, prices, end)
    hours = sum(max(0.0, b - a) for _, a, b in spans) / 3600 if spans else None
    usd = sum(p * max(0.0, b - a) for p, a, b in spans) / 3600 if spans else None
    rollouts = sum(r.get("rollouts") or 0 for r in rows)
    return {
        "measure": "accuracy" if key == "rollout_accuracy" else "reward",
        "rollouts_generated": rollouts,
        "machine_hours": hours,
        "cost_usd": usd,
        "accuracy_first5": first,
        "accuracy_last5": last,
        "gain_points": gain,
        "rollouts_per_point": _per(rollouts, gain),
        "machine_hours_per_point": _per(hours, gain),
        "usd_per_point": _per(usd, gain),
    }


def mean_of(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The mean of `key` over the rows that have it (None where none does): summary.json's *_first5 / *_last5."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def _per(total: float | None, gain: float | None) -> float | None:
    """`total` per point of gain; None for a gain that is unknown, not positive or not finite."""
    if total is None or gain is None or not math.isfinite(gain) or gain <= 0:
        return None
    return total / gain
