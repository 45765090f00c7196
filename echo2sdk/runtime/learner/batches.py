"""The learner's side of the data plane for one update (paper Algorithm 1: wait until R admissible trajectories
are buffered, then update): wait for k = R/n complete admissible groups and sample them (`Batches.next`, a `Batch`);
a batch the learner's step fails on is dropped and counted (`Batches.drop`), never the run. A batch reports its own
columns of the metrics row (`Batch.metrics`)."""

from __future__ import annotations

import collections
import functools
import logging
import statistics
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from echo2sdk.core.buffer import StalenessBuffer, task_bucket
from echo2sdk.core.lr_schedule import partial_factor
from echo2sdk.core.verdict import WAIT_CAUSES
from echo2sdk.errors import Echo2Error

__all__ = ["Batch", "Batches", "DataLimits", "Stopped", "MAX_DROPS_IN_A_ROW", "per_task", "task_means", "is_measure"]

log = logging.getLogger("echo2sdk.learner")

MAX_DROPS_IN_A_ROW = 8  # batches the learner step fails on in a row before the run ends (a bug, not data)


class Stopped(Exception):
    """SIGTERM or SIGINT arrived while the learner waited for data."""


class Pool(Protocol):
    """What the wait reads of the pool: the coordinator's live workers and the run's own local workers."""

    def alive_workers(self) -> list: ...


class LocalWorkers(Protocol):
    def started(self) -> list[str]: ...

    def exited(self) -> list[str]: ...


@dataclass(frozen=True)
class DataLimits:
    """How long the learner waits: learner.data_timeout_s without progress, 5 heartbeats once every local worker
    has exited and none is connected; learner.filter_patience for the zero-variance note; where worker logs are;
    learner.max_wait_s and learner.min_groups: after that long a step trains on the informative groups it has, at
    the rate learner.partial_lr gives such a batch (core/lr_schedule.partial_factor)."""

    data_timeout_s: float
    heartbeat_s: float
    filter_patience: int
    logs: Path
    max_wait_s: float | None = None
    min_groups: int = 1
    partial_lr: str = "sqrt"


@dataclass(frozen=True)
class Batch:
    """One update's batch: `groups` sampled at learner version `v_t` for k asked (fewer after learner.max_wait_s:
    `partial`, stepped at the learning-rate factor `lr_scale`), the seconds the learner waited for it (`waited`, the
    waits for batches dropped before it in the same update included) by cause (`wait_causes`, WAIT_CAUSES), and when
    it was taken (`taken_at`, time.perf_counter())."""

    groups: list
    v_t: int
    k: int
    lr_scale: float
    waited: float
    wait_causes: Mapping[str, float]
    taken_at: float

    @functools.cached_property
    def records(self) -> list:
        return [t for g in self.groups for t in g]

    @property
    def deltas(self) -> list[int]:
        """Each record's staleness Delta = v_t - v (<= S by admission)."""
        return [self.v_t - t.version for t in self.records]

    @property
    def partial(self) -> bool:
        return len(self.groups) < self.k

    def metrics(self, now: float) -> dict[str, Any]:
        """The batch's columns of its metrics row: the step's wall time up to `now` (the wait included) and the
        learner's wait for the batch, whole and by cause (seconds); the batch's reward mean and spread, its accuracy
        (None: the task scores no "correct"), its staleness and size, the means of its records' task metadata, and
        the span of the policy versions that generated it."""
        records, deltas = self.records, self.deltas
        rewards = [t.reward for t in records]
        scored = [c for c in (t.meta.extra.get("correct") for t in records) if c is not None]
        return {
            "t_step_wall_s": round(now - self.taken_at + self.waited, 4), "learner_wait_s": round(self.waited, 4),
            "reward_mean": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards),
            "accuracy": statistics.fmean(bool(c) for c in scored) if scored else None,
            # split by the shares of the groups that arrived meanwhile (Batches.wait)
            **{f"learner_wait_{c}_s": round(self.wait_causes.get(c, 0.0), 4) for c in WAIT_CAUSES},
            "staleness_max": max(deltas), "staleness_mean": statistics.fmean(deltas),
            "trajectories": len(records),
            "task": task_means(records),
            # the snapshots it came from: max v - min v over its records (0: one policy version generated it all)
            "version_span": max(t.version for t in records) - min(t.version for t in records),
        }


