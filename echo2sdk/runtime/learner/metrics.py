"""What a run reports: one metrics.jsonl row per update (`metrics_row`), the rows kept for the run (`RunMetrics`,
which the status page and the live scheduler read too) and the run's summary.json (`summary`)."""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from echo2sdk.core import capacity
from echo2sdk.core.buffer import COMPLETED, task_bucket
from echo2sdk.errors import CapacityError
from echo2sdk.runtime.learner.batches import WAIT_CAUSES
from echo2sdk.runtime.sinks import Sinks, sample_rows

if TYPE_CHECKING:
    from echo2sdk.core.learner import StepStats

__all__ = ["filtered_share", "sizing_filter_rate", "metrics_row", "rollout_means", "concentration", "prediction",
           "reward_prediction",
           "shown_level", "RunMetrics", "summary", "COMPLETED"]

log = logging.getLogger("echo2sdk.trainer")

_NONE = (0,) * len(COMPLETED)  # COMPLETED before anything completed
NU_WINDOW = 10  # steps over which metrics.jsonl's prompt_concentration is measured


def _worker_stats(stats: Mapping[str, Any] | None, field: str) -> dict[str, float | None]:
    """One audit statistic per worker, rounded; a non-finite variance is None (JSON has no NaN)."""
    out = {}
    for w, s in (stats or {}).items():
        v = getattr(s, field)
        out[w] = round(v, 6) if field == "gap" or math.isfinite(v) else None
    return out


def metrics_row(
    step: int, version: int, records: list, deltas: list[int], st: StepStats, *, time_s: float, wall_s: float,
    wait_s: float, publish_s: float, t_bcast: tuple[float | None, float | None], rejected: int, evicted: int,
    workers_alive: int, broadcast_repairs: int, workers_quarantined: int = 0, audit: dict[str, Any] | None = None,
    replay: dict[str, Any] | None = None, replay_s: float = 0.0, batches_dropped: int = 0, batches_withheld: int = 0,
    records_withheld: int = 0, groups_filtered: int = 0, groups_filtered_frac: float = 0.0,
    rollout_reward_mean: float | None = None, rollout_accuracy: float | None = None,
    filter_rate: float | None = None, filter_rate_predicted: float | None = None,
    prompt_concentration: float | None = None, filter_rate_predicted_reward: float | None = None,
    reward_concentration: float | None = None, rollouts_per_s: float | None = None,
    useful_rollouts_per_s: float | None = None, wait_causes: Mapping[str, float] | None = None,
    tasks_rollout: Mapping[str, Mapping[str, Any]] | None = None, rollouts: int = 0,
    adapter_failures: Mapping[str, int] | None = None, adapter_failure_rate: float | None = None,
    task_names: Collection[str] = (), t_received: float | None = None,
) -> dict[str, Any]:
    """One line of metrics.jsonl: the update's timings (seconds), the batch's rewards and staleness
    (Delta = v_t - v), the learner's StepStats `st`, and the pool's counters at the end of the step."""
    t_q, t_all = t_bcast
    return {
        "step": step, "version": version, **_timings(st, time_s, wall_s, wait_s, publish_s),
        **_batch_levels(records),
        # every group completed since the previous step, filtered or not: the policy's level, which the trained
        # batch's reward and accuracy are not under dynamic sampling (it keeps the groups with mixed rewards)
        "rollout_reward_mean": rollout_reward_mean,
        "rollout_accuracy": rollout_accuracy,
        # capacity in useful rollouts (issue 35): the share of the groups completed since the previous step that
        # dynamic sampling dropped, the share predicted from their accuracy and how alike their prompts were
        # (binary rewards: capacity.filter_rate, prompt_concentration), the share predicted from the values their
        # rewards took (the filter's own terms: capacity.value_filter_rate, value_concentration), the workers' rates
        "filter_rate": filter_rate,
        "filter_rate_predicted": filter_rate_predicted,
        "prompt_concentration": prompt_concentration,
        "filter_rate_predicted_reward": filter_rate_predicted_reward,
        "reward_concentration": reward_concentration,
        "rollouts": rollouts,  # completed since the previous step (filtered groups included)
        "rollouts_per_s": rollouts_per_s,
        "useful_rollouts_per_s": useful_rollouts_per_s,
        # rollouts the task adapter failed since the previous step, by reason (score raised, no finite reward):
        # their groups are dropped; the rate is of the rollouts scored meanwhile (runtime/learner/health.py warns)
        "adapter_failures": dict(adapter_failures or {}),
        "adapter_failure_rate": adapter_failure_rate,
        # learner_wait_s by cause (runtime/learner/batches.py), split by the shares of the groups that arrived
        # meanwhile: filtered (the pool worked on groups the learner cannot use), stale ("snapshot": generated on a
        # snapshot older than v_t - S) and the rest ("empty": ready groups, or none arrived)
        "learner_wait_filtered_s": round((wait_causes or {}).get("filtered", 0.0), 4),
        "learner_wait_empty_s": round((wait_causes or {}).get("empty", 0.0), 4),
        "learner_wait_snapshot_s": round((wait_causes or {}).get("snapshot", 0.0), 4),
        "staleness_max": max(deltas), "staleness_mean": statistics.fmean(deltas),
        "trajectories": len(records), "tokens": st.tokens, "rejected": rejected, "evicted": evicted,
        "groups_filtered": groups_filtered,  # so far: zero-variance groups not trained on (dynamic sampling)
        "groups_filtered_frac": groups_filtered_frac,  # of the groups completed so far
        "loss": st.loss, "kl": st.kl, "clip_frac": st.clip_frac, "is_weight_mean": st.is_weight_mean,
        "is_truncated_frac": st.is_truncated_frac, "grad_norm": st.grad_norm, "lr": st.lr,
        "task": _extra_means(records),
        "tasks": per_task(records, tasks_rollout, task_names),  # by task ({} unless records name one: a mixture)
        "workers_alive": workers_alive, "t_bcast_s": t_q, "t_bcast_all_s": t_all,
        # of the same publication: its complete, verified copy on the same share of the workers (the rest of
        # t_bcast_s is their wait for the batch they were generating to end before installing it)
        "t_bcast_received_s": t_received,
        "broadcast_repairs": broadcast_repairs,
        **_audit_columns(audit, replay, replay_s),
        "records_withheld": sum(st.withheld),  # of this step's batch, by the audit's screen (not trained on)
        "workers_quarantined": workers_quarantined,
        "batches_dropped": batches_dropped,  # so far: batches the learner step raised on (the recipe's _learn)
        "batches_withheld": batches_withheld,  # so far: batches the audit's screen withheld whole (records_withheld)
        "records_withheld_total": records_withheld,  # so far
    }


