"""Forwarding-chain planning and relay scoring (paper §4.2, appendix C.3). Pure: no I/O, no clock of its own.

    Score_i = Decay_i * (0.5 * Speed_i + 0.35 * Success_i + 0.15 * Stability_i)

- ``Speed_i``     the worker's observed relay throughput over the best in the pool, in [0, 1]; a worker
                  never measured gets the pool median (0.5 when nobody is measured yet).
- ``Success_i``   completed relays, saturating at SUCCESS_SATURATION = 10: min(n, 10) / 10.
- ``Stability_i`` 1 - (failures inside the decay window) / FAILURE_THRESHOLD, floored at 0.
- ``Decay_i``     0.5 right after a failure, recovering linearly to 1 over DECAY_WINDOW_S = 600 s.

A worker with FAILURE_THRESHOLD = 3 failures inside the window loses its forwarding role and stays a
rollout-only worker (it still receives snapshots, as a leaf) until the window forgets them. Degraded
workers therefore move seed -> tail (lower score) -> rollout-only (threshold), as in the paper.

Chain assembly: the top ``N_ch`` relays are the seeds; the rest are appended round-robin across the
chains in rank order. Rollout-only workers hang off the chain tails, round-robin. A star is the same
plan with one chain per worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

__all__ = [
    "SOURCE",
    "FAILURE_THRESHOLD",
    "SUCCESS_SATURATION",
    "DECAY_WINDOW_S",
    "RelayStats",
    "WorkerScores",
    "ChainPlan",
    "plan_chains",
]

SOURCE = "learner"  # the name of the root of every chain
FAILURE_THRESHOLD = 3
SUCCESS_SATURATION = 10
DECAY_WINDOW_S = 600.0
W_SPEED, W_SUCCESS, W_STABILITY = 0.5, 0.35, 0.15


@dataclass
class RelayStats:
    speed_bps: float | None = None  # EWMA of bytes/s this worker served to its children
    successes: int = 0
    failures: list[float] = field(default_factory=list)  # times of failures (caller's clock)


class WorkerScores:
    """Per-worker relay statistics and the C.3 score. Times are passed in (seconds, any monotonic clock)."""

    def __init__(self, ewma: float = 0.5):
        self.stats: dict[str, RelayStats] = {}
        self.ewma = ewma

    def _get(self, wid: str) -> RelayStats:
        return self.stats.setdefault(wid, RelayStats())

    def record_success(self, wid: str, bytes_per_s: float | None = None) -> None:
        s = self._get(wid)
        s.successes += 1
        if bytes_per_s is not None and bytes_per_s > 0:
            s.speed_bps = bytes_per_s if s.speed_bps is None else (1 - self.ewma) * s.speed_bps + self.ewma * bytes_per_s

    def record_failure(self, wid: str, now: float) -> None:
        self._get(wid).failures.append(now)

    def forget(self, wid: str) -> None:
        self.stats.pop(wid, None)

    def recent_failures(self, wid: str, now: float) -> int:
        s = self.stats.get(wid)
        return 0 if s is None else sum(1 for t in s.failures if now - t < DECAY_WINDOW_S)

    def rollout_only(self, wid: str, now: float) -> bool:
        return self.recent_failures(wid, now) >= FAILURE_THRESHOLD

    def score(self, wid: str, now: float, pool: Iterable[str] | None = None) -> float:
        pool = list(pool) if pool is not None else list(self.stats)
        speeds = [self.stats[w].speed_bps for w in pool if w in self.stats and self.stats[w].speed_bps]
        s = self._get(wid)
        if s.speed_bps is None:
            speed = median(speeds) / max(speeds) if speeds else 0.5
        else:
            speed = s.speed_bps / max(speeds + [s.speed_bps])
        success = min(s.successes, SUCCESS_SATURATION) / SUCCESS_SATURATION
        recent = [t for t in s.failures if now - t < DECAY_WINDOW_S]
        stability = max(0.0, 1.0 - len(recent) / FAILURE_THRESHOLD)
        decay = 1.0 if not recent else 1.0 - 0.5 * max(0.0, 1.0 - (now - max(recent)) / DECAY_WINDOW_S)
        return decay * (W_SPEED * speed + W_SUCCESS * success + W_STABILITY * stability)

    def rank(self, wids: Sequence[str], now: float) -> list[str]:
        """Workers best first; ties keep the given order (join order)."""
        scores = {w: self.score(w, now, wids) for w in wids}
        return sorted(wids, key=lambda w: -scores[w])


@dataclass(frozen=True)
class ChainPlan:
    """Who fetches from whom. ``chains[c]`` lists relays seed first; ``leaves`` maps a rollout-only worker
    to the relay it hangs off (or SOURCE when there is no relay at all)."""

    chains: tuple[tuple[str, ...], ...]
    leaves: tuple[tuple[str, str], ...] = ()

    @property
    def n_chains(self) -> int:
        return len(self.chains)

    def workers(self) -> list[str]:
        return [w for c in self.chains for w in c] + [w for w, _ in self.leaves]

    def upstream(self, wid: str) -> tuple[str, ...]:
        """Ancestors of ``wid`` nearest first, ending with SOURCE: the parent, then the repair fallbacks."""
        for chain in self.chains:
            if wid in chain:
                i = chain.index(wid)
                return tuple(reversed(chain[:i])) + (SOURCE,)
        for leaf, parent in self.leaves:
            if leaf == wid:
                return (SOURCE,) if parent == SOURCE else (parent, *self.upstream(parent))
        raise KeyError(f"worker {wid!r} is not in the plan")

    def parent(self, wid: str) -> str:
        return self.upstream(wid)[0]


def plan_chains(ranked: Sequence[str], n_chains: int, rollout_only: Iterable[str] = ()) -> ChainPlan:
    """Assemble ``n_chains`` forwarding chains from workers ranked best first (paper C.3)."""
    if n_chains < 1:
        raise ValueError(f"n_chains must be >= 1, got {n_chains!r}")
    if len(set(ranked)) != len(ranked):
        raise ValueError(f"ranked workers must be distinct, got {list(ranked)!r}")
    excluded = set(rollout_only)
    relays = [w for w in ranked if w not in excluded]
    leaves = [w for w in ranked if w in excluded]
    n = min(n_chains, len(relays))
    chains: list[list[str]] = [[] for _ in range(n)]
    for i, w in enumerate(relays):
        chains[i % n].append(w)
    tails = [c[-1] for c in chains] or [SOURCE]
    return ChainPlan(
        chains=tuple(tuple(c) for c in chains),
        leaves=tuple((w, tails[i % len(tails)]) for i, w in enumerate(leaves)),
    )
