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

Whose word counts. Successes, speeds and failures come either from the caller's own measurement
(``reporter=None``: the simulator) or from a receiver's report (``reporter=`` its id), which a worker
holding the token may make up. Reported figures are therefore bounded: a speed is clamped to
(0, MAX_RELAY_BPS]; each receiver has one vote per relay (its latest speed, its latest complaint), at
most MAX_REPORTERS receivers are remembered per relay, a relay's reported speed is the lower median of
its receivers' votes, and only while two receivers agree may it exceed the pool median; failures count
distinct complaining receivers inside the window, so one receiver never makes a relay rollout-only.

Chain assembly: the top ``N_ch`` relays are the seeds; the rest are appended round-robin across the
chains in rank order. Rollout-only workers hang off the chain tails, round-robin. A star is the same
plan with one chain per worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median, median_low

__all__ = [
    "SOURCE",
    "FAILURE_THRESHOLD",
    "SUCCESS_SATURATION",
    "DECAY_WINDOW_S",
    "MAX_RELAY_BPS",
    "MAX_REPORTERS",
    "clamp_bps",
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
MAX_RELAY_BPS = 100e9 / 8  # 100 Gbit/s: a reported relay speed above this is taken as this
MAX_REPORTERS = 8  # receivers whose votes on one relay are kept (the most recent ones)


@dataclass
class RelayStats:
    speed_bps: float | None = None  # EWMA of bytes/s this worker served to its children (own measurements)
    successes: int = 0
    failures: list[float] = field(default_factory=list)  # times of failures (caller's clock, own measurements)
    speeds: dict[str, float] = field(default_factory=dict)  # receiver -> EWMA of the bytes/s it reported
    complaints: dict[str, float] = field(default_factory=dict)  # receiver -> time of its latest complaint

    def reported_bps(self) -> float | None:
        """What the receivers say: the lower median of their votes (one per receiver)."""
        return median_low(self.speeds.values()) if self.speeds else None


def clamp_bps(bytes_per_s: float | None) -> float | None:
    """A reported speed inside (0, MAX_RELAY_BPS], or None when it is no speed at all (<= 0, NaN)."""
    if bytes_per_s is None or not bytes_per_s > 0:
        return None
    return min(float(bytes_per_s), MAX_RELAY_BPS)


def _raw_bps(s: RelayStats) -> float | None:
    return s.speed_bps if s.speed_bps is not None else s.reported_bps()


def _vote(votes: dict[str, float], reporter: str, value: float) -> None:
    """Record `reporter`'s vote as the newest, forgetting the oldest beyond MAX_REPORTERS."""
    votes.pop(reporter, None)
    votes[reporter] = value
    while len(votes) > MAX_REPORTERS:
        del votes[next(iter(votes))]


class WorkerScores:
    """Per-worker relay statistics and the C.3 score. Times are passed in (seconds, any monotonic clock)."""

    def __init__(self, ewma: float = 0.5):
        self.stats: dict[str, RelayStats] = {}
        self.ewma = ewma

    def _get(self, wid: str) -> RelayStats:
        return self.stats.setdefault(wid, RelayStats())

    def record_success(self, wid: str, bytes_per_s: float | None = None, reporter: str | None = None) -> None:
        """A completed relay; `reporter`: the receiver that says so (None: the caller measured it)."""
        s = self._get(wid)
        s.successes += 1
        bps = clamp_bps(bytes_per_s)
        if bps is None:
            return
        if reporter is None:
            s.speed_bps = bps if s.speed_bps is None else (1 - self.ewma) * s.speed_bps + self.ewma * bps
        else:
            before = s.speeds.get(reporter)
            _vote(s.speeds, reporter, bps if before is None else (1 - self.ewma) * before + self.ewma * bps)

    def record_failure(self, wid: str, now: float, reporter: str | None = None) -> None:
        """A failed relay at `now`; `reporter`: the receiver that complains (None: the caller measured it).
        A receiver's complaints about one relay count once: its latest one."""
        s = self._get(wid)
        if reporter is None:
            s.failures = [t for t in s.failures if now - t < DECAY_WINDOW_S]  # older ones no longer count
            s.failures.append(now)
        else:
            _vote(s.complaints, reporter, now)

    def forget(self, wid: str) -> None:
        self.stats.pop(wid, None)

    def _recent(self, s: RelayStats, now: float) -> list[float]:
        times = [*s.failures, *s.complaints.values()]
        return [t for t in times if now - t < DECAY_WINDOW_S]

    def recent_failures(self, wid: str, now: float) -> int:
        """Failures inside the decay window: own measurements, plus one per complaining receiver."""
        s = self.stats.get(wid)
        return 0 if s is None else len(self._recent(s, now))

    def rollout_only(self, wid: str, now: float) -> bool:
        return self.recent_failures(wid, now) >= FAILURE_THRESHOLD

    def speeds(self, pool: Iterable[str]) -> dict[str, float]:
        """Each measured relay's speed for ranking, bytes/s: own measurements as they are; else its receivers'
        lower median, capped at the pool's median relay speed while only one receiver votes (a lone report
        cannot lift a relay above the pool; it can still pull one below)."""
        raw = self._raw_speeds(pool)
        cap = median(raw.values()) if raw else 0.0
        return {w: min(v, cap) if self._lone(w) else v for w, v in raw.items()}

    def _raw_speeds(self, pool: Iterable[str]) -> dict[str, float]:
        return {w: v for w in pool if w in self.stats for v in [_raw_bps(self.stats[w])] if v}

    def _lone(self, wid: str) -> bool:
        s = self.stats[wid]
        return s.speed_bps is None and len(s.speeds) < 2

    def score(self, wid: str, now: float, pool: Iterable[str] | None = None,
              speeds: dict[str, float] | None = None) -> float:
        """Score_i (paper C.3); `speeds`: `self.speeds(pool)`, when the caller scores the whole pool."""
        pool = list(pool) if pool is not None else list(self.stats)
        speeds = self.speeds(pool) if speeds is None else speeds
        s = self._get(wid)
        if wid not in speeds:
            speed = median(speeds.values()) / max(speeds.values()) if speeds else 0.5
        else:
            speed = speeds[wid] / max(speeds.values())
        success = min(s.successes, SUCCESS_SATURATION) / SUCCESS_SATURATION
        recent = self._recent(s, now)
        stability = max(0.0, 1.0 - len(recent) / FAILURE_THRESHOLD)
        decay = 1.0 if not recent else 1.0 - 0.5 * max(0.0, 1.0 - (now - max(recent)) / DECAY_WINDOW_S)
        return decay * (W_SPEED * speed + W_SUCCESS * success + W_STABILITY * stability)

    def rank(self, wids: Sequence[str], now: float) -> list[str]:
        """Workers best first; among equal scores the one whose reported speed was capped the least (a claim far
        above the pool's is the less credible), then the given order (join order)."""
        speeds, raw = self.speeds(wids), self._raw_speeds(wids)
        scores = {w: self.score(w, now, wids, speeds) for w in wids}
        return sorted(wids, key=lambda w: (-scores[w], raw[w] / speeds[w] if w in speeds else 1.0))


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