def _timings(st: StepStats, time_s: float, wall_s: float, wait_s: float, publish_s: float) -> dict[str, float]:
    """A row's timings: time since the run began, the learner's phases, publishing, the step's wall time and
    the learner's wait for its batch (seconds)."""
    return {
        "time_s": round(time_s, 3), "t_train_s": round(st.t_train_s, 4),
        "t_forward_s": round(st.t_forward_s, 4), "t_backward_s": round(st.t_backward_s, 4), "t_optim_s": round(st.t_optim_s, 4),
        "t_publish_s": round(publish_s, 4), "t_step_wall_s": round(wall_s, 4), "learner_wait_s": round(wait_s, 4),
    }


def _batch_levels(records: list) -> dict[str, float | None]:
    """The trained batch's reward mean and spread, and its accuracy (None: the task scores no "correct")."""
    rewards = [t.reward for t in records]
    scored = [c for c in (t.meta.extra.get("correct") for t in records) if c is not None]
    return {
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "accuracy": statistics.fmean(bool(c) for c in scored) if scored else None,  # None: the task scores no "correct"
    }


def _audit_columns(audit: dict[str, Any] | None, replay: dict[str, Any] | None, replay_s: float) -> dict[str, Any]:
    """The worker audit's statistics per worker (core/audit.py) and its replay's, with the replay's time."""
    return {
        "sampler_gap": _worker_stats(audit, "gap"),  # the worker audit (core/audit.py)
        "sampler_var": _worker_stats(audit, "var"),
        # the audit's replay: a few records per worker under the version each claims (lag 0 for both statistics)
        "sampler_replay_gap": _worker_stats(replay, "gap"),
        "sampler_replay_var": _worker_stats(replay, "var"),
        "t_audit_replay_s": round(replay_s, 4),
    }


