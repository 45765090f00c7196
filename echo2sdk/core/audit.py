"""Worker audit (beyond the paper): catch a rollout worker whose records lie about how they were generated.

A record claims two things the learner can check:

- the sampler's per-token log-probs (``Meta.logprobs``, pi_sampler). The learner computes log pi_old of every
  response token anyway, for the importance weight w_t = min(pi_old / pi_sampler, C). With
  d_t = log pi_old(y_t) - log pi_sampler(y_t) over a record's loss tokens, it keeps `TokenSums` per record.
  An honest record differs from pi_old only by the snapshot's rounding (bf16), the sampler's kernels and the
  policy's drift over the record's lag Delta = v_t - v. Records replayed from a log (``Meta.off_policy``)
  carry placeholder log-probs and are left out.
- the version v: it must be one the worker reported installed (checked by the coordinator on intake).

Two statistics per worker (`WorkerStat`):

    gap = mean over its records of  mean_t |d_t| / (1 + Delta)
    var = Var_t(d_t) / Var_t(log pi_old(y_t))            (pooled over its tokens at lag Delta = 0 only)

`gap` catches claims that are off by a lot (another model's log-probs); its allowance grows linearly with
the lag. `var` catches claims that do not track the policy token by token: the fraction of the variance of
log pi its claims leave unexplained. Against the version the record claims, an honest sampler explains nearly
all of it (SmolLM2: <= 0.002); a worker that does not run the policy cannot: constant claims leave exactly 1,
another model's log-probs about 1 or more. Against a later policy an honest record's var says little (the
policy's drift: SmolLM2 groups read up to 0.83 after 1-6 real updates), so var is taken only where the
log-probs are the claimed version's: at lag 0 in the step's pi_old, and in the replay.

The replay (`replay_stats`): every step the learner recomputes a few records per worker under the snapshot of
the version each claims (the trainer keeps the published snapshots of the admissible window), so both
statistics are taken at lag 0 whatever the lag a worker claims: a liar cannot buy an allowance by labelling
its records with an older version it installed. A worker over a threshold there is condemned for the step.
The statistics are undefined (NaN, never over) below MIN_TOKENS tokens or when log pi hardly varies
(a nearly deterministic response, where any claim is nearly right).

A worker is over in a step when gap > `gap_threshold` or var > `var_threshold` (0 turns that check off), in
the step's pi_old or in the replay. The learner's step screens every unit (rows sharing a prompt) with
`Screen` before its gradient is taken: the rows of a worker over the thresholds there, or condemned by the
replay, are withheld from the update (they never train). `SamplerAudit` flags a worker over in `patience` (2)
consecutive learner steps in which it contributed records (a step without its records, or one where var is
undefined for all of them and nothing is over, neither counts nor resets, up to MAX_SILENT - 1 of them in a
row), or at once when a statistic exceeds AT_ONCE (4) times its threshold (another model's log-probs give a
gap of ~5 against 0.5). docs/security.md has the measured honest values and margins.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass

from echo2sdk.core import checks
from echo2sdk.core.records import Trajectory
from echo2sdk.errors import ConfigError

__all__ = ["AT_ONCE", "TokenSums", "replay_stats", "BatchWithheld", "WorkerStat", "worker_stats", "audit_items", "Screen", "SamplerAudit", "PATIENCE",
           "MIN_TOKENS", "MIN_LP_VAR"]

PATIENCE = 2  # consecutive learner steps over a threshold before a worker is flagged
AT_ONCE = 4.0  # a statistic this many times its threshold flags the worker in one step
MAX_SILENT = 3  # steps in a row that say nothing (var undefined, nothing over) after which a strike expires
MIN_TOKENS = 16  # loss tokens the var statistic needs
MIN_LP_VAR = 0.1  # per-token variance of log pi_old below which var is undefined


@dataclass(frozen=True)
class TokenSums:
    """Sums over loss tokens of d = log pi_old - log pi_sampler and of log pi_old (`lp`)."""

    n: float = 0.0
    abs_d: float = 0.0
    d: float = 0.0
    d2: float = 0.0
    lp: float = 0.0
    lp2: float = 0.0

    def __add__(self, other: TokenSums) -> TokenSums:
        return TokenSums(*(a + b for a, b in zip(astuple(self), astuple(other))))

    @property
    def gap(self) -> float:
        """mean |d| (NaN without a token)."""
        return self.abs_d / self.n if self.n > 0 else math.nan

    @property
    def unexplained(self) -> float:
        """Var(d) / Var(lp) over the tokens; NaN below MIN_TOKENS tokens or Var(lp) < MIN_LP_VAR."""
        if self.n < MIN_TOKENS:
            return math.nan
        var_lp = self.lp2 / self.n - (self.lp / self.n) ** 2
        if not var_lp >= MIN_LP_VAR:
            return math.nan
        return max(self.d2 / self.n - (self.d / self.n) ** 2, 0.0) / var_lp


class BatchWithheld(ValueError):
    """The learner step's screen withheld every row of the batch: nothing was applied (`Learner.step`).
    Carries the per-record `audit_sums` and `withheld` flags for the audit."""

    def __init__(self, audit_sums: list[TokenSums], withheld: list[bool]):
        super().__init__(f"the audit withheld all {len(withheld)} records of the batch")
        self.audit_sums, self.withheld = audit_sums, withheld


@dataclass(frozen=True)
class WorkerStat:
    gap: float
    var: float  # NaN: undefined

    def over(self, gap_threshold: float, var_threshold: float) -> str | None:
        """Which statistic is over its threshold ("gap" or "var"), or None."""
        if self.gap > gap_threshold:
            return "gap"
        if var_threshold > 0 and self.var > var_threshold:  # NaN > x is False
            return "var"
        return None


def worker_stats(items: Iterable[tuple[str, int, TokenSums]]) -> dict[str, WorkerStat]:
    """Per worker from its records' (worker, Delta, sums); records without a token are skipped. var pools the
    records at lag 0 only (NaN without one)."""
    per: dict[str, list[tuple[int, TokenSums]]] = {}
    for w, lag, s in items:
        if s.n > 0:
            per.setdefault(w, []).append((max(lag, 0), s))
    out = {}
    for w, recs in per.items():
        gap = math.fsum(s.gap / (1 + lag) for lag, s in recs) / len(recs)
        out[w] = WorkerStat(gap, sum((s for lag, s in recs if lag == 0), TokenSums()).unexplained)
    return out


def replay_stats(items: Iterable[tuple[str, TokenSums]]) -> dict[str, WorkerStat]:
    """Per worker from the replay's (worker, sums) of records recomputed under the version each claims: both
    statistics at lag 0."""
    return worker_stats((w, 0, s) for w, s in items)


def audit_items(records: Sequence[Trajectory], sums: Sequence[TokenSums], v_t: int) -> list[tuple[str, int, TokenSums]]:
    """(worker, Delta = v_t - v, sums) of the on-policy records, from a learner step's per-record sums."""
    if len(sums) != len(records):
        raise ValueError(f"{len(sums)} token sums for {len(records)} records")
    return [(t.meta.worker, v_t - t.version, s) for t, s in zip(records, sums) if not t.meta.off_policy]


