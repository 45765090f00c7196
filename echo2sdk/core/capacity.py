"""Capacity rule and staleness bounds (paper §3.3, §4.1, §4.2 and Appendix B).

Pure functions over the measurable quantities, named as in the paper:

- ``S``        staleness budget: the learner consumes rollouts at most S versions old
- ``kappa``    publication period: a snapshot every kappa learner steps (default kappa = S - 1)
- ``T_train``  seconds per learner step
- ``T_bcast``  seconds from publication until the snapshot is installed on a fraction 1/gamma of workers
- ``R``        trajectories consumed per learner step
- ``mu_pool``  summed effective throughput of the active workers, sum_{i in A} mu_i (rollouts/s)
- ``B0, Bw``   learner uplink and per-worker link bandwidth (same unit)
- ``f``        filter rate: the share of GRPO groups with zero reward variance, which dynamic sampling drops
               (beyond the paper: only (1 - f) of the rollouts are useful, so the pool is sized on mu_pool * (1 - f))

Inputs that are NaN, infinite or out of range raise :class:`~echo2sdk.errors.CapacityError` naming the
value; nothing here imports numpy or torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from echo2sdk.core import checks
from echo2sdk.errors import CapacityError

__all__ = [
    "quantity",
    "bubble_ratio",
    "kappa_for",
    "publication_period",
    "mu_min",
    "overlap_ok",
    "delta_max_conservative",
    "delta_max_tightened",
    "num_chains",
    "mu_target",
    "t_bcast_quantile",
    "filter_rate",
    "value_filter_rate",
    "prompt_concentration",
    "value_concentration",
    "useful_rate",
    "raw_rate",
]

# Relative tolerance for rounding: a ratio that should be an integer but comes out as 2.0000000001
# (or 1.9999999999) after floating-point arithmetic rounds as if it were exactly 2.
_EPS = 1e-9


def _ceil(x: float) -> int:
    """ceil(x), treating values within a relative _EPS above an integer as that integer."""
    return math.ceil(x - _EPS * max(1.0, abs(x)))


def _floor(x: float) -> int:
    """floor(x), treating values within a relative _EPS below an integer as that integer."""
    return math.floor(x + _EPS * max(1.0, abs(x)))


def quantity(name: str, value: object, *, allow_zero: bool = False) -> float:
    """`value` as a finite float > 0 (or >= 0 with allow_zero); CapacityError naming it otherwise. The check
    every number of the capacity rule, the provisioning and the scheduler goes through."""
    return checks.real(name, value, lo=0, open_lo=not allow_zero, error=CapacityError)


def _kappa(kappa: object) -> int:
    return checks.integer("kappa", kappa, lo=1, error=CapacityError)


def kappa_for(S: int) -> int:
    """Default publication period kappa = S - 1 (paper §4.1: "kappa <= S - 1 ... S >= 2").

    Raises CapacityError when S is not an integer >= 2.
    """
    S = checks.integer("S", S, error=CapacityError)
    if S < 2:
        raise CapacityError(f"staleness S must be >= 2 so that kappa = S - 1 >= 1, got S={S}")
    return S - 1


def publication_period(S: int, kappa: int | None = None) -> int:
    """kappa for staleness S: the default S - 1 (:func:`kappa_for`) when `kappa` is None, else `kappa`
    checked against paper §4.1's bound 1 <= kappa <= S - 1. CapacityError naming the value otherwise."""
    default = kappa_for(S)
    if kappa is None:
        return default
    if not 1 <= checks.integer("kappa", kappa, error=CapacityError) <= default:
        raise CapacityError(f"kappa must be an integer in [1, S - 1 = {default}] (paper section 4.1), got kappa={kappa!r}")
    return kappa


def mu_min(T_train: float, T_bcast: float, R: float, kappa: int) -> float:
    """Minimum pooled throughput that keeps the learner busy (paper §3.3, eq. (1) solved for mu_pool):

        mu_min(kappa) = kappa * R / (kappa * T_train - T_bcast)

    Raises CapacityError when an input is non-finite or non-positive (T_bcast may be 0), and when
    kappa * T_train <= T_bcast: then no finite pool can hide the broadcast.
    """
    T_train = quantity("T_train", T_train)
    T_bcast = quantity("T_bcast", T_bcast, allow_zero=True)
    R = quantity("R", R)
    kappa = _kappa(kappa)
    slack = kappa * T_train - T_bcast  # time per publication period left for rollout generation
    if slack <= 0:
        raise CapacityError(
            f"infeasible: kappa*T_train = {kappa}*{T_train:g} = {kappa * T_train:g} s <= T_bcast = {T_bcast:g} s, "
            "so no worker pool can keep the learner busy; increase S (kappa) or reduce T_bcast"
        )
    return kappa * R / slack


