"""The learner's side of the data plane for one update (paper Algorithm 1: wait until R admissible trajectories
are buffered, then update): wait for k = R/n complete admissible groups, sample them, screen them (the audit) and
step the learner; a batch the step fails on is dropped and counted, never the run."""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from echo2sdk.core.audit import BatchWithheld
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.lr_schedule import partial_factor
from echo2sdk.errors import Echo2Error
from echo2sdk.runtime.learner.replay import AuditReplay

if TYPE_CHECKING:
    from echo2sdk.core.learner import StepStats

__all__ = ["Batches", "DataLimits", "Stopped", "MAX_DROPS_IN_A_ROW"]

log = logging.getLogger("echo2sdk.trainer")

MAX_DROPS_IN_A_ROW = 8  # batches the learner step fails on in a row before the run ends (a bug, not data)


class Stopped(Exception):
    """SIGTERM or SIGINT arrived while the learner waited for data."""


class Pool(Protocol):
    """What the wait reads of the pool: the coordinator's live workers and the run's own local workers."""

    def alive_workers(self) -> list: ...


WAIT_CAUSES = ("filtered", "snapshot", "empty")  # learner_wait_<cause>_s in metrics.jsonl


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


class Batches:
    """One update's batch: `wait(k)` for k groups, `learn(k, v_t, learner)` waits, samples, screens and steps."""

    def __init__(self, buffer: StalenessBuffer, pool: Pool, local: LocalWorkers, audit: AuditReplay,
                 limits: DataLimits, stop: threading.Event):
        self.buffer, self.pool, self.local, self.audit = buffer, pool, local, audit
        self.limits, self.stop = limits, stop
        self.last: list = []  # the last batch sampled
        self.dropped = 0  # batches the learner step raised on (dropped, training went on)
        self.dropped_by_worker: collections.Counter[str] = collections.Counter()  # their records, by worker
        # the last step's waiting by cause (WAIT_CAUSES, split as `wait` says)
        self.wait_causes: dict[str, float] = dict.fromkeys(WAIT_CAUSES, 0.0)
        self.partial = 0  # steps that trained on fewer than k groups (learner.max_wait_s)

    def learn(self, k: int, v_t: int, learner: Any) -> tuple[float, float, list, StepStats]:
        """Wait for k groups, sample them and step the learner on them. A batch the step raises on (ValueError
        or RuntimeError from its data; NonFiniteUpdate: nothing was applied) is dropped, counted and logged with
        the workers of its records, and the next k groups are waited for; MAX_DROPS_IN_A_ROW drops in a row end
        the run. A batch the audit's screen withheld whole is audited, counted (batches_withheld) and replaced
        the same way, without counting as a drop. Returns (time waited, when the stepped batch was taken, the
        batch, the step's stats)."""
        t_wait, drops = 0.0, 0
        self.wait_causes = dict.fromkeys(WAIT_CAUSES, 0.0)
        while True:
            t_wait += self.wait(k)
            t0 = time.perf_counter()
            n = k if self.buffer.wait_for(k, timeout=0) else min(k, self.buffer.ready_groups())  # max_wait_s: fewer
            if n == 0:  # the ready groups went (a worker dropped, or stale) since the wait ended: wait again
                continue
            try:
                groups = self.last = self.buffer.sample(n)
            except ValueError:  # a partial batch's groups went stale meanwhile: wait again
                continue
            scale = partial_factor(self.limits.partial_lr, n, k)
            try:
                stats = learner.step(groups, self.audit.screen(v_t, groups), scale)
                self.partial += n < k
                return t_wait, t0, groups, stats
            except BatchWithheld as e:
                self.audit.withheld_batch(v_t, [t for g in groups for t in g], e.audit_sums, e.withheld)
            except (ValueError, RuntimeError) as e:
                drops += 1
                self._drop(v_t, groups, e)
                if drops >= MAX_DROPS_IN_A_ROW:
                    raise Echo2Error(f"the learner step failed on {drops} batches in a row; the last: {e}") from e

    def _drop(self, v_t: int, groups: list, error: Exception) -> None:
        workers = collections.Counter(t.meta.worker for g in groups for t in g)
        self.dropped += 1
        self.dropped_by_worker.update(workers)
        log.warning("learner step at v%d failed (%s: %s): batch of %d records dropped (records by worker: %s)",
                    v_t, type(error).__name__, error, sum(workers.values()), dict(workers))

    def wait(self, k: int, whole: bool = False) -> float:
        """Block until k complete admissible groups are buffered (or the zero-variance fallback fills the batch:
        core/buffer.py), or, with learner.max_wait_s (and not `whole`), until that long has passed with
        learner.min_groups ready (`learn` then trains on those); the time spent is learner_wait_s, split in
        `wait_causes` by what the pool produced meanwhile: of the groups that arrived during the wait, the share filtered for zero reward variance
        counts as "filtered" (the pool was busy, on groups the learner cannot use), the share refused as stale
        (v < v_t - S: generated on a snapshot older than the learner can use) as "snapshot" (waiting for the
        workers to install a newer one), the rest as "empty" (all of it when no group arrived). Every 30 s of
        waiting while groups are being filtered, a warning says so. Raises Stopped when `stop` is set."""
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
        self._note_causes(waited, before)
        ready = self.buffer.ready_groups()
        if ready < k and self.buffer.wait_for(k, timeout=0):  # not a partial batch (learner.max_wait_s): the fallback
            log.info("step fills its batch with %d zero-variance group(s): learner.filter_patience=%d x %d groups "
                     "were filtered while it waited", k - ready, self.limits.filter_patience, k)
        return waited

    def _poll(self, t0: float) -> float:
        """How long one wait for the batch may block: 1 s, less when learner.max_wait_s is due sooner."""
        if self.limits.max_wait_s is None:
            return 1.0
        return min(1.0, max(0.01, t0 + self.limits.max_wait_s - time.perf_counter()))

    def _note_causes(self, waited: float, before: dict) -> None:
        """Split `waited` seconds between the WAIT_CAUSES by the shares of the groups that arrived meanwhile
        (`before`: the buffer's stats at the wait's start): filtered ones, stale ones (records refused as "stale",
        in groups), and the rest."""
        now, g = self.buffer.stats(), self.buffer.group_size
        filtered = now["filtered_groups"] - before["filtered_groups"]
        stale = (now["rejected"].get("stale", 0) - before["rejected"].get("stale", 0)) / g
        arrived = now["completed_groups"] - before["completed_groups"] + stale
        shares = {"filtered": filtered / arrived, "snapshot": stale / arrived} if arrived else {}
        shares["empty"] = 1.0 - sum(shares.values())
        for cause, share in shares.items():
            self.wait_causes[cause] += waited * share

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
