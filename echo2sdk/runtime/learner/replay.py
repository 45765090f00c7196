"""The worker audit as the run applies it (core/audit.py holds the statistics; docs/security.md, "Lying workers"):
before each update a few records per worker are replayed under the snapshot of the version they claim, the batch
is screened, and a worker over the thresholds twice in a row is quarantined at the coordinator."""

from __future__ import annotations

import collections
import logging
import math
import random
import time
from collections.abc import Mapping
from typing import Any, Protocol

from echo2sdk.core.audit import SamplerAudit, WorkerStat, audit_items, replay_stats, worker_stats

__all__ = ["AuditReplay", "Quarantine", "ReplaySums"]

log = logging.getLogger("echo2sdk.learner")


class Quarantine(Protocol):
    """Where a flagged worker is refused from (the Coordinator)."""

    def quarantine(self, worker_id: str, reason: str) -> Any: ...


class ReplaySums(Protocol):
    """The learner's recomputation of records under older snapshots (distributed.Lockstep)."""

    def replay_sums(self, records: list, states: dict[int, dict[str, Any]]) -> list: ...


class AuditReplay:
    """The audit (`audit`: a SamplerAudit, None when learner.lie_threshold is 0), its replay of up to `replay_n`
    records per worker, the published snapshots it replays under, and what it withheld."""

    def __init__(self, quarantine: Quarantine, learner: ReplaySums, *, lie_threshold: float,
                 lie_var_threshold: float, replay_n: int):
        self.quarantine, self.learner, self.replay_n = quarantine, learner, replay_n
        self.audit = SamplerAudit(lie_threshold, lie_var_threshold) if lie_threshold else None
        self.batches_withheld = 0  # batches the audit's screen withheld whole (not counted as dropped)
        self.withheld_by_worker: collections.Counter[str] = collections.Counter()  # records withheld, by worker
        self.replay: dict[str, WorkerStat] = {}  # the stepped batch's replay_stats
        self.replay_s = 0.0  # the stepped batch's replay time
        self._states: dict[int, dict[str, Any]] = {}  # published snapshots of the admissible window, by version
        self._rng = random.SystemRandom()  # a worker cannot predict which of its records are replayed
        self._off = False  # set when a replay failed

    @property
    def replaying(self) -> bool:
        return self.audit is not None and self.replay_n > 0

    def keep(self, version: int, state: dict[str, Any], floor: int) -> None:
        """Keep a published snapshot (the state being serialized, not a copy) while a record may claim it:
        versions below `floor` (the buffer's v_t - S) are no longer admitted."""
        if not self.replaying:
            return
        self._states[version] = state
        for v in [v for v in self._states if v < floor]:
            del self._states[v]

    def screen(self, v_t: int, groups: list) -> Any:
        """The screen the learner step applies to `groups` at v_t (after this batch's replay); None without an
        audit."""
        return self.audit.screen(v_t, self._replay_batch(v_t, groups)) if self.audit else None

    def _replay_batch(self, v_t: int, groups: list) -> dict[str, WorkerStat]:
        """For each worker in the batch, up to replay_n of its records generated under an older version than v_t
        (at v_t the step's pi_old is already the claimed version's) and carrying a loss token, drawn at random
        (the worker cannot choose them), recomputed under the snapshot of the version each claims. Returns
        replay_stats. A replay that fails (out of memory, say) is logged and switched off for the rest of the run:
        the audit must not cost the learner its batches."""
        self.replay, self.replay_s = {}, 0.0
        if not self.replaying or self._off:
            return {}
        t0 = time.perf_counter()
        lagged: dict[str, list] = {}
        for t in (t for g in groups for t in g):
            if not t.meta.off_policy and t.meta.trains and t.version < v_t and t.version in self._states:
                lagged.setdefault(t.meta.worker, []).append(t)
        n = self.replay_n
        picked = [t for w in sorted(lagged) for t in self._rng.sample(lagged[w], min(n, len(lagged[w])))]
        if picked:
            try:
                sums = self.learner.replay_sums(picked, self._states)
            except (RuntimeError, ValueError, MemoryError) as e:
                self._off = True
                log.error("the audit's replay failed at v%d (%s: %s): replay off for the rest of the run "
                          "(learner.audit_replay); the screen on pi_old goes on", v_t, type(e).__name__, e)
                return {}
            self.replay = replay_stats((t.meta.worker, s) for t, s in zip(picked, sums))
        self.replay_s = time.perf_counter() - t0
        return self.replay

    def withheld_batch(self, v_t: int, records: list, sums: list, withheld: list[bool]) -> None:
        """A batch the screen withheld whole: audited and counted (batches_withheld), not trained on."""
        self.batches_withheld += 1
        self.audit_batch(v_t, records, sums, withheld)

    def audit_batch(self, v_t: int, records: list, sums: list, withheld: list[bool]) -> dict[str, Any]:
        """The audit of one stepped or withheld batch: counts the records the screen withheld; a worker over
        learner.lie_threshold / lie_var_threshold in 2 consecutive steps is quarantined. Returns the statistics
        per worker (WorkerStat)."""
        items = audit_items(records, sums, v_t)
        gone = [t.meta.worker for t, w in zip(records, withheld) if w]
        if gone:
            self.withheld_by_worker.update(gone)
            log.warning("audit at v%d: %d records withheld from the update (by worker: %s)", v_t,
                        len(gone), dict(collections.Counter(gone)))
        if self.audit is None:
            return worker_stats(items)
        for wid in self.audit.observe(items, self.replay):
            self.quarantine.quarantine(wid, self.audit.flagged[wid])
        return self.audit.history[-1]

    def metrics(self, audit: Mapping[str, WorkerStat]) -> dict[str, Any]:
        """The audit's columns of a metrics row: its statistics per worker of the stepped batch (`audit`, as
        audit_batch gave them), those of the batch's replay (a few records per worker under the version each claims:
        lag 0 for both statistics) and the replay's time; the batches and records its screen withheld so far."""
        return {
            "sampler_gap": _rounded(audit, "gap"), "sampler_var": _rounded(audit, "var"),
            "sampler_replay_gap": _rounded(self.replay, "gap"), "sampler_replay_var": _rounded(self.replay, "var"),
            "t_audit_replay_s": round(self.replay_s, 4),
            "batches_withheld": self.batches_withheld,  # withheld whole (not trained on, not counted as dropped)
            "records_withheld_total": sum(self.withheld_by_worker.values()),
        }

    def summary(self) -> dict[str, Any]:
        """The audit's part of summary.json: the batches its screen withheld whole, the records withheld by worker."""
        return {"batches_withheld": self.batches_withheld, "records_withheld_by_worker": dict(self.withheld_by_worker)}


def _rounded(stats: Mapping[str, WorkerStat] | None, field: str) -> dict[str, float | None]:
    """One audit statistic per worker, rounded; a non-finite variance is None (JSON has no NaN)."""
    out = {}
    for w, s in (stats or {}).items():
        v = getattr(s, field)
        out[w] = round(v, 6) if field == "gap" or math.isfinite(v) else None
    return out