def overlap_ok(T_train: float, T_bcast: float, R: float, kappa: int, mu_pool: float) -> bool:
    """Overlap condition, paper §3.3 eq. (1):

        kappa * T_train >= T_bcast + kappa * R / mu_pool

    True when the pool generates a period's R*kappa trajectories while the next snapshot is
    broadcast and trained on. An empty or idle pool (mu_pool <= 0) never satisfies it. Equality is
    judged with a relative tolerance, so ``overlap_ok(..., mu_min(...))`` is True.
    """
    T_train = quantity("T_train", T_train)
    T_bcast = quantity("T_bcast", T_bcast, allow_zero=True)
    R = quantity("R", R)
    kappa = _kappa(kappa)
    if checks.real("mu_pool", mu_pool, error=CapacityError) <= 0:
        return False
    lhs = kappa * T_train
    rhs = T_bcast + kappa * R / mu_pool
    return lhs >= rhs - _EPS * max(1.0, abs(lhs), abs(rhs))


def delta_max_conservative(T_train: float, T_bcast: float, R: float, kappa: int, mu_pool: float) -> int:
    """Worst-case staleness bound, paper §3.3 "Linking (S, kappa)" / Appendix B.2 eq. (7):

        Delta_max^cons = kappa + ceil((T_bcast + R / mu_pool) / T_train) - 1
    """
    T_train = quantity("T_train", T_train)
    T_bcast = quantity("T_bcast", T_bcast, allow_zero=True)
    R = quantity("R", R)
    kappa = _kappa(kappa)
    mu_pool = quantity("mu_pool", mu_pool)
    return kappa + _ceil((T_bcast + R / mu_pool) / T_train) - 1


def delta_max_tightened(T_train: float, T_bcast: float, kappa: int) -> int:
    """Staleness bound under the overlap condition, paper Appendix B.3:

        Delta_max <= kappa + ceil((1 - 1/kappa) * T_bcast / T_train)

    Valid when eq. (1) holds; it no longer depends on mu_pool.
    """
    T_train = quantity("T_train", T_train)
    T_bcast = quantity("T_bcast", T_bcast, allow_zero=True)
    kappa = _kappa(kappa)
    return kappa + _ceil((1.0 - 1.0 / kappa) * T_bcast / T_train)


def num_chains(B0: float, Bw: float) -> int:
    """Number of parallel forwarding chains, paper §4.2: N_ch = floor(B0 / Bw).

    Raises CapacityError when a bandwidth is non-positive or non-finite, or when B0 < Bw (the
    learner uplink cannot feed even one chain at line rate).
    """
    B0 = quantity("B0", B0)
    Bw = quantity("Bw", Bw)
    n = _floor(B0 / Bw)
    if n < 1:
        raise CapacityError(
            f"learner uplink B0={B0:g} is below the per-worker link Bw={Bw:g}: not even one chain "
            "runs at line rate; raise B0 or lower Bw"
        )
    return n


def mu_target(mu_min: float, gamma: float = 1.1) -> float:
    """Provisioning target, paper §3.4 / §4.3: mu_target = gamma * mu_min (safety factor gamma = 1.1).

    Raises CapacityError when mu_min is not finite and > 0, or gamma is not finite and >= 1.
    """
    mu_min = quantity("mu_min", mu_min)
    gamma = quantity("gamma", gamma)
    if gamma < 1.0:
        raise CapacityError(f"safety factor gamma must be >= 1 (gamma < 1 under-provisions), got gamma={gamma!r}")
    return gamma * mu_min


