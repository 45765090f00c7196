"""The inputs of a simulated deployment: the pool's machines and the run's configuration."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from echo2sdk.core import capacity, checks
from echo2sdk.core.provisioning import SOLVERS, Solver, WorkerOffer
from echo2sdk.errors import ConfigError
from echo2sdk.sim.faults import Fault
from echo2sdk.sim.network import GB, Network, _pos

__all__ = ["SimWorker", "SimConfig"]


@dataclass(frozen=True)
class SimWorker:
    """A machine in the pool: price c_i ($/h), mean throughput mu_i (rollouts/s), link Bw_i (Mbit/s,
    both directions), the coefficient of variation of its request durations and its machine type
    (`kind`, default its name: the scheduler's launch back-off and lead times are per kind)."""

    name: str
    price_per_hour: float
    mu: float
    link_mbps: float = 100.0
    cv: float = 0.15
    kind: str | None = None

    def __post_init__(self) -> None:
        WorkerOffer(self.name, self.price_per_hour, self.mu)  # validates name, price, mu
        _pos(f"link_mbps of worker {self.name!r}", self.link_mbps)
        _pos(f"cv of worker {self.name!r}", self.cv, zero=True)
        if self.kind is not None and (not isinstance(self.kind, str) or not self.kind):
            raise ConfigError(f"kind of worker {self.name!r} must be a non-empty string, got kind={self.kind!r}")

    @property
    def offer(self) -> WorkerOffer:
        return WorkerOffer(self.name, self.price_per_hour, self.mu)


@dataclass
class SimConfig:
    """One simulated deployment. Times in seconds, bandwidths in Mbit/s, prices in $/h."""

    pool: list[SimWorker]
    T_train: float
    R: int
    group_size: int = 16
    S: int = 3
    kappa: int | None = None
    steps: int = 100
    net: Network = field(default_factory=lambda: Network(snapshot_bytes=1 * GB))
    gamma: float = 1.1
    learner_price_per_hour: float = 0.0
    T_train_cv: float = 0.02
    groups_per_request: int = 1
    rollout_during_bcast: Literal["pause", "overlap"] = "pause"
    activation: Literal["rho", "random", "all"] = "rho"  # "all": every pool worker active, no scheduler
    solver: Solver = "exact"  # initial selection for activation="rho": "exact" (min-cost cover) or "greedy" (§3.4)
    closed_loop: bool = True
    active: list[str] | None = None  # explicit initial active set (overrides activation's choice)
    heartbeat_s: float = 30.0
    window_s: float = 600.0
    sustain_s: float = 60.0
    release_margin: float = 0.25
    fail_after_s: float = 90.0
    boot_s: float = 60.0
    # Launch latency of a machine that is off (started, or replacing a dead one): None = boot_s; a number;
    # (lo, hi) uniform; (lo, mode, hi) triangular. Then the snapshot fetch from storage and install_s.
    launch_s: float | tuple[float, float] | tuple[float, float, float] | None = None
    preempt_per_hour: float = 0.0  # Poisson preemptions per active machine-hour (spot); a preempted machine dies
    anticipate: bool = False  # the scheduler's early activation (Scheduler(anticipate=...)); off: the paper's loop
    lead_prior_s: float | None = None  # the scheduler's prior lead time L; None: mean launch + fetch + install
    storage_mbps: float = 1000.0
    relay_timeout_s: float = 30.0
    faults: tuple[Fault, ...] = ()
    seed: int = 0
    record_timeline: bool = False
    max_time_s: float = math.inf  # stop when the virtual clock passes this (default: 50 * steps * T_train)
    # dynamic sampling: without prompt skipping, each GRPO group has zero reward variance (and is dropped) with
    # probability f (f_before); with it, each generated group with probability filter_rate_after
    filter_rate: float = 0.0
    # the pool is sized on "useful" rollouts (R / (1 - f_after) raw ones a step) or on "raw" ones (the paper's R)
    provision_for: Literal["useful", "raw"] = "useful"
    # the learner's pre-rollout prompt filter: a share s of the drawn prompts is skipped, never generated (free), and
    # each skipped prompt would have been zero-variance with probability skip_precision p (1.0: all of them, the most
    # skipping can save; a measured precision lowers it). The generated groups' filter rate becomes f_after
    skip_rate: float = 0.0
    skip_precision: float = 1.0

    def __post_init__(self) -> None:
        if not self.pool:
            raise ConfigError("pool must hold at least one worker, got pool=[]")
        names = [w.name for w in self.pool]
        if len(set(names)) != len(names):
            raise ConfigError(f"worker names in pool must be distinct, got {names}")
        _pos("T_train", self.T_train)
        for name in ("R", "group_size", "steps", "groups_per_request"):
            checks.integer(name, getattr(self, name), lo=1)
        if self.R % self.group_size:
            raise ConfigError(f"R={self.R} must be a multiple of group_size={self.group_size}")
        capacity.publication_period(self.S, self.kappa)
        if self.rollout_during_bcast not in ("pause", "overlap"):
            raise ConfigError(f"rollout_during_bcast must be 'pause' or 'overlap', got {self.rollout_during_bcast!r}")
        if self.activation not in ("rho", "random", "all"):
            raise ConfigError(f"activation must be 'rho', 'random' or 'all', got {self.activation!r}")
        if self.solver not in SOLVERS:
            raise ConfigError(f"solver must be 'exact' or 'greedy', got solver={self.solver!r}")
        for name in ("heartbeat_s", "window_s", "fail_after_s", "storage_mbps", "relay_timeout_s"):
            _pos(name, getattr(self, name))
        for name in ("T_train_cv", "sustain_s", "release_margin", "boot_s", "learner_price_per_hour"):
            _pos(name, getattr(self, name), zero=True)
        self._check_launch()
        _pos("preempt_per_hour", self.preempt_per_hour, zero=True)
        if self.lead_prior_s is not None:
            _pos("lead_prior_s", self.lead_prior_s, zero=True)
        if self.active is not None and (unknown := set(self.active) - set(names)):
            raise ConfigError(f"active names workers not in the pool: {sorted(unknown)}")
        if self.max_time_s == math.inf:
            self.max_time_s = 50.0 * self.steps * self.T_train
        if not (isinstance(self.filter_rate, int | float) and 0 <= self.filter_rate < 1):
            raise ConfigError(f"filter_rate must be a number in [0, 1), got filter_rate={self.filter_rate!r}")
        if self.provision_for not in ("useful", "raw"):
            raise ConfigError(f"provision_for must be 'useful' or 'raw', got provision_for={self.provision_for!r}")
        if not (checks.is_real(self.skip_rate) and 0 <= self.skip_rate < 1):
            raise ConfigError(f"skip_rate must be a number in [0, 1) (the share of drawn prompts skipped before "
                              f"generation), got skip_rate={self.skip_rate!r}")
        checks.real("skip_precision", self.skip_precision, lo=0, hi=1)
        if self.skip_rate and self._after() >= 1:
            raise ConfigError(
                f"skip_rate={self.skip_rate!r} with skip_precision={self.skip_precision!r} leaves no useful group: "
                f"filter_rate={self.filter_rate!r} can be at most {1 - self.skip_rate * (1 - self.skip_precision):g} "
                f"(every generated group zero-variance); lower skip_rate or raise skip_precision")

    @property
    def k(self) -> int:
        return capacity.publication_period(self.S, self.kappa)

    def _after(self) -> float:
        s, p = self.skip_rate, self.skip_precision
        return min(1.0, max(0.0, (self.filter_rate - s * p) / (1 - s)))

    @property
    def filter_rate_after(self) -> float:
        """f_after, the share of the generated groups that are zero-variance once a share s of the prompts is
        skipped: f_after = (f_before - s p) / (1 - s), clamped to [0, 1) (s p > f_before, more zero-variance prompts
        skipped than there were, gives 0). filter_rate itself when skip_rate is 0."""
        return self._after() if self.skip_rate else self.filter_rate

    @property
    def R_provision(self) -> float:
        """The rollouts a step the pool is sized for: R / (1 - f_after) generated to yield R useful ones
        (provision_for="useful"), or R (the paper's rule, blind to filtering)."""
        return capacity.raw_rate(self.R, self.filter_rate_after) if self.provision_for == "useful" else float(self.R)

    def _check_launch(self) -> None:
        v = self.launch_s
        if v is None or isinstance(v, int | float):
            _pos("launch_s", self.boot_s if v is None else v, zero=True)
            return
        if not isinstance(v, tuple | list) or len(v) not in (2, 3):
            raise ConfigError(f"launch_s must be seconds, (lo, hi) or (lo, mode, hi), got launch_s={v!r}")
        for x in v:
            _pos("launch_s", x, zero=True)
        if list(v) != sorted(v):
            raise ConfigError(f"launch_s must be ordered lo <= (mode <=) hi, got launch_s={tuple(v)!r}")

    @property
    def launch_range(self) -> tuple[float, float, float]:
        """(shortest, mean, longest) launch latency in seconds."""
        v = self.boot_s if self.launch_s is None else self.launch_s
        if isinstance(v, int | float):
            return float(v), float(v), float(v)
        if len(v) == 2:
            return float(v[0]), (v[0] + v[1]) / 2, float(v[1])
        return float(v[0]), (v[0] + v[1] + v[2]) / 3, float(v[2])

    def draw_launch(self, rng: random.Random) -> float:
        """One launch latency in seconds."""
        v = self.boot_s if self.launch_s is None else self.launch_s
        if isinstance(v, int | float):
            return float(v)
        if len(v) == 2:
            return rng.uniform(v[0], v[1])
        return rng.triangular(v[0], v[2], v[1])
