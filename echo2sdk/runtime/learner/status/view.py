"""What the live status page shows, as one JSON-safe dict: `page_state(view)`.

`RunView` is the narrow, declared view of a run the page reads: the run's name and config, the coordinator's
registry, the buffer's statistics, the metrics rows and v_t; nothing else of the recipe. Read from the
learner's process while the run goes on (the status server's threads call it): it copies what it reads (the
worker registry, the metrics rows, the newest chain plan) and never waits on the learner.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from echo2sdk.core import bill, capacity
from echo2sdk.core.broadcast.planner import SOURCE
from echo2sdk.core.verdict import wait_by_cause
from echo2sdk.runtime.learner.metrics import shown_level

if TYPE_CHECKING:
    from echo2sdk.config import Config
    from echo2sdk.runtime.coordinator import WorkerInfo

__all__ = ["RunView", "page_state", "MAX_POINTS"]

MAX_POINTS = 2000  # reward-curve points sent (the newest), whatever the run's length


class Registry(Protocol):
    """What the page reads of the coordinator."""

    workers: Mapping[str, WorkerInfo]
    quarantined: Mapping[str, str]
    delivery: Any

    def stats(self) -> dict[str, Any]: ...


class _Rows(Protocol):
    rows: list[dict[str, Any]]


class _Version(Protocol):
    version: int


class _Stats(Protocol):
    def stats(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RunView:
    """The run as the status page may read it: its name, its config, the coordinator's registry, the buffer (its
    stats), the metrics (their rows) and the publication (v_t)."""

    name: str
    cfg: Config
    registry: Registry
    buffer: _Stats
    metrics: _Rows
    publication: _Version


def page_state(view: RunView) -> dict[str, Any]:
    """The run as the status page draws it: progress, workers, the newest broadcast plan, staleness, the
    learner's wait (bubble), the worker cost so far and per point of accuracy gained (the bill), the prompt
    filter's last step and the reward curve."""
    cfg, coord, version = view.cfg, view.registry, view.publication.version
    rows = list(view.metrics.rows)  # the learner thread appends; a copy is a consistent view
    workers, quarantined = list(coord.workers.values()), dict(coord.quarantined)
    wait = sum(r["learner_wait_s"] for r in rows)
    busy = sum(r["t_train_s"] for r in rows)
    last = rows[-1] if rows else {}
    snap = {
        "run": {"name": view.name, "step": last.get("step", 0), "steps": cfg.learner.steps,
                "version": version, "S": cfg.learner.staleness, "kappa": cfg.kappa,
                "R": cfg.learner.trajectories_per_step, "time_s": last.get("time_s", 0.0)},
        "workers": [_worker(w, version, cfg.scheduler.prices, quarantined) for w in workers],
        "broadcast": _broadcast(coord.delivery, workers, last),
        "staleness": {"S": cfg.learner.staleness, "hist": view.buffer.stats()["staleness_hist"],
                      "last_mean": last.get("staleness_mean"), "last_max": last.get("staleness_max")},
        "learner": {"bubble_ratio": capacity.bubble_ratio(wait, busy), "wait_total_s": wait,
                    "train_total_s": busy, "last_wait_s": last.get("learner_wait_s"),
                    "last_train_s": last.get("t_train_s"),
                    "wait_by_cause_s": wait_by_cause(rows)},
        **_cost_and_bill(rows, workers, cfg.scheduler.prices),
        "prompt_filter": _prompt_filter(last),
        # the workers' view, as the progress bar shows it: under dynamic sampling the trained batch holds
        # mixed-reward groups only, so its mean is not the policy's level
        "reward": [[r["step"], r["time_s"], *shown_level(r)] for r in rows[-MAX_POINTS:]],
        "coordinator": {k: v for k, v in coord.stats().items() if isinstance(v, (int, float))},
        # the task adapter's failed rollouts (their groups dropped): the last step's, its rate, the run's
        "failures": {"last": sum((last.get("adapter_failures") or {}).values()),
                     "rate": last.get("adapter_failure_rate"),
                     "total": sum(sum((r.get("adapter_failures") or {}).values()) for r in rows)},
        # a mixture's components at the last step: the workers' accuracy and filter rate, the batch's share
        "tasks": [{"name": name, **{k: v for k, v in t.items() if k != "info"}}
                  for name, t in (last.get("tasks") or {}).items()],
    }
    return _json_safe(snap)