def t_bcast_quantile(delays: Iterable[float], n_workers: int, q: float) -> float | None:
    """T_bcast (paper §3.3, §5.5.1): seconds from publication until the snapshot is installed on a
    fraction q (= 1/gamma) of the n_workers active at publication, i.e. the ceil(q * n_workers)-th
    smallest install delay. None while fewer workers than that have installed it; 0.0 for no workers.
    """
    q = checks.real("q", q, lo=0, hi=1, open_lo=True, error=CapacityError)
    checks.integer("n_workers", n_workers, lo=0, error=CapacityError)
    if n_workers == 0:
        return 0.0
    need = max(1, _ceil(n_workers * q))
    ordered = sorted(delays)
    return ordered[need - 1] if len(ordered) >= need else None


def filter_rate(p: float, G: int, nu: float | None = None) -> float:
    """Predicted filter rate of binary rewards: a group of G samples of one prompt has zero reward variance when all
    succeed or all fail. If every prompt is solved with the same probability p,

        f = p^G + (1 - p)^G

    (0.66 at p = 0.10 and 0.85 at p = 0.96 with G = 4; 1 for G = 1). Prompts are rarely alike: some are always
    solved, some never, and that filters more groups at the same mean accuracy. With the prompts' success
    probabilities spread as Beta(a, b), a = p * nu, b = (1 - p) * nu (nu, their concentration: see
    prompt_concentration), the group's number of successes is beta-binomial and

        f = prod_{i<G} (a + i) / (nu + i) + prod_{i<G} (b + i) / (nu + i)

    (p = 0.3, G = 4: 0.25 alike, 0.43 at nu = 3, 0.82 at nu = 0.3). nu=None: alike (the limit nu -> infinity).
    The two-valued case of value_filter_rate. CapacityError unless p in [0, 1], G >= 1 and nu > 0."""
    p = checks.real("p", p, lo=0, hi=1, error=CapacityError)
    return value_filter_rate((p, 1 - p), G, nu)


def value_filter_rate(shares: Sequence[float], G: int, nu: float | None = None) -> float:
    """Predicted filter rate of a reward that takes a few values (math: 0 unformatted, 0.1 boxed but wrong, 1.1
    right): `shares` q_v, the share of the rollouts that get each value (summing to 1). A group of G is filtered
    when all its rewards are equal. Alike prompts: f = sum_v q_v^G. Prompts whose own shares spread as a Dirichlet
    of mean q and concentration nu (value_concentration):

        f = sum_v prod_{i<G} (nu q_v + i) / (nu + i)

    With two values, filter_rate's beta-binomial. CapacityError unless every share is in [0, 1] and they sum to 1
    (within 1e-6), G >= 1 and nu > 0."""
    G = checks.integer("G", G, lo=1, error=CapacityError)
    q = [checks.real(f"shares[{i}]", v, lo=0, hi=1, error=CapacityError) for i, v in enumerate(shares)]
    if abs(sum(q) - 1) > 1e-6:
        raise CapacityError(f"shares must sum to 1, got {sum(q)!r} ({list(shares)!r})")
    if nu is None:
        return sum(v**G for v in q)
    nu = quantity("nu", nu)
    return sum(math.prod((nu * v + i) / (nu + i) for i in range(G)) for v in q)


#: prompt_concentration's smallest nu: every prompt all but always or never solved (f = 0.9992 at p = 0.3, G = 4)
NU_FLOOR = 1e-3


def prompt_concentration(m: int, G: int, correct: int, pairs: int) -> float | None:
    """nu, how alike a task's prompts are, from m groups of G binary samples (one prompt each) whose correct counts
    k sum to `correct` and whose k (k - 1) sum to `pairs`: value_concentration of the two values, right (k of a
    group) and wrong (G - k, whose (G - k)(G - k - 1) is G (G - 1) - 2 k (G - 1) + k (k - 1)). It is the Beta's
    moment estimate, nu = (mu - mu^2) / (E[p^2] - mu^2) - 1 (the prompts' success rates p_j spread with mean mu
    and variance mu (1 - mu) / (nu + 1)); see value_concentration for the estimators and the Nones."""
    m = checks.integer("m", m, lo=0, error=CapacityError)
    G = checks.integer("G", G, lo=1, error=CapacityError)
    correct = checks.integer("correct", correct, lo=0, hi=m * G, error=CapacityError)
    pairs = checks.integer("pairs", pairs, lo=0, hi=correct * (G - 1), error=CapacityError)
    wrong_pairs = m * G * (G - 1) - 2 * correct * (G - 1) + pairs
    if wrong_pairs < 0:
        raise CapacityError(f"pairs = {pairs} is too few for correct = {correct} in m = {m} groups of G = {G}")
    return value_concentration(m, G, (correct, m * G - correct), (pairs, wrong_pairs))


