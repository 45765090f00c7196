"""What a run reports: one metrics.jsonl row per update (`metrics_row`: the columns each component reports, merged
in COLUMNS' order), the rows kept for the run (`RunMetrics`, which the status page and the live scheduler read too)
and the run's summary.json (`summary`).

Each component reports its own columns, beside what it measures: the batch (`batches.Batch.metrics`), the learner's
step (`core.learner.StepStats.metrics`), the publication (`Publication.metrics`: T_bcast), the audit
(`AuditReplay.metrics`), the batches dropped (`Batches.metrics`) and the pool (`RunMetrics.since_last`: what the
workers delivered since the previous step, read off the buffer's and the coordinator's counters). A new column is one
more key in its component's dict; it follows COLUMNS in the row."""

from __future__ import annotations

import collections
import json
import logging
import os
import statistics
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echo2sdk.core import capacity
from echo2sdk.core.bill import mean_of
from echo2sdk.core.buffer import Completed
from echo2sdk.core.verdict import NO_VALUES, filtered_share, reward_prediction, rollout_means, sizing_filter_rate, \
    verdict
from echo2sdk.errors import CapacityError
from echo2sdk.runtime.learner.batches import per_task
from echo2sdk.runtime.sinks import Sinks, sample_rows

__all__ = ["COLUMNS", "metrics_row", "shown_level", "RunMetrics", "summary", "NU_WINDOW"]

log = logging.getLogger("echo2sdk.learner")

NU_WINDOW = 10  # steps over which metrics.jsonl's prompt_concentration is measured

#: metrics.jsonl's columns in the order a row gives them (docs/observability.md says what each is); a column a
#: component adds beyond these follows them, in the order metrics_row's parts give it
COLUMNS = (
    "step", "version", "time_s", "t_train_s", "t_forward_s", "t_backward_s", "t_optim_s", "t_publish_s",
    "t_step_wall_s", "learner_wait_s", "reward_mean", "reward_std", "accuracy",
    # the pool: every group completed since the previous step, filtered or not (the policy's level, which the
    # trained batch's is not under dynamic sampling), the share of them filtered, its two predictions (core/verdict.py)
    "rollout_reward_mean", "rollout_accuracy", "filter_rate", "filter_rate_predicted", "prompt_concentration",
    "filter_rate_predicted_reward", "reward_concentration", "rollouts", "rollouts_per_s", "useful_rollouts_per_s",
    "adapter_failures", "adapter_failure_rate",
    "learner_wait_filtered_s", "learner_wait_empty_s", "learner_wait_snapshot_s",
    "staleness_max", "staleness_mean", "trajectories", "tokens", "rejected", "evicted", "groups_filtered",
    "groups_filtered_frac", "loss", "kl", "clip_frac", "is_weight_mean", "is_truncated_frac", "grad_norm", "lr",
    "task", "tasks", "workers_alive", "t_bcast_s", "t_bcast_all_s", "t_bcast_received_s", "broadcast_repairs",
    "sampler_gap", "sampler_var", "sampler_replay_gap", "sampler_replay_var", "t_audit_replay_s",
    "records_withheld", "workers_quarantined", "batches_dropped", "batches_withheld", "records_withheld_total",
)