def _state(w: WorkerInfo, quarantined: Mapping[str, str]) -> str:
    """quarantined (the coordinator refuses it), gone (dropped or left), active (handed tasks) or idle."""
    if w.worker_id in quarantined:
        return "quarantined"
    if not w.alive:
        return "gone"
    return "active" if w.active else "idle"


def _worker(w: WorkerInfo, version: int, prices: dict[str, float], quarantined: Mapping[str, str]) -> dict[str, Any]:
    return {"id": w.worker_id, "state": _state(w, quarantined), "version": w.version, "lag": version - w.version,
            "mu": w.rollouts_per_s, "price": bill.price_per_hour(w.worker_id, w.price_per_hour, prices),
            "trajectories": w.trajectories, "rejected": w.rejected}


def _broadcast(delivery: Any, workers: list[WorkerInfo], last: dict[str, Any]) -> dict[str, Any]:
    """The newest snapshot's plan: chains seed first and rollout-only leaves with their parent. A direct push
    is drawn as a star: one chain of one worker per live worker."""
    plans = dict(getattr(delivery, "plans", {}))  # ChainBroadcast keeps version -> ChainPlan
    out: dict[str, Any] = {"topology": getattr(delivery, "topology", "direct"), "source": SOURCE,
                           "t_bcast_s": last.get("t_bcast_s"), "t_bcast_all_s": last.get("t_bcast_all_s")}
    if plans:
        version = max(plans)
        plan = plans[version]
        return {**out, "version": version, "chains": [list(c) for c in plan.chains],
                "leaves": [list(pair) for pair in plan.leaves]}
    return {**out, "version": None, "chains": [[w.worker_id] for w in workers if w.alive], "leaves": []}


def _cost_and_bill(rows: list[dict[str, Any]], workers: list[WorkerInfo], prices: dict[str, float]
                   ) -> dict[str, dict[str, Any]]:
    """"cost": the rollout workers' cost so far and $/h now; "bill": summary.json's `bill` so far (core/bill.py:
    rollouts, machine-hours and dollars per point of accuracy gained between the first and the last five steps).
    One billing, as echo2 plot's cost.png bills: each worker at its price (scheduler.prices first, else the one it
    announced) from its join to now (to its last heartbeat once gone)."""
    now = time.monotonic()
    table = [{"worker_id": w.worker_id, "price_per_hour": w.price_per_hour, "joined_at": w.joined_at,
              "last_seen": now if w.alive else w.last_seen} for w in workers]
    b = bill.bill(rows, table, prices)
    rate = sum(bill.price_per_hour(w.worker_id, w.price_per_hour, prices) for w in workers if w.alive)
    return {"cost": {"usd": b["cost_usd"] or 0.0, "usd_per_hour": rate}, "bill": b}


def _prompt_filter(last: dict[str, Any]) -> dict[str, Any]:
    """The last step's pre-rollout prompt skipping (metrics.jsonl's columns of it): `enabled` is None before the
    first step, False when the filter is off (its explore probability is null; or a row without the columns);
    prompts skipped since the previous step and why, prompts handed, the filter rate f measured on the groups
    generated against f had none been skipped, and rollouts generated per rollout in an informative group."""
    return {"enabled": None if not last else last.get("prompt_explore") is not None,
            "explore": last.get("prompt_explore"), "handed": last.get("prompts_handed"),
            "skipped": last.get("prompts_skipped"),
            "skipped_by_reason": dict(last.get("prompts_skipped_by_reason") or {}),
            "filter_rate": last.get("filter_rate"), "filter_rate_unskipped": last.get("filter_rate_unskipped"),
            "rollouts_per_useful": last.get("rollouts_per_useful")}


def _json_safe(value: Any) -> Any:
    """NaN and infinities become None (JSON has neither); dict keys become strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