def value_concentration(m: int, G: int, counts: Sequence[int], pairs: Sequence[int]) -> float | None:
    """nu, how alike a task's prompts are, from m groups of G rewards (one prompt each) that take a few values:
    counts[v], the rewards with value v over all groups, and pairs[v], the sum over groups of n_v (n_v - 1) (n_v:
    the group's rewards with value v). A prompt's shares of the values spread as a Dirichlet of mean q and
    concentration nu, so a group's E[n_v (n_v - 1)] / (G (G - 1)) is E[q_v^2] = q_v^2 + q_v (1 - q_v) / (nu + 1);
    summed over the values, P = Q + (1 - Q) / (nu + 1), Q = sum_v q_v^2, and

        nu = (1 - Q) / (P - Q) - 1.

    Each moment is estimated without bias: P by sum pairs / (m G (G - 1)), and q_v^2 by q_hat_v^2 less the
    variance of q_hat_v (the sample variance of the groups' n_v / G, over m; sum n_v^2 = pairs + counts), without
    which a few groups would make the prompts look alike. None where there is nothing to tell (m < 2, G < 2, one
    value only) or the prompts look alike (no spread left); a spread at or past the widest a Dirichlet allows (each
    prompt always gets one value) gives nu = NU_FLOOR."""
    m = checks.integer("m", m, lo=0, error=CapacityError)
    G = checks.integer("G", G, lo=1, error=CapacityError)
    if len(counts) != len(pairs):
        raise CapacityError(f"counts and pairs must have one entry per value, got {len(counts)} and {len(pairs)}")
    n = [checks.integer(f"counts[{i}]", c, lo=0, hi=m * G, error=CapacityError) for i, c in enumerate(counts)]
    pp = [checks.integer(f"pairs[{i}]", x, lo=0, hi=c * (G - 1), error=CapacityError)
          for i, (c, x) in enumerate(zip(n, pairs))]
    if sum(n) != m * G:
        raise CapacityError(f"counts must sum to m * G = {m * G}, got {sum(n)}")
    if m < 2 or G < 2 or max(n, default=0) == m * G:
        return None
    P = sum(pp) / (m * G * (G - 1))
    Q = 0.0
    for c, x in zip(n, pp):
        q = c / (m * G)
        s2 = ((x + c) / G**2 - m * q * q) / (m - 1)  # sample variance of the groups' n_v / G
        Q += q * q - s2 / m
    spread = P - Q
    if spread <= 1e-12:
        return None
    return max((1 - Q) / spread - 1, NU_FLOOR)


def _f(f: object) -> float:
    f = checks.real("f", f, lo=0, error=CapacityError)
    if f >= 1:
        raise CapacityError(f"filter rate f must be < 1 (every group filtered: no rollout is useful), got f={f!r}")
    return f


def useful_rate(mu_pool: float, f: float) -> float:
    """Useful rollouts per second of a pool generating mu_pool: mu_pool * (1 - f), the groups that pass the
    zero-variance filter. The capacity rule holds in useful rollouts: useful_rate(mu_pool, f) >= mu_min."""
    return quantity("mu_pool", mu_pool, allow_zero=True) * (1 - _f(f))


def raw_rate(mu_useful: float, f: float) -> float:
    """The raw throughput that yields mu_useful useful rollouts per second at filter rate f: mu_useful / (1 - f)
    (the pool to provision for mu_min useful rollouts is raw_rate(mu_min, f); CapacityError for f >= 1)."""
    return quantity("mu_useful", mu_useful, allow_zero=True) / (1 - _f(f))


def bubble_ratio(T_idle: float, T_train: float) -> float:
    """The learner's bubble (paper §5): T_idle / (T_idle + T_train,active), the share of its time the learner
    waited for admissible data; 0.0 before anything was measured. The runtime's summary and status page and the
    simulator all report this one."""
    total = T_idle + T_train
    return T_idle / total if total > 0 else 0.0