def rollout_means(before: tuple, now: tuple, *, group_size: int = 0, seconds: float = 0.0,
                  spread_from: tuple | None = None) -> dict[str, float | None]:
    """What the workers delivered between two readings of the buffer's COMPLETED counters, `seconds` apart:
    rollout_reward_mean and rollout_accuracy of the groups completed; filter_rate, the share of them dynamic
    sampling dropped (zero reward variance); prompt_concentration nu, how alike the prompts are (from the spread of
    the correct counts of the groups completed since `spread_from`, an earlier reading, default `before`; None where
    they look alike), and filter_rate_predicted, the binary-reward filter rate at their accuracy p, group size G and
    nu (capacity.filter_rate: p^G + (1 - p)^G where alike); rollouts_per_s and useful_rollouts_per_s (those of
    groups not filtered). None where none (or no scored record) completed."""
    (n0, reward0, scored0, correct0, g0, f0, *_), (n, reward, scored, correct, g, f, *_) = before, now
    acc = (correct - correct0) / (scored - scored0) if scored > scored0 else None
    rate = (f - f0) / (g - g0) if g > g0 else None
    nu = concentration(before if spread_from is None else spread_from, now, group_size)
    return {
        "rollouts": n - n0,
        "rollout_reward_mean": (reward - reward0) / (n - n0) if n > n0 else None,
        "rollout_accuracy": acc,
        "filter_rate": None if rate is None else round(rate, 4),
        "filter_rate_predicted": (round(capacity.filter_rate(acc, group_size, nu), 4)
                                  if acc is not None and group_size else None),
        "prompt_concentration": None if nu is None else round(nu, 4),
        "rollouts_per_s": round((n - n0) / seconds, 4) if seconds > 0 else None,
        "useful_rollouts_per_s": round((n - n0) * (1 - rate) / seconds, 4) if seconds > 0 and rate is not None else None,
    }


def concentration(before: tuple, now: tuple, group_size: int) -> float | None:
    """capacity.prompt_concentration of the groups scored whole that completed between two readings of the
    COMPLETED counters (None where too few, or alike)."""
    m, correct, pairs = (now[i] - before[i] for i in (6, 7, 8))
    return capacity.prompt_concentration(m, group_size, correct, pairs) if group_size else None


_NO_VALUES = {"groups": 0, "values": []}  # the buffer's reward_values before anything completed