def metrics_row(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """One line of metrics.jsonl from the columns each component reported (`parts`): COLUMNS in their order, then
    any other column in the order the parts give it. A column missing, or given by two parts, is a ValueError."""
    row: dict[str, Any] = {}
    for part in parts:
        if twice := row.keys() & part.keys():
            raise ValueError(f"metrics columns given twice: {sorted(twice)}")
        row.update(part)
    if missing := [c for c in COLUMNS if c not in row]:
        raise ValueError(f"metrics columns missing: {missing}")
    return {**{c: row.pop(c) for c in COLUMNS}, **row}


def shown_level(row: dict[str, Any]) -> tuple[float, float | None]:
    """A metrics row's reward and accuracy as the progress bar and the status page show them: the workers' (every
    group completed since the previous step) where the step has them, else the trained batch's (also for rows
    written before the rollout_* keys existed)."""
    reward, acc = row.get("rollout_reward_mean"), row.get("rollout_accuracy")
    return (row["reward_mean"] if reward is None else reward, row["accuracy"] if acc is None else acc)


class RunMetrics:
    """The run's metrics rows (restored from metrics.jsonl on a resume), written through the sinks as they come.
    Read by the status page (`rows`, a list the learner thread appends to) and the live scheduler (`remeasure`)."""

    def __init__(self, out: Path, sinks: Sinks | None, R: int, kappa: int, group_size: int = 0,
                 max_filter_rate: float = 0.0):
        self.out, self.sinks, self.R, self.kappa, self.group_size = out, sinks, R, kappa, group_size
        self.max_filter_rate = max_filter_rate  # scheduler.max_filter_rate: the live recalibration's cap on f
        self.rows: list[dict[str, Any]] = []
        self.bytes = 0  # length of metrics.jsonl after the last row (a checkpoint records it)
        # the buffer's readings (Completed counts, reward_values) at the previous step ([-1]) and at the NU_WINDOW
        # steps before it ([0]): the prompts' concentration is measured over that window (a step completes too few
        # groups to tell how alike its prompts are)
        self._window: collections.deque[tuple[Completed, Any]] = collections.deque([(Completed(), NO_VALUES)],
                                                                                    maxlen=NU_WINDOW)
        self._task_seen: dict[str, Completed] = {}  # the same by task (the buffer's completed_by_task)
        self._failures_seen: dict[str, int] = {}  # the workers' adapter failures by reason at the previous step
        self._seen_at = time.perf_counter()

    def restore(self, length: int) -> None:
        """metrics.jsonl as it was at a checkpoint (`length` bytes): rows written after it (updates the crash lost)
        move to metrics.discarded.jsonl; the kept rows become `rows`."""
        path = self.out / "metrics.jsonl"
        data = path.read_bytes() if path.exists() else b""
        kept, lost = data[:length], data[length:]
        if lost:
            with open(self.out / "metrics.discarded.jsonl", "ab") as fh:
                fh.write(lost)
            os.truncate(path, len(kept))
            log.info("metrics.jsonl: %d row(s) after the checkpoint moved to metrics.discarded.jsonl",
                     len(lost.splitlines()))
        self.bytes = len(kept)
        self.rows = [json.loads(line) for line in kept.splitlines() if line.strip()]

    def record(self, *parts: Mapping[str, Any]) -> dict[str, Any]:
        """The row of the components' columns (metrics_row), kept and written through every sink. Returns it."""
        row = metrics_row(*parts)
        self.rows.append(row)
        self.sinks.log(row["step"], row)
        self.bytes = self.sinks["jsonl"].tell()
        return row

    def since_last(self, buffer: Mapping[str, Any], coordinator: Mapping[str, Any], records: list,
                   task_names: Collection[str] = ()) -> dict[str, Any]:
        """The pool's columns of a metrics row, from the buffer's and the coordinator's stats(): what the workers
        delivered since the previous call (rollout_since_last) and the adapter failures meanwhile (failures_since_last),
        the records refused and evicted so far, the groups filtered so far, the workers alive, the broadcast's repairs
        and the quarantines; by task (a mixture's components, `task_names`) beside the batch's `records` (per_task)."""
        rollout = self.rollout_since_last(buffer)
        by_task = rollout.pop("tasks_rollout")
        return {
            **rollout,
            **self.failures_since_last(coordinator["adapter_failures"], rollout["rollouts"]),
            "rejected": sum(coordinator["rejected"].values()),
            "evicted": buffer["evicted"],
            "groups_filtered": buffer["filtered_groups"],  # so far: zero-variance groups not trained on
            "groups_filtered_frac": round(filtered_share(buffer), 4),  # of the groups completed so far
            "tasks": per_task(records, by_task, task_names),  # {} unless records name a task: a mixture
            "workers_alive": coordinator["workers_alive"],
            "broadcast_repairs": coordinator["broadcast_repairs"],
            "workers_quarantined": coordinator["quarantines"],
        }

    def rollout_since_last(self, buffer: Mapping[str, Any]) -> dict[str, Any]:
        """rollout_means and reward_prediction of the groups completed since the previous call (`buffer`: the
        buffer's stats()), and by task the level and filter rate of those ("tasks_rollout")."""
        done, values, now = Completed.read(buffer), buffer.get("reward_values"), time.perf_counter()
        (before, values_before), (spread_from, values_from) = self._window[-1], self._window[0]
        then, self._seen_at = self._seen_at, now
        by_task = {name: Completed(*counts) for name, counts in buffer.get("completed_by_task", {}).items()}
        tasks = {}
        for name, counts in by_task.items():  # per task: the level and filter rate of what completed meanwhile
            seen = self._task_seen.get(name, Completed())
            m = rollout_means(seen, counts, group_size=self.group_size)
            tasks[name] = {"rollout_accuracy": m["rollout_accuracy"], "rollout_reward_mean": m["rollout_reward_mean"],
                           "filter_rate": m["filter_rate"], "groups_completed": counts.since(seen).groups}
        self._task_seen = by_task
        means = rollout_means(before, done, group_size=self.group_size, seconds=now - then, spread_from=spread_from)
        by_reward = reward_prediction(values_before, values, self.group_size, spread_from=values_from)
        self._window.append((done, values))
        return {**means, **by_reward, "tasks_rollout": tasks}

    def failures_since_last(self, by_reason: Mapping[str, int], rollouts: int) -> dict[str, Any]:
        """The adapter failures the workers reported (their heartbeats' cumulative counts, summed: `by_reason`)
        since the previous call, and their share of the rollouts scored meanwhile (`rollouts` completed + failed;
        None when none). A worker that restarted counts from 0 again: a count that went down adds nothing."""
        now = dict(by_reason)
        diff = {k: v - self._failures_seen.get(k, 0) for k, v in now.items() if v > self._failures_seen.get(k, 0)}
        self._failures_seen = now
        total = sum(diff.values())
        return {"adapter_failures": diff,
                "adapter_failure_rate": round(total / (total + rollouts), 4) if total + rollouts else None}

    def log_batch(self, step: int, records: list, deltas: list[int], samples_every: int, samples: int) -> None:
        """The batch's staleness histogram every step, a table of its completions every `samples_every`."""
        self.sinks.log_histogram(step, "staleness", collections.Counter(deltas))
        if samples_every and step % samples_every == 0:
            self.sinks.log_table(step, "samples", sample_rows(records, samples))

    def remeasure(self) -> dict[str, Any] | None:
        """T_train of a full batch (full_batch_median of the last 5 steps) and T_bcast (the last publication) from the
        run itself (the live scheduler's recalibration); None until both exist."""
        rows = self.rows[-5:]
        bcasts = [r["t_bcast_s"] for r in self.rows if r.get("t_bcast_s") is not None]
        if len(rows) < 5 or not bcasts:
            return None
        return {"T_train": full_batch_median(rows, self.R), "T_bcast": bcasts[-1],
                "R": capacity.raw_rate(self.R, sizing_filter_rate(self.filter_rate(), self.max_filter_rate)),
                "kappa": self.kappa}

    def filter_rate(self, steps: int = 5) -> float:
        """The filter rate f of the last `steps` steps (the mean of their measured rates; 0 before any)."""
        rates = [r["filter_rate"] for r in self.rows[-steps:] if r.get("filter_rate") is not None]
        return statistics.fmean(rates) if rates else 0.0


def full_batch_t_train(row: dict[str, Any], R: int) -> float:
    """T_train of a full batch of R trajectories, from one step's row: the step's own when it trained on R or
    more; for a partial batch (learner.max_wait_s) its forward and backward time scaled by R / trajectories plus
    the rest of the step (optimizer updates, bookkeeping), which does not grow with the batch. An estimate: it
    takes the time as linear in trajectories (micro-batches make it step-shaped) and the timers as synchronous
    (on a GPU, asynchronous kernels move some backward time into the optimizer's timer), so full_batch_median
    prefers measured full steps."""
    n, t = row.get("trajectories") or 0, row["t_train_s"]
    if n >= R or n <= 0:
        return t
    grows = (row.get("t_forward_s") or 0.0) + (row.get("t_backward_s") or 0.0)
    return t + grows * (R / n - 1)


def full_batch_median(rows: list[dict[str, Any]], R: int) -> float:
    """The capacity rule's T_train from steps' rows (at least one): the median of the full steps among them if
    there are any (measured), else of full_batch_t_train over the partial ones (estimated)."""
    whole = [r["t_train_s"] for r in rows if (r.get("trajectories") or 0) >= R]
    return statistics.median(whole or [full_batch_t_train(r, R) for r in rows])


@dataclass(frozen=True)
class Timing:
    """The run's learner timings from its rows: T_train (median), T_train of a full batch of R (median of
    full_batch_median: the capacity rule's T_train), T_bcast (median) and its received part (median; None for
    rows written before it), the bubble."""

    T_train: float
    T_train_full: float
    T_bcast: float
    wait: float
    busy: float
    T_received: float | None = None

    @classmethod
    def of(cls, rows: list[dict[str, Any]], R: int) -> Timing:
        t_train = statistics.median(r["t_train_s"] for r in rows) if rows else 0.0  # rows: none if stopped at once
        full = full_batch_median(rows, R) if rows else 0.0
        bcasts = [r["t_bcast_s"] for r in rows if r["t_bcast_s"] is not None]
        received = [r["t_bcast_received_s"] for r in rows if r.get("t_bcast_received_s") is not None]
        return cls(t_train, full, statistics.median(bcasts) if bcasts else 0.0,
                   sum(r["learner_wait_s"] for r in rows), sum(r["t_train_s"] for r in rows),
                   statistics.median(received) if received else None)


def summary(rows: list[dict[str, Any]], wall_s: float, *, S: int, kappa: int, R: int, mu_pool: float,
            group_size: int = 0, **rest: Any) -> dict[str, Any]:
    """summary.json: the first and last five steps' rewards and accuracies, the staleness, the capacity rule's
    numbers measured on the run (T_train, T_bcast, mu_pool, mu_min, the bubble), then `rest` as given (the pool's,
    the checkpoint's and the audit's figures, the config). mu_min is computed with a full batch's T_train: with
    partial batches (learner.max_wait_s) the steps' own T_train is that of the smaller batches the pool's
    shortfall caused, which would raise mu_min (up to "infeasible"), judging the pool against a learner faster
    than a full batch allows."""
    head, tail, t = rows[:5], rows[-5:], Timing.of(rows, R)
    try:
        mu_min: float | str = capacity.mu_min(t.T_train_full, t.T_bcast, R, kappa)
    except CapacityError as e:
        mu_min = str(e)
    f = filtered_share(rest.get("buffer") or {})
    return {
        "steps": len(rows),
        "wall_s": round(wall_s, 2),
        **{f"{name}_{part}": mean_of(rs, key) for name, key in (
            ("reward", "reward_mean"), ("accuracy", "accuracy"), ("rollout_reward", "rollout_reward_mean"),
            ("rollout_accuracy", "rollout_accuracy")) for part, rs in (("first5", head), ("last5", tail))},
        "staleness_max": max((r["staleness_max"] for r in rows), default=0),
        "S": S,
        "kappa": kappa,
        "R": R,
        "T_train_median_s": t.T_train,
        "T_train_full_batch_s": t.T_train_full,
        "T_bcast_median_s": t.T_bcast,
        "T_bcast_received_median_s": t.T_received,  # of T_bcast: the copy complete; the rest, the install's wait
        "mu_pool_measured": mu_pool,
        "mu_min": mu_min,
        "bubble_ratio": capacity.bubble_ratio(t.wait, t.busy),  # T_idle / (T_idle + T_train,active)
        "capacity": verdict(mu_pool, f, mu_min, rows, rest.get("buffer"), group_size,
                            rule=(t.T_train_full, t.T_bcast, R, kappa)),
        **rest,
    }
