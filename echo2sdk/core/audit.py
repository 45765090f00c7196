"""Worker audit (beyond the paper): catch a rollout worker whose records lie about how they were generated.

A record claims two things the learner can check:

- the sampler's per-token log-probs (``Meta.logprobs``, pi_sampler). The learner computes log pi_old of every
  response token anyway, for the importance weight w_t = min(pi_old / pi_sampler, C); the learner step
  returns, per record, the gap

      g = mean over the record's loss tokens of |log pi_old(y_t) - log pi_sampler(y_t)|

  An honest record differs from pi_old only by the snapshot's rounding (bf16), the sampler's kernels and the
  policy's drift over the record's lag Delta = v_t - v. Records replayed from a log (``Meta.off_policy``)
  carry placeholder log-probs and are left out.
- the version v: it must be one the worker reported installed (checked by the coordinator on intake).

Per worker and learner step the statistic is the mean over its records of ``g / (1 + Delta)``. The absolute
value keeps over- and under-stated log-probs from cancelling (a signed mean of log(pi_old / pi_sampler) is
-KL <= 0 for an honest sampler, and a liar mixing both signs can hold it at 0); the token mean makes long and
short responses count alike; dividing by 1 + Delta grants a lagged record an allowance that grows linearly
with its lag; the mean over records dilutes one odd honest record over the worker's group(s). A worker is
flagged when the statistic exceeds `threshold` in `patience` (2) consecutive learner steps in which it
contributed records; a step without its records neither counts nor resets. docs/security.md has the
measured honest values and the threshold's margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from echo2sdk.core import checks
from echo2sdk.core.records import Trajectory
from echo2sdk.errors import ConfigError

__all__ = ["worker_gaps", "SamplerAudit", "PATIENCE"]

PATIENCE = 2  # consecutive learner steps past the threshold before a worker is flagged


def worker_gaps(records: Sequence[Trajectory], gaps: Sequence[float], v_t: int) -> dict[str, float]:
    """The statistic per worker: mean over its on-policy records of g / (1 + Delta), Delta = v_t - v.
    `gaps`: the learner step's per-record g (StepStats.sampler_gap), in the order of `records`; NaN entries
    (off-policy, or no loss token) are skipped."""
    if len(gaps) != len(records):
        raise ValueError(f"{len(gaps)} gaps for {len(records)} records")
    per: dict[str, list[float]] = {}
    for t, g in zip(records, gaps):
        if t.meta.off_policy or not math.isfinite(g):
            continue
        per.setdefault(t.meta.worker, []).append(g / (1 + max(v_t - t.version, 0)))
    return {w: math.fsum(v) / len(v) for w, v in per.items()}


class SamplerAudit:
    """Flags workers whose statistic stays above `threshold` for `patience` consecutive steps they took part in.

    `observe` returns the workers flagged by this step (each one once); `history` keeps every step's
    statistics (for the run's metrics and the benchmark), `flagged` worker -> the reason."""

    def __init__(self, threshold: float, patience: int = PATIENCE):
        checks.real("threshold", threshold, lo=0, open_lo=True, error=ConfigError)
        checks.integer("patience", patience, lo=1, error=ConfigError)
        self.threshold, self.patience = threshold, patience
        self.history: list[dict[str, float]] = []
        self.flagged: dict[str, str] = {}
        self._strikes: dict[str, int] = {}

    def observe(self, records: Sequence[Trajectory], gaps: Sequence[float], v_t: int) -> list[str]:
        """Take one learner step's records (sampled at learner version `v_t`) and their gaps."""
        stats = worker_gaps(records, gaps, v_t)
        self.history.append(stats)
        out = []
        for w, g in stats.items():
            self._strikes[w] = self._strikes.get(w, 0) + 1 if g > self.threshold else 0
            if self._strikes[w] >= self.patience and w not in self.flagged:
                self.flagged[w] = (f"sampler log-prob gap {g:.3g} > threshold {self.threshold:g} in "
                                   f"{self._strikes[w]} consecutive steps")
                out.append(w)
        return out