class Batches:
    """The updates' batches: `next(k, v_t)` waits for k groups and samples them; the recipe steps the learner on the
    batch and says how that went: `trained`, or `drop` when the step raised."""

    def __init__(self, buffer: StalenessBuffer, pool: Pool, local: LocalWorkers, limits: DataLimits,
                 stop: threading.Event):
        self.buffer, self.pool, self.local = buffer, pool, local
        self.limits, self.stop = limits, stop
        self.last: list = []  # the last batch sampled
        self.dropped = 0  # batches the learner step raised on (dropped, training went on)
        self.dropped_by_worker: collections.Counter[str] = collections.Counter()  # their records, by worker
        self.partial = 0  # steps that trained on fewer than k groups (learner.max_wait_s)
        self._update_started()

    def _update_started(self) -> None:
        """What one update has waited so far, over the batches dropped on its way (`next` adds, `trained` resets)."""
        self._waited, self._causes, self._drops = 0.0, dict.fromkeys(WAIT_CAUSES, 0.0), 0

    def next(self, k: int, v_t: int) -> Batch:
        """The next batch at learner version v_t: wait for k groups (`wait`) and sample them, fewer once
        learner.max_wait_s has passed (the batch is then `partial`, and steps at the rate learner.partial_lr gives
        it)."""
        while True:
            waited, causes = self.wait(k)
            self._waited += waited
            for cause, seconds in causes.items():
                self._causes[cause] += seconds
            t0 = time.perf_counter()
            n = k if self.buffer.wait_for(k, timeout=0) else min(k, self.buffer.ready_groups())  # max_wait_s: fewer
            if n == 0:  # the ready groups went (a worker dropped, or stale) since the wait ended: wait again
                continue
            try:
                groups = self.last = self.buffer.sample(n)
            except ValueError:  # a partial batch's groups went stale meanwhile: wait again
                continue
            return Batch(groups, v_t, k, partial_factor(self.limits.partial_lr, n, k), self._waited,
                         dict(self._causes), t0)

    def trained(self, batch: Batch) -> None:
        """The learner stepped on `batch` (counted in `partial` when it was); the next update waits anew."""
        self.partial += batch.partial
        self._update_started()

    def drop(self, batch: Batch, error: Exception) -> None:
        """The learner's step raised on `batch` (ValueError or RuntimeError from its data; NonFiniteUpdate: nothing was
        applied): dropped, counted and logged with the workers of its records. MAX_DROPS_IN_A_ROW drops in a row end
        the run (Echo2Error)."""
        workers = collections.Counter(t.meta.worker for t in batch.records)
        self.dropped += 1
        self._drops += 1
        self.dropped_by_worker.update(workers)
        log.warning("learner step at v%d failed (%s: %s): batch of %d records dropped (records by worker: %s)",
                    batch.v_t, type(error).__name__, error, sum(workers.values()), dict(workers))
        if self._drops >= MAX_DROPS_IN_A_ROW:
            raise Echo2Error(f"the learner step failed on {self._drops} batches in a row; the last: {error}") from error

    def metrics(self) -> dict[str, Any]:
        """Batches' column of a metrics row: the batches dropped so far."""
        return {"batches_dropped": self.dropped}

    def summary(self) -> dict[str, Any]:
        """Batches' part of summary.json: the batches dropped (the learner step raised on them; training went on), the
        partial ones (fewer than R/n groups after learner.max_wait_s) and the dropped records by worker."""
        return {"batches_dropped": self.dropped, "batches_partial": self.partial,
                "batches_dropped_records_by_worker": dict(self.dropped_by_worker)}

    def wait(self, k: int, whole: bool = False) -> tuple[float, dict[str, float]]:
        """Block until k complete admissible groups are buffered (or the zero-variance fallback fills the batch:
        core/buffer.py), or, with learner.max_wait_s (and not `whole`), until that long has passed with
        learner.min_groups ready (`next` then samples those). Returns the time spent (learner_wait_s) and its split
        by what the pool produced meanwhile (WAIT_CAUSES): of the groups that arrived during the wait, the share
        filtered for zero reward variance counts as "filtered" (the pool was busy, on groups the learner cannot use),
        the share refused as stale (v < v_t - S: generated on a snapshot older than the learner can use) as
        "snapshot" (waiting for the workers to install a newer one), the rest as "empty" (all of it when no group
        arrived). Every 30 s of waiting while groups are being filtered, a warning says so. Raises Stopped when
        `stop` is set."""
        t0 = time.perf_counter()
        last_progress = last_note = t0
        before = self.buffer.stats()
        have, filtered = self.buffer.ready_groups(), before["filtered_groups"]
        lim = self.limits
        while not self.buffer.wait_for(k, timeout=self._poll(t0)):
            if self.stop.is_set():
                raise Stopped()
            now = time.perf_counter()
            due = lim.max_wait_s is not None and not whole and now - t0 >= lim.max_wait_s
            if due and self.buffer.ready_groups() >= lim.min_groups:
                break
            if now - last_note >= 30.0:
                last_note = now
                self._note_filtered(k, now - t0, filtered)
            if self.buffer.ready_groups() != have:
                have, last_progress = self.buffer.ready_groups(), now
            self._check_progress(now - last_progress, filtered)
        waited = time.perf_counter() - t0
        causes = self._causes_of(waited, before)
        ready = self.buffer.ready_groups()
        if ready < k and self.buffer.wait_for(k, timeout=0):  # not a partial batch (learner.max_wait_s): the fallback
            log.info("step fills its batch with %d zero-variance group(s): learner.filter_patience=%d x %d groups "
                     "were filtered while it waited", k - ready, self.limits.filter_patience, k)
        return waited, causes

    def _poll(self, t0: float) -> float:
        """How long one wait for the batch may block: 1 s, less when learner.max_wait_s is due sooner."""
        if self.limits.max_wait_s is None:
            return 1.0
        return min(1.0, max(0.01, t0 + self.limits.max_wait_s - time.perf_counter()))

    def _causes_of(self, waited: float, before: dict) -> dict[str, float]:
        """`waited` seconds split between the WAIT_CAUSES by the shares of the groups that arrived meanwhile
        (`before`: the buffer's stats at the wait's start): filtered ones, stale ones (records refused as "stale",
        in groups), and the rest."""
        now, g = self.buffer.stats(), self.buffer.group_size
        filtered = now["filtered_groups"] - before["filtered_groups"]
        stale = (now["rejected"].get("stale", 0) - before["rejected"].get("stale", 0)) / g
        arrived = now["completed_groups"] - before["completed_groups"] + stale
        shares = {"filtered": filtered / arrived, "snapshot": stale / arrived} if arrived else {}
        shares["empty"] = 1.0 - sum(shares.values())
        return {cause: waited * shares.get(cause, 0.0) for cause in WAIT_CAUSES}

    def _check_progress(self, idle_s: float, filtered_before: int) -> None:
        """Raise when waiting cannot end: every local worker exited and none is connected, or no admissible
        trajectory for learner.data_timeout_s."""
        lim, local = self.limits, self.local.started()
        local_gone = bool(local) and len(self.local.exited()) == len(local)
        if local_gone and not self.pool.alive_workers() and idle_s > 5 * lim.heartbeat_s:
            raise Echo2Error(f"every rollout worker has exited and none is connected; see {lim.logs}")
        if idle_s > lim.data_timeout_s:
            raise Echo2Error(
                f"no admissible trajectories for {idle_s:.0f} s "
                f"(learner.data_timeout_s={lim.data_timeout_s}); workers alive: {len(self.pool.alive_workers())}; "
                f"exited local workers: {self.local.exited()}; zero-variance groups filtered while waiting: "
                f"{self.buffer.stats()['filtered_groups'] - filtered_before}; see {lim.logs}"
            )

    def _note_filtered(self, k: int, waited: float, filtered_before: int) -> None:
        """The warning of a step kept waiting by dynamic sampling (nothing when no group was filtered)."""
        stats = self.buffer.stats()
        n = stats["filtered_groups"] - filtered_before
        if n:
            log.warning("waiting %.0f s for %d informative groups (%d ready): %d group(s) filtered meanwhile for zero "
                        "reward variance (every member the same reward; groups_filtered=%d in all); "
                        "learner.filter_patience=%d, learner.filter_zero_variance=false trains on them",
                        waited, k, stats["ready_groups"], n, stats["filtered_groups"], self.limits.filter_patience)


#: Task metadata keys that name or number things (a row, an index, a seed) rather than measure them: never
#: averaged. Also every key ending in _id, _index, _row or seed.
ID_KEYS = frozenset({"id", "index", "row", "epoch", "position", "seed", "group", "step", "version", "example_id"})


def is_measure(key: str, value: object) -> bool:
    """A task-metadata field worth a mean: a number or a bool whose key is not an id (ID_KEYS)."""
    return (isinstance(value, (bool, int, float)) and key not in ID_KEYS
            and not key.endswith(("_id", "_index", "_row", "seed")))


def task_means(records: list) -> dict[str, float]:
    """Mean of every numeric (or boolean) task-metadata field over the records (Task.info, Score.info, an episode's
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
            "info": task_means(rs),
        }
    return out