@dataclass(frozen=True)
class Screen:
    """The learner step's screen: which rows of a unit to withhold from the update (`Learner.step`)."""

    v_t: int
    gap_threshold: float
    var_threshold: float
    condemned: tuple[str, ...] = ()  # workers over a threshold in the step's replay: every row withheld

    def withhold(self, rows: Sequence[tuple[str, int, TokenSums]]) -> list[bool]:
        """`rows`: (worker, version, sums) of one unit's rows; True for the rows of a worker over a threshold
        or condemned."""
        stats = worker_stats((w, self.v_t - v, s) for w, v, s in rows)
        over = {w for w, st in stats.items() if st.over(self.gap_threshold, self.var_threshold)}
        return [w in over or w in self.condemned for w, _, _ in rows]


class SamplerAudit:
    """Flags workers over a threshold for `patience` consecutive steps they took part in.

    `observe` returns the workers flagged by this step (each one once); `history` keeps every step's
    statistics (for the run's metrics and the benchmark), `flagged` worker -> the reason."""

    def __init__(self, gap_threshold: float, var_threshold: float = 0.0, patience: int = PATIENCE):
        checks.real("lie_threshold", gap_threshold, lo=0, open_lo=True, error=ConfigError)
        checks.real("lie_var_threshold", var_threshold, lo=0, error=ConfigError)
        checks.integer("patience", patience, lo=1, error=ConfigError)
        self.gap_threshold, self.var_threshold, self.patience = gap_threshold, var_threshold, patience
        self.history: list[dict[str, WorkerStat]] = []
        self.replays: list[dict[str, WorkerStat]] = []  # each step's replay_stats, of the workers in its batch
        self.flagged: dict[str, str] = {}
        self._strikes: dict[str, int] = {}
        self._silent: dict[str, int] = {}  # consecutive steps that said nothing (_informative) since its last strike

    def screen(self, v_t: int, replay: dict[str, WorkerStat] | None = None) -> Screen:
        """The step's screen; `replay`: the step's replay_stats, whose workers over a threshold are condemned."""
        over = sorted(w for w, st in (replay or {}).items() if st.over(self.gap_threshold, self.var_threshold))
        return Screen(v_t, self.gap_threshold, self.var_threshold, tuple(over))

    def observe(self, items: Iterable[tuple[str, int, TokenSums]], replay: dict[str, WorkerStat] | None = None) -> list[str]:
        """Take one learner step's (worker, Delta, sums) per record (audit_items) and its replay_stats."""
        stats = worker_stats(items)
        replay = {w: st for w, st in (replay or {}).items() if w in stats}  # a worker takes part through its records
        self.history.append(stats)
        self.replays.append(replay)
        out = []
        for w, st in stats.items():
            over = []  # (statistic, value, threshold) of each statistic over its threshold
            for label, ws in (("", st), ("replayed ", replay.get(w))):
                which = ws.over(self.gap_threshold, self.var_threshold) if ws is not None else None
                if which:
                    over.append((label + which, *((ws.gap, self.gap_threshold) if which == "gap" else
                                                  (ws.var, self.var_threshold))))
            silent = self._silent.get(w, 0) + 1
            if over:
                self._strikes[w], self._silent[w] = self._strikes.get(w, 0) + 1, 0
            elif self._informative(st, replay.get(w)) or silent >= MAX_SILENT:
                self._strikes[w], self._silent[w] = 0, 0
            else:
                self._silent[w] = silent
            if not over or w in self.flagged:
                continue
            which, value, limit = max(over, key=lambda o: o[1] / o[2])
            if self._strikes[w] >= self.patience:
                self.flagged[w] = (f"sampler log-prob {which} statistic {value:.3g} > threshold {limit:g} in "
                                   f"{self._strikes[w]} consecutive steps")
            elif value > AT_ONCE * limit:
                self.flagged[w] = (f"sampler log-prob {which} statistic {value:.3g} > {AT_ONCE:g} x threshold "
                                   f"{limit:g}")
            else:
                continue
            out.append(w)
        return out

    def _informative(self, *stats: WorkerStat | None) -> bool:
        """Whether a step under the thresholds clears a worker's strikes: only when var was defined for it (or
        is not checked). Its records may all be nearly deterministic (log pi varying < MIN_LP_VAR), where any
        claim is nearly right: such a step says nothing either way, like a step without its records."""
        return not self.var_threshold or any(st is not None and math.isfinite(st.var) for st in stats)
