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
    var = Var_t(d_t) / Var_t(log pi_old(y_t))                          (pooled over its tokens)

`gap` catches claims that are off by a lot (another model's log-probs); its allowance grows linearly with
the lag. `var` catches claims that do not track pi_old token by token: the fraction of the variance of
log pi_old the claims leave unexplained. An honest sampler explains most of it (SmolLM2: <= 0.002 at
lag 0, 0.02-0.24 per group at lags 1-3, but one real worker-step at lag <= 2 read 0.88: the check is off by
default, learner.lie_var_threshold = 0); a worker that does not run the policy cannot: constant claims leave exactly 1,
another model's log-probs about 1 or more. It has no lag allowance (the honest value measured does not grow
past lag 1, and an allowance would let a liar hide by labelling its records with an older version it
installed). It is undefined (NaN, never over) below MIN_TOKENS tokens or when log pi_old hardly varies
(a nearly deterministic response, where any claim is nearly right).

A worker is over in a step when gap > `gap_threshold` or var > `var_threshold` (0 turns that check off). The
learner's step screens every unit (rows sharing a prompt) with `Screen` before its gradient is taken: the
rows of a worker over the thresholds there are withheld from the update (they never train). `SamplerAudit`
flags a worker over in `patience` (2) consecutive learner steps in which it contributed records (a step
without its records neither counts nor resets), or at once when a statistic exceeds AT_ONCE (4) times its
threshold (honest SmolLM2 workers stayed under a quarter of the thresholds; another model's log-probs give a
gap of ~5 against 0.5). A liar that out-produces the learner may reach few batches: the second strike could
come late, though none of its rows trains meanwhile. docs/security.md has the measured honest values and margins.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass

from echo2sdk.core import checks
from echo2sdk.core.records import Trajectory
from echo2sdk.errors import ConfigError

__all__ = ["AT_ONCE", "TokenSums", "BatchWithheld", "WorkerStat", "worker_stats", "audit_items", "Screen", "SamplerAudit", "PATIENCE",
           "MIN_TOKENS", "MIN_LP_VAR"]

PATIENCE = 2  # consecutive learner steps over a threshold before a worker is flagged
AT_ONCE = 4.0  # a statistic this many times its threshold flags the worker in one step
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
    """Per worker from its records' (worker, Delta, sums); records without a token are skipped."""
    per: dict[str, list[tuple[int, TokenSums]]] = {}
    for w, lag, s in items:
        if s.n > 0:
            per.setdefault(w, []).append((max(lag, 0), s))
    out = {}
    for w, recs in per.items():
        gap = math.fsum(s.gap / (1 + lag) for lag, s in recs) / len(recs)
        out[w] = WorkerStat(gap, sum((s for _, s in recs), TokenSums()).unexplained)
    return out


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

    def withhold(self, rows: Sequence[tuple[str, int, TokenSums]]) -> list[bool]:
        """`rows`: (worker, version, sums) of one unit's rows; True for the rows of a worker over a threshold."""
        stats = worker_stats((w, self.v_t - v, s) for w, v, s in rows)
        over = {w for w, st in stats.items() if st.over(self.gap_threshold, self.var_threshold)}
        return [w in over for w, _, _ in rows]


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
        self.flagged: dict[str, str] = {}
        self._strikes: dict[str, int] = {}

    def screen(self, v_t: int) -> Screen:
        return Screen(v_t, self.gap_threshold, self.var_threshold)

    def observe(self, items: Iterable[tuple[str, int, TokenSums]]) -> list[str]:
        """Take one learner step's (worker, Delta, sums) per record (audit_items)."""
        stats = worker_stats(items)
        self.history.append(stats)
        out = []
        for w, st in stats.items():
            which = st.over(self.gap_threshold, self.var_threshold)
            self._strikes[w] = self._strikes.get(w, 0) + 1 if which else 0
            if not which or w in self.flagged:
                continue
            value, limit = (st.gap, self.gap_threshold) if which == "gap" else (st.var, self.var_threshold)
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