def _values_between(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> tuple | None:
    """(m groups, {value: (records, pairs)}) of the groups tallied between two readings of the buffer's
    reward_values (core/buffer.RewardValues); None once the reward took too many values to tally."""
    if before is None or now is None:
        return None
    old = {v: (n, pairs) for v, n, pairs in before["values"]}
    return now["groups"] - before["groups"], {
        v: (n - old.get(v, (0, 0))[0], pairs - old.get(v, (0, 0))[1]) for v, n, pairs in now["values"]}


def reward_prediction(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None, group_size: int,
                      spread_from: Mapping[str, Any] | None = None) -> dict[str, float | None]:
    """The filter's own prediction, from the values the reward took (any discrete reward: math's 0, 0.1 and 1.1,
    not only right or wrong): reward_concentration nu (capacity.value_concentration of the groups completed
    since `spread_from`, default `before`; None where they look alike) and filter_rate_predicted_reward,
    capacity.value_filter_rate of the shares of the values among the groups completed between `before` and `now`
    with that nu. Readings are the buffer's reward_values; None where none completed or the reward is continuous."""
    step, spread = _values_between(before, now), _values_between(before if spread_from is None else spread_from, now)
    if step is None or spread is None or not step[0] or not group_size:
        return {"reward_concentration": None, "filter_rate_predicted_reward": None}
    m, values = spread
    nu = capacity.value_concentration(m, group_size, [n for n, _ in values.values()],
                                      [pairs for _, pairs in values.values()]) if m else None
    shares = list(_shares(step, group_size).values())
    return {"reward_concentration": None if nu is None else round(nu, 4),
            "filter_rate_predicted_reward": round(capacity.value_filter_rate(shares, group_size, nu), 4)}


def _shares(tallied: tuple, group_size: int) -> dict[float, float]:
    """{value: its share of the rollouts} of groups tallied as _values_between gives them (m groups, {value:
    (records, pairs)})."""
    m, values = tallied
    return {v: n / (m * group_size) for v, (n, _) in values.items()}


def shown_level(row: dict[str, Any]) -> tuple[float, float | None]:
    """A metrics row's reward and accuracy as the progress bar and the status page show them: the workers' (every
    group completed since the previous step) where the step has them, else the trained batch's (also for rows
    written before the rollout_* keys existed)."""
    reward, acc = row.get("rollout_reward_mean"), row.get("rollout_accuracy")
    return (row["reward_mean"] if reward is None else reward, row["accuracy"] if acc is None else acc)


#: Task metadata keys that name or number things (a row, an index, a seed) rather than measure them: never
#: averaged. Also every key ending in _id, _index, _row or seed.
ID_KEYS = frozenset({"id", "index", "row", "epoch", "position", "seed", "group", "step", "version", "example_id"})


def is_measure(key: str, value: object) -> bool:
    """A task-metadata field worth a mean: a number or a bool whose key is not an id (ID_KEYS)."""
    return (isinstance(value, (bool, int, float)) and key not in ID_KEYS
            and not key.endswith(("_id", "_index", "_row", "seed")))


def _extra_means(records: list) -> dict[str, float]:
    """Mean of every numeric (or boolean) task-metadata field over the batch (Task.info, Score.info, an episode's
    summary: turns, fallbacks, failed episodes, chip change; not ids: is_measure); fields a record lacks are left
    out of its mean."""
    sums: dict[str, list[float]] = {}
    for t in records:
        for key, value in t.meta.extra.items():
            if is_measure(key, value):
                sums.setdefault(key, []).append(float(value))
    return {k: round(statistics.fmean(v), 4) for k, v in sorted(sums.items())}


def per_task(records: list, rollout: Mapping[str, Mapping[str, Any]] | None = None,
             names: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """The batch split by task (records whose meta.extra names a "task": a mixture's components): trajectories,
    reward_mean, accuracy and the means of their metadata; with `rollout` (per task, what RunMetrics.
    rollout_since_last measured) the workers' level and the filter rate of the groups completed since the previous
    step. {} when no record names a task. A name a record claims that is not among `names` (the mixture's
    components, when given), or past the first MAX_TASKS, counts as OTHER_TASK: workers are not trusted."""
    by: dict[str, list] = {}
    for t in records:
        name = t.meta.extra.get("task")
        if isinstance(name, str):
            by.setdefault(task_bucket(name, names, by), []).append(t)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({*by, *(rollout or {})}):
        rs = by.get(name, [])
        scored = [c for c in (t.meta.extra.get("correct") for t in rs) if c is not None]
        out[name] = {
            "trajectories": len(rs),
            "reward_mean": round(statistics.fmean(t.reward for t in rs), 4) if rs else None,
            "accuracy": round(statistics.fmean(bool(c) for c in scored), 4) if scored else None,
            **(rollout or {}).get(name, {}),
            "info": _extra_means(rs),
        }
    return out


class RunMetrics:
    """The run's metrics rows (restored from metrics.jsonl on a resume), written through the sinks as they come.
    Read by the status page (`rows`, a list the learner thread appends to) and the live scheduler (`remeasure`)."""

    def __init__(self, out: Path, sinks: Sinks | None, R: int, kappa: int, group_size: int = 0,
                 max_filter_rate: float = 0.0):
        self.out, self.sinks, self.R, self.kappa, self.group_size = out, sinks, R, kappa, group_size
        self.max_filter_rate = max_filter_rate  # scheduler.max_filter_rate: the live recalibration's cap on f
        self.rows: list[dict[str, Any]] = []
        self.bytes = 0  # length of metrics.jsonl after the last row (a checkpoint records it)
        # the buffer's readings (COMPLETED counters, reward_values) at the previous step ([-1]) and at the NU_WINDOW
        # steps before it ([0]): the prompts' concentration is measured over that window (a step completes too few
        # groups to tell how alike its prompts are)
        self._window: collections.deque[tuple] = collections.deque([(_NONE, _NO_VALUES)], maxlen=NU_WINDOW)
        self._task_seen: dict[str, tuple] = {}  # the same by task (the buffer's completed_by_task)
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

    def record(self, row: dict[str, Any]) -> None:
        """Keep a row and write it through every sink."""
        self.rows.append(row)
        self.sinks.log(row["step"], row)
        self.bytes = self.sinks["jsonl"].tell()

    def rollout_since_last(self, buffer_stats: Mapping[str, Any]) -> dict[str, float | None]:
        """rollout_means of the groups completed since the previous call."""
        done, values, now = tuple(buffer_stats[k] for k in COMPLETED), buffer_stats.get("reward_values"), \
            time.perf_counter()
        (before, values_before), (spread_from, values_from) = self._window[-1], self._window[0]
        then, self._seen_at = self._seen_at, now
        by_task = dict(buffer_stats.get("completed_by_task", {}))
        tasks = {}
        for name, counts in by_task.items():  # per task: the level and filter rate of what completed meanwhile
            m = rollout_means(self._task_seen.get(name, _NONE), counts, group_size=self.group_size)
            tasks[name] = {"rollout_accuracy": m["rollout_accuracy"], "rollout_reward_mean": m["rollout_reward_mean"],
                           "filter_rate": m["filter_rate"], "groups_completed": counts[4] - self._task_seen.get(name, _NONE)[4]}
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
        """T_train of a full batch (full_batch_median of the last 5 steps) and T_bcast (the last publication) from the run itself (the live scheduler's recalibration); None until both exist."""
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


def filtered_share(buffer_stats: Mapping[str, Any]) -> float:
    """The share of the completed groups that dynamic sampling filtered so far (StalenessBuffer.stats())."""
    return buffer_stats.get("filtered_groups", 0) / max(buffer_stats.get("completed_groups", 0), 1)


def sizing_filter_rate(f: float, cap: float) -> float:
    """The filter rate the pool is sized on (R / (1 - f) rollouts a step): the measured `f` up to `cap`
    (scheduler.max_filter_rate). Above it a warning says that the task, not the pool, is short: almost every group
    has one reward for all its members, and more machines would mostly make more of those."""
    if f > cap:
        log.warning("%.0f%% of the groups have one reward for all their members (zero variance, filtered): the pool is "
                    "sized as for %.0f%% (scheduler.max_filter_rate); check the task's rewards and difficulty",
                    100 * f, 100 * cap)
        return cap
    return f


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


def wait_by_cause(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The learner's wait over `rows` by cause (WAIT_CAUSES: learner_wait_<cause>_s summed), in seconds."""
    return {c: sum(r.get(f"learner_wait_{c}_s", 0.0) for r in rows) for c in WAIT_CAUSES}


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


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(values) if values else None


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
        **{f"{name}_{part}": _mean(rs, key) for name, key in (
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


def verdict(mu_pool: float, f: float, mu_min: float | str, rows: list[dict[str, Any]],
            buffer: Mapping[str, Any] | None = None, group_size: int = 0,
            rule: tuple[float, float, int, int] | None = None) -> dict[str, Any]:
    """The capacity rule judged in useful rollouts (issue 35): the pool's raw rate, the run's filter rate f (groups
    dropped for zero reward variance), the useful rate mu_pool * (1 - f) against mu_min, and what the learner's
    wait was spent on; `enough` is None when mu_min could not be computed. With the buffer's counters (`buffer`,
    StalenessBuffer.stats()) and G, the whole run's binary-reward prediction beside it (`prediction`). With the
    rule's inputs (`rule`: T_train, T_bcast, R, kappa), what the broadcast costs: `mu_min_without_broadcast`,
    mu_min at T_bcast = 0 (R / T_train), and `short_because_of_broadcast` when the useful rate meets that but not
    mu_min (or no pool could: kappa T_train <= T_bcast): the broadcast, not the pool, is the bottleneck (shorten
    T_bcast or raise S; a pool as fast as a finite mu_min would also do)."""
    useful = mu_pool * (1 - f)
    enough = None if isinstance(mu_min, str) else useful >= mu_min
    causes = wait_by_cause(rows)
    T_train, T_bcast, R, kappa = rule or (0.0, 0.0, 0, 1)
    free = capacity.mu_min(T_train, 0.0, R, kappa) if T_train > 0 and R > 0 else None
    out = {
        "mu_pool_raw": mu_pool, "filter_rate": round(f, 4), **prediction(buffer or {}, group_size),
        "mu_pool_useful": useful, "mu_min": mu_min, "mu_min_without_broadcast": free,
        "enough": enough,
        "short_because_of_filtering": bool(not enough and enough is not None and mu_pool >= mu_min),
        "short_because_of_broadcast": bool(free is not None and not enough and (enough is None or useful >= free)),
        "learner_wait_s": round(sum(r["learner_wait_s"] for r in rows), 3),
        "learner_wait_filtered_s": round(causes["filtered"], 3),
        "learner_wait_empty_s": round(causes["empty"], 3),
        "learner_wait_snapshot_s": round(causes["snapshot"], 3),
    }
    broadcast = (f"the broadcast (T_bcast {T_bcast:.3g} s of kappa T_train {kappa * T_train:.3g} s) leaves the "
                 f"pool too little time: at T_bcast = 0 mu_min would be {free:.3g}/s"
                 if out["short_because_of_broadcast"] else "")
    if enough is False:
        out["why"] = (f"useful rollouts {useful:.3g}/s < mu_min {mu_min:.3g}/s" +
                      (f": {100 * f:.0f}% of the groups were filtered (zero reward variance), so the raw "
                       f"{mu_pool:.3g}/s was not enough" if out["short_because_of_filtering"] else "") +
                      (f"; {broadcast}, which the pool met" if broadcast else ""))
    elif enough is None and broadcast:
        out["why"] = f"no pool is enough: {broadcast}"
    return out


def prediction(buffer: Mapping[str, Any], group_size: int) -> dict[str, float | None]:
    """The filter rate predicted over every group completed since the run (or its resume) began, two ways. Of
    binary rewards: `accuracy` p, `prompt_concentration` nu (None: alike), `filter_rate_predicted`
    (capacity.filter_rate(p, G, nu): what `echo2 plan --accuracy P --group-size G --prompt-concentration NU` plans
    for) and `filter_rate_binary`, the share of the groups scored whole that were all right or all wrong, which a
    binary reward's filter would drop. Of the values the reward took (reward_prediction): `reward_shares` ([value,
    share of the rollouts] of each), `reward_concentration` and `filter_rate_predicted_reward` (what `echo2 plan
    --reward-shares Q1,Q2,... --group-size G --prompt-concentration NU` plans for), the prediction of the run's own
    filter_rate where the reward pays more than right or wrong (math: 0.1 for a boxed wrong answer sets apart groups
    whose answers are all wrong). None
    where nothing was scored (or, for the second, the reward is continuous). Both nus pool the whole run: a
    policy that moved spreads the prompts' rates further (a smaller nu, a higher prediction) than any one moment
    did."""
    values = buffer.get("reward_values", _NO_VALUES)
    whole = _values_between(_NO_VALUES, values)
    shares = [[v, round(q, 4)] for v, q in _shares(whole, group_size).items()] if whole and whole[0] and group_size \
        else None
    by_reward = {**reward_prediction(_NO_VALUES, values, group_size), "reward_shares": shares}
    scored, groups = buffer.get("completed_scored", 0), buffer.get("scored_groups", 0)
    if not scored or not groups or not group_size:
        return {"accuracy": None, "prompt_concentration": None, "filter_rate_predicted": None,
                "filter_rate_binary": None, **by_reward}
    p = buffer["completed_correct"] / scored
    nu = capacity.prompt_concentration(groups, group_size, buffer["scored_groups_correct"], buffer["scored_groups_pairs"])
    return {"accuracy": round(p, 4), "prompt_concentration": None if nu is None else round(nu, 4),
            "filter_rate_predicted": round(capacity.filter_rate(p, group_size, nu), 4),
            "filter_rate_binary": round(buffer.get("scored_groups_all_or_none", 0) / groups, 4), **by_reward}
