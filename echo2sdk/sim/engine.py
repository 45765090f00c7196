"""Discrete-event simulator of an ECHO-2 deployment at paper scale, on a virtual clock.

It drives the real components, never a copy of their logic:

- :class:`~echo2sdk.core.buffer.StalenessBuffer` admits, evicts and samples every simulated GRPO group
  (admission window v >= v_t - S, FIFO order, the same counters as a real run);
- :class:`~echo2sdk.core.scheduler.Scheduler` sees heartbeats (cumulative delivered rollouts per
  worker), decides activations, releases and failure replacements;
- :func:`~echo2sdk.core.broadcast.planner.plan_chains` and
  :class:`~echo2sdk.core.broadcast.planner.WorkerScores` build the forwarding chains of every
  publication from relay scores, and ``ChainPlan.upstream`` re-attaches the tail of a dead relay.

What is modelled (and what is not) is listed in ``docs/simulation.md``. In short:

- the learner takes R admissible trajectories (R / n complete groups) and trains for ``T_train``
  (log-normal jitter); it publishes every kappa steps;
- worker i generates one request of ``groups_per_request`` groups at a time; a request takes
  ``groups_per_request * n / mu_i`` seconds on average (gamma-distributed with ``cv``), under the
  version installed when it started;
- dissemination is flow-level over capped links: the learner uplink ``B0`` is shared max-min fairly,
  a worker's link ``Bw_i`` caps what it receives and forwards; chains are chunked store-and-forward
  pipelines, so the last chunk reaches depth d after ``sum_j s_j + (K - 1) * max_j s_j`` (s_j: one
  chunk's time on hop j); a star pushes the snapshot to every worker at once;
- ``rollout_during_bcast="pause"`` is the paper's execution semantics (Appendix B.1, Algorithm 1): a
  worker finishes its running request and generates nothing more until its own install of the newly
  published snapshot completes. ``"overlap"`` is what ``echo2sdk.runtime.worker`` does: it keeps
  generating under the old version while chunks arrive;
- faults: a worker's rollout rate or relay link slowed by a factor, or the worker dropped; a dead relay
  stalls its tail until ``relay_timeout_s``, then the tail is re-attached to the nearest healthy
  ancestor and resumes from the chunks it holds; a replacement boots for ``boot_s`` and fetches the
  current snapshot from storage at ``storage_mbps``.

Nothing here imports numpy or torch; a 76-worker, 100-step run takes seconds.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from echo2sdk.core import capacity, checks
from echo2sdk.core.broadcast.planner import SOURCE, ChainPlan, WorkerScores
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.records import Meta, Trajectory
from echo2sdk.core.provisioning import SOLVERS, Solver, WorkerOffer
from echo2sdk.core.provisioning import provision as core_provision
from echo2sdk.core.scheduler import Scheduler
from echo2sdk.errors import CapacityError, ConfigError, TrajectoryRejected
from echo2sdk.sim.network import GB, MBIT, Network, _fanout, _pos, install_times, t_bcast_quantile

__all__ = ["SimWorker", "Fault", "SimConfig", "SimResult", "Simulation", "simulate", "provision"]


def provision(
    offers: Sequence[WorkerOffer],
    *,
    T_train: float,
    R: float,
    kappa: int,
    gamma: float,
    t_bcast: float | None = None,
    net: Network | None = None,
    link_mbps: Mapping[str, float] | None = None,
    order: Literal["rho", "random"] = "rho",
    rng: random.Random | None = None,
    solver: Solver = "exact",
) -> tuple[list[WorkerOffer], float, bool]:
    """:func:`echo2sdk.core.provisioning.provision` with T_bcast measured by the network model: the
    workers reaching gamma * mu_min(kappa) at least cost (by `solver`), or a random set for
    order="random". When `t_bcast` is None it is the install time of q = 1/gamma of the selection
    over `net` (links from `link_mbps`, 100 Mbit/s otherwise). Returns (chosen, T_bcast, feasible)."""
    if t_bcast is None and net is None:
        raise ConfigError("provision needs t_bcast or a network model (net) to measure it")
    links = link_mbps or {}

    def estimate(workers: list[WorkerOffer]) -> float:
        assert net is not None
        names = [o.name for o in workers]
        times, _ = install_times(names, net, {n: links.get(n, 100.0) for n in names})
        return t_bcast_quantile(times, 0.0, 1 / gamma)

    p = core_provision(offers, T_train=T_train, R=R, kappa=kappa, gamma=gamma, t_bcast=t_bcast,
                       estimate_t_bcast=None if t_bcast is not None else estimate, solver=solver, order=order, rng=rng)
    return p.chosen, p.T_bcast, p.feasible


# ==================================================================== simulation inputs


@dataclass(frozen=True)
class SimWorker:
    """A machine in the pool: price c_i ($/h), mean throughput mu_i (rollouts/s), link Bw_i (Mbit/s,
    both directions) and the coefficient of variation of its request durations."""

    name: str
    price_per_hour: float
    mu: float
    link_mbps: float = 100.0
    cv: float = 0.15

    def __post_init__(self) -> None:
        WorkerOffer(self.name, self.price_per_hour, self.mu)  # validates name, price, mu
        _pos(f"link_mbps of worker {self.name!r}", self.link_mbps)
        _pos(f"cv of worker {self.name!r}", self.cv, zero=True)

    @property
    def offer(self) -> WorkerOffer:
        return WorkerOffer(self.name, self.price_per_hour, self.mu)


@dataclass(frozen=True)
class Fault:
    """A fault injected at virtual time `at_s`. `worker` is a worker name or a role picked when the
    fault fires: "forwarder" (the active relay with the longest downstream tail in the current plan)
    or "rollout" (an active worker that forwards to nobody). `kind`: "slow" (rollout rate, or relay
    link for a forwarder, times `factor`) or "drop" (the worker dies)."""

    at_s: float
    worker: str
    kind: Literal["slow", "drop"]
    factor: float = 0.5


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
    storage_mbps: float = 1000.0
    relay_timeout_s: float = 30.0
    faults: tuple[Fault, ...] = ()
    seed: int = 0
    record_timeline: bool = False
    max_time_s: float = math.inf  # stop when the virtual clock passes this (default: 50 * steps * T_train)

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
        if self.active is not None and (unknown := set(self.active) - set(names)):
            raise ConfigError(f"active names workers not in the pool: {sorted(unknown)}")
        if self.max_time_s == math.inf:
            self.max_time_s = 50.0 * self.steps * self.T_train

    @property
    def k(self) -> int:
        return capacity.publication_period(self.S, self.kappa)


@dataclass
class SimResult:
    """What a simulated run measured. Times are virtual seconds."""

    steps: int
    wall_s: float  # virtual time from start to the last step's end
    bubble_ratio: float  # T_idle / (T_idle + T_train,active), the first batch's fill excluded
    bubble_ratio_all: float  # the same with the first fill
    learner_wait_s: float  # mean idle time per step (first fill excluded)
    t_train_s: float  # median step time
    t_bcast_s: float | None  # median over publications of T_bcast to q = 1/gamma of the active workers
    t_bcast_all_s: float | None  # ... to all of them
    T_bcast_calibrated: float
    mu_min: float | None
    mu_target: float | None
    machines_initial: int
    machines_max: int
    machines_mean: float
    cost_total: float
    cost_per_step: float  # everything, the first batch's fill included
    cost_per_step_steady: float  # from the first step on (the paper's steady-state accounting)
    cost_per_hour_workers: float  # time-averaged
    staleness_hist: dict[int, int]  # rollouts consumed at each staleness v_t - v
    staleness_max: int
    buffer: dict[str, Any]  # StalenessBuffer.stats(), counted in GRPO groups
    actions: list[dict[str, Any]]
    publications: list[dict[str, Any]]
    timeline: list[tuple[float, float, float]]  # (t, mu_pool seen by the scheduler, true rate of active workers)
    faults: list[dict[str, Any]]
    initial_active: list[str]
    step_log: list[tuple[float, float]]
    delivered_log: list[tuple[float, int]]
    ready_log: list[tuple[float, str]]
    stuck: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ==================================================================== the simulation


@dataclass
class _W:
    spec: SimWorker
    state: str = "off"  # off | booting | active | released | dead
    installed: int = 0
    busy: bool = False
    epoch: int = 0  # invalidates scheduled events when the worker is released, dies or reboots
    rate_factor: float = 1.0
    link_factor: float = 1.0
    paused_for: int | None = None  # waiting for this version's install (pause semantics)
    delivered: int = 0  # admitted rollouts, reported in heartbeats
    billed_since: float | None = None
    install_token: int = 0
    generated: int = 0  # rollouts generated (admitted or not)
    busy_s: float = 0.0  # seconds spent generating; with `generated`, sent in heartbeats


class Simulation:
    """Runs one :class:`SimConfig`; call :meth:`run` once."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.now = 0.0
        self._q: list[tuple[float, int, str, tuple]] = []
        self._seq = 0
        self.w: dict[str, _W] = {s.name: _W(s) for s in cfg.pool}
        # One buffer record stands for one GRPO group of n rollouts: every rollout of a group shares its
        # version, so admission, eviction and sampling are exactly those of the real buffer, n times cheaper.
        self.buffer = StalenessBuffer(staleness=cfg.S, group_size=1, order="fifo")
        self.scores = WorkerScores()
        self.version = 0
        self.steps_done = 0
        self.learner_busy = False
        self.wait_since: float | None = 0.0
        self.idle = 0.0
        self.first_fill = 0.0
        self.busy_time = 0.0
        self.step_times: list[float] = []
        self.published: dict[int, dict[str, Any]] = {}
        self.latest_published = 0
        self.cost_workers = 0.0
        self.actions: list[dict[str, Any]] = []
        self.timeline: list[tuple[float, float, float]] = []
        self.fault_log: list[dict[str, Any]] = []
        self.machines_seen: list[int] = []
        self._gid = 0
        self.current_plan: ChainPlan | None = None
        self.sched: Scheduler | None = None
        self._done = False
        self.stuck: str | None = None
        self.delivered_log: list[tuple[float, int]] = []  # (time, admitted rollouts)
        self.step_log: list[tuple[float, float]] = []  # (start, end) of every learner step
        self.ready_log: list[tuple[float, str]] = []  # (time, worker) a (re)activated worker starts generating
        self.stalls: dict[str, list[tuple[float, float]]] = {}  # installs delayed by a relay fault
        self.cost_at_first_step = 0.0

    # ---------------------------------------------------------------- helpers

    def _push(self, t: float, kind: str, *data: Any) -> None:
        self._seq += 1
        heapq.heappush(self._q, (t, self._seq, kind, data))

    def _link(self, name: str) -> float:
        """What the worker can receive (Mbit/s)."""
        return self.w[name].spec.link_mbps

    def _up(self, name: str) -> float:
        """What the worker forwards at (Mbit/s): its link, times a relay slow-down factor."""
        w = self.w[name]
        return w.spec.link_mbps * w.link_factor

    def _bill_start(self, w: _W) -> None:
        if w.billed_since is None:
            w.billed_since = self.now

    def _bill_stop(self, w: _W) -> None:
        if w.billed_since is not None:
            self.cost_workers += w.spec.price_per_hour * (self.now - w.billed_since) / 3600
            w.billed_since = None

    def _active(self) -> list[str]:
        return [n for n, w in self.w.items() if w.state == "active"]

    # ---------------------------------------------------------------- set-up (warm-up calibration)

    def _calibrate(self) -> tuple[list[str], float, float]:
        """Like Echo2.warmup(): T_train = median of 5 steps, T_bcast from one publication to the chosen
        pool, then the provisioning decision. Returns (initial active names, T_train, T_bcast)."""
        cfg = self.cfg
        t_train = statistics.median(self._step_time() for _ in range(5))
        links = {s.name: s.link_mbps for s in cfg.pool}
        offers = [s.offer for s in cfg.pool]
        if cfg.active is not None:
            names = list(cfg.active)
        elif cfg.activation == "all":
            names = [s.name for s in cfg.pool]
        else:
            chosen, _, _ = provision(
                offers, T_train=t_train, R=cfg.R, kappa=cfg.k, gamma=cfg.gamma, net=cfg.net,
                link_mbps=links, order=cfg.activation, rng=self.rng, solver=cfg.solver,
            )
            names = [o.name for o in chosen]
        times, _ = install_times(names, cfg.net, links)
        t_bcast = t_bcast_quantile(times, 0.0, 1 / cfg.gamma)
        return names, t_train, t_bcast

    def _step_time(self) -> float:
        cv = self.cfg.T_train_cv
        if cv == 0:
            return self.cfg.T_train
        sigma = math.sqrt(math.log(1 + cv * cv))
        return self.cfg.T_train * math.exp(self.rng.gauss(-sigma * sigma / 2, sigma))

    # ---------------------------------------------------------------- run

    def run(self) -> SimResult:
        cfg = self.cfg
        names, t_train_cal, t_bcast_cal = self._calibrate()
        mu_min = mu_target = None
        if cfg.activation != "all" and cfg.closed_loop:
            self.sched = Scheduler(
                gamma=cfg.gamma, window_s=cfg.window_s, heartbeat_s=cfg.heartbeat_s, sustain_s=cfg.sustain_s,
                release_margin=cfg.release_margin, fail_after_s=cfg.fail_after_s,
                boot_timeout_s=cfg.boot_s + cfg.net.snapshot_bytes * 8 / (cfg.storage_mbps * MBIT) + 10 * cfg.heartbeat_s,
                order=cfg.activation, seed=cfg.seed, solver=cfg.solver,
            )
            for s in cfg.pool:
                self.sched.add_worker(s.name, s.price_per_hour, s.mu, active=s.name in names)
            try:
                mu_target = self.sched.calibrate(T_train=t_train_cal, T_bcast=t_bcast_cal, R=cfg.R, kappa=cfg.k)
                mu_min = self.sched.mu_min
            except CapacityError:
                self.sched = None  # infeasible: run open loop with the chosen pool
        else:
            try:
                mu_min = capacity.mu_min(t_train_cal, t_bcast_cal, cfg.R, cfg.k)
                mu_target = capacity.mu_target(mu_min, cfg.gamma)
            except CapacityError:
                pass
        for n in names:  # the initial policy (version 0) is on every machine at start
            w = self.w[n]
            w.state = "active"
            self._bill_start(w)
            self._start_request(w)
        for f in cfg.faults:
            self._push(f.at_s, "fault", f)
        self._push(cfg.heartbeat_s, "tick")
        self._learner_try()
        while self._q and not self._done:
            t, _, kind, data = heapq.heappop(self._q)
            self.now = t
            getattr(self, "_on_" + kind)(*data)
        for w in self.w.values():
            self._bill_stop(w)
        return self._result(names, t_bcast_cal, mu_min, mu_target)

    # ---------------------------------------------------------------- learner

    def _learner_try(self) -> None:
        if self.learner_busy or self._done:
            return
        k = self.cfg.R // self.cfg.group_size
        if self.buffer.ready_groups() < k:
            if self.wait_since is None:
                self.wait_since = self.now
            return
        if self.wait_since is not None:
            waited = self.now - self.wait_since
            if self.steps_done == 0:
                self.first_fill = waited
                for w in self.w.values():  # settle the bills: steady-state cost counts from here
                    if w.billed_since is not None:
                        self._bill_stop(w)
                        self._bill_start(w)
                self.cost_at_first_step = self.cost_workers + self.cfg.learner_price_per_hour * self.now / 3600
            else:
                self.idle += waited
            self.wait_since = None
        self.buffer.sample(k)
        dt = self._step_time()
        self.learner_busy = True
        self.busy_time += dt
        self.step_times.append(dt)
        self.step_log.append((self.now, self.now + dt))
        self._push(self.now + dt, "learner_done")

    def _on_learner_done(self) -> None:
        self.learner_busy = False
        self.steps_done += 1
        self.version += 1
        self.buffer.set_version(self.version)
        if self.steps_done >= self.cfg.steps:
            self._done = True
            return
        if self.version % self.cfg.k == 0:
            self._publish(self.version)
        self._learner_try()

    # ---------------------------------------------------------------- dissemination

    def _publish(self, v: int) -> None:
        names = [n for n in self._active() if self.w[n].installed < v]
        links = {n: self._link(n) for n in names}
        ups = {n: self._up(n) for n in names}
        times, plan = install_times(
            names, self.cfg.net, links, scores=self.scores, now=self.now, start=self.now, up_mbps=ups
        )
        self.current_plan = plan
        self.latest_published = v
        self.published[v] = {"t0": self.now, "expected": set(names), "installed": {}, "plan": plan, "times": times}
        for n, t in times.items():
            w = self.w[n]
            w.install_token += 1
            self._push(t, "installed", n, v, w.install_token, w.epoch)
            if self.cfg.rollout_during_bcast == "pause":
                w.paused_for = v
        if plan is not None:  # relay statistics for the next plan (paper C.3)
            self._score_relays(plan, ups)

    def _score_relays(self, plan: ChainPlan, links: Mapping[str, float]) -> None:
        fan = _fanout(plan)
        for chain in plan.chains:
            for w in chain:
                if fan.get(w, 0):
                    self.scores.record_success(w, links[w] * MBIT / 8 / fan[w])

    def _on_installed(self, name: str, v: int, token: int, epoch: int) -> None:
        w = self.w[name]
        if epoch != w.epoch or token != w.install_token or w.state not in ("active", "released"):
            return
        if v > w.installed:
            w.installed = v
        pub = self.published.get(v)
        if pub is not None:
            pub["installed"].setdefault(name, self.now)
        if w.paused_for is not None and w.paused_for <= v:
            w.paused_for = None
        if w.state == "active" and not w.busy:
            self._start_request(w)

    def _reroute(self, relay: str, kind: str, factor: float) -> float | None:
        """A relay died ("drop") or its forwarding slowed by `factor` ("slow") during the current
        broadcast. Its tail keeps receiving from it until the fault (dead) or at the slowed rate (slow);
        after ``relay_timeout_s`` the relay is excised and the tail re-attached to the nearest healthy
        ancestor (``ChainPlan.upstream``), resuming from the chunks it holds. Recomputes the tail's
        install times chunk by chunk and records each delay as a stall. Returns when the last delayed
        worker has installed (None when the broadcast was not affected)."""
        plan = self.current_plan
        pub = self.published.get(self.latest_published)
        if plan is None or pub is None or pub["plan"] is not plan:
            return None
        chain = next((c for c in plan.chains if relay in c), None)
        if chain is None or chain[-1] == relay:
            return None  # not forwarding to anyone
        i = chain.index(relay)
        tail = list(chain[i + 1 :])
        if all(self.w[x].installed >= self.latest_published for x in tail):
            return None  # this broadcast is already through
        t0, net = pub["t0"], self.cfg.net
        K, bits = net.chunks, net.chunk_bits
        t_f, t_fix = self.now, self.now + self.cfg.relay_timeout_s
        anchor = next((p for p in plan.upstream(relay) if p == SOURCE or self.w[p].state == "active"), SOURCE)
        fan = _fanout(plan)
        src_up = math.inf if net.B0_mbps is None else net.B0_mbps * MBIT
        seeds = max(1, len(plan.chains))

        def rate(sender: str, receiver: str, up_factor: float = 1.0) -> float:
            if sender == SOURCE:
                up = src_up / seeds
            else:
                up = self.w[sender].spec.link_mbps * up_factor * MBIT / fan.get(sender, 1)
            return min(up, self._link(receiver) * MBIT)

        arrivals: dict[str, list[float]] = {SOURCE: [t0] * K}
        prev = SOURCE
        for w in chain[: i + 1]:  # as they happened, up to the relay
            s = bits / rate(prev, w)
            arr, last = [], -math.inf
            for k in range(K):
                last = max(arrivals[prev][k], last) + s
                arr.append(last)
            arrivals[w] = arr
            prev = w
        resolved = self.now
        s_old = bits / rate(relay, tail[0])
        s_slow = bits / rate(relay, tail[0], factor) if kind == "slow" else math.inf
        s_new = bits / rate(anchor, tail[0])
        prev = relay
        for j, w in enumerate(tail):
            arr, last = [], -math.inf
            for k in range(K):
                if j == 0:
                    start = max(arrivals[relay][k], last)
                    if start + s_old <= t_f:
                        last = start + s_old  # left the relay before the fault
                    elif kind == "slow" and start < t_fix:
                        done = max(0.0, t_f - start) / s_old  # fraction moved at full speed
                        last = max(start, t_f) + (1 - done) * s_slow
                    else:
                        last = max(arrivals[anchor][k], last, t_fix) + s_new
                else:
                    last = max(arrivals[prev][k], last) + bits / rate(prev, w)
                arr.append(last)
            arrivals[w] = arr
            prev = w
            self._delay_install(w, arr[-1] + net.install_s, pub)
            resolved = max(resolved, arr[-1] + net.install_s)
        for leaf, parent in plan.leaves:
            if parent in tail or parent == relay:
                src = anchor if parent == relay else parent
                last = -math.inf
                s = bits / rate(src, leaf)
                for k in range(K):
                    last = max(arrivals[src][k], last, t_fix if parent == relay else -math.inf) + s
                self._delay_install(leaf, last + net.install_s, pub)
                resolved = max(resolved, last + net.install_s)
        self.scores.record_failure(relay, self.now)
        return resolved

    def _delay_install(self, name: str, t: float, pub: dict[str, Any]) -> None:
        w = self.w[name]
        if w.installed >= self.latest_published or w.state != "active":
            return
        planned = pub["times"].get(name, t)
        if t > planned:
            self.stalls.setdefault(name, []).append((planned, t))
            if self.cfg.record_timeline:  # sample the pool rate inside the stall and right after it
                self._push(max(self.now, planned), "probe")
                self._push(t, "probe")
        w.install_token += 1
        self._push(max(self.now, t), "installed", name, self.latest_published, w.install_token, w.epoch)

    # ---------------------------------------------------------------- rollout workers

    def _start_request(self, w: _W) -> None:
        if w.busy or w.state != "active" or w.paused_for is not None:
            return
        cfg = self.cfg
        mean = cfg.groups_per_request * cfg.group_size / (w.spec.mu * w.rate_factor)
        cv = w.spec.cv
        dur = self.rng.gammavariate(1 / (cv * cv), mean * cv * cv) if cv > 0 else mean
        w.busy = True
        self._push(self.now + dur, "request_done", w.spec.name, w.installed, w.epoch, self.now)

    def _on_request_done(self, name: str, version: int, epoch: int, began: float) -> None:
        w = self.w[name]
        if epoch != w.epoch:
            return
        w.busy = False
        n = self.cfg.group_size
        w.generated += n * self.cfg.groups_per_request
        w.busy_s += self.now - began
        for _ in range(self.cfg.groups_per_request):
            self._gid += 1
            meta = Meta.model_construct(
                group_id=f"g{self._gid}", prompt_ids=(1,), response_ids=(1,), logprobs=(0.0,),
                loss_mask=None, worker=name, extra={},
            )
            rec = Trajectory.model_construct(prompt="", response="", reward=0.0, version=version, meta=meta)
            try:
                self.buffer.add_group([rec], vocab_size=2, max_len=8)
                w.delivered += n
            except TrajectoryRejected:  # counted by the buffer (stale)
                pass
            else:
                self.delivered_log.append((self.now, n))
        if w.state == "active":
            self._start_request(w)
        self._learner_try()

    # ---------------------------------------------------------------- control loop

    def _on_tick(self) -> None:
        cfg = self.cfg
        if self._done:
            return
        if not any(w.state in ("active", "booting") for w in self.w.values()) and not self.learner_busy:
            self._done = True  # nobody left to produce data, nothing to activate: the run is stuck
            self.stuck = "no active worker left"
            return
        if self.now > cfg.max_time_s:
            self._done = True
            self.stuck = f"virtual time limit {cfg.max_time_s:g} s reached"
            return
        self.machines_seen.append(sum(1 for w in self.w.values() if w.state in ("active", "booting")))
        if self.sched is not None:
            for n, w in self.w.items():
                if w.state == "active" and self.sched.workers[n].state == "active":
                    # rollouts generated and seconds spent generating: mu_i is the rate while generating
                    self.sched.heartbeat(n, self.now, rollouts=w.generated, busy_s=w.busy_s)
            for a in self.sched.step(self.now):
                self._apply(a)
        if cfg.record_timeline:
            true_rate = self.pool_rate()
            seen = self.sched.mu_pool(self.now) if self.sched is not None else true_rate
            self.timeline.append((self.now, seen, true_rate))
        self._push(self.now + cfg.heartbeat_s, "tick")

    def _on_probe(self) -> None:
        seen = self.sched.mu_pool(self.now) if self.sched is not None else float("nan")
        self.timeline.append((self.now, seen, self.pool_rate()))

    def pool_rate(self) -> float:
        """The pool's true generating capacity now: sum of mu_i (times any slow-down) over active workers
        that are up and not stalled behind a failed or slowed relay (a normal broadcast is not a loss)."""
        total = 0.0
        for n, w in self.w.items():
            if w.state != "active":
                continue
            if any(a <= self.now < b for a, b in self.stalls.get(n, ())):
                continue
            total += w.spec.mu * w.rate_factor
        return total

    def _apply(self, a: Any) -> None:
        w = self.w[a.worker]
        self.actions.append({"t": self.now, "kind": a.kind, "worker": a.worker, "reason": a.reason})
        if a.kind == "activate":
            if w.state == "released" and w.installed >= self.latest_published:  # idle, current: resumes at once
                w.state = "active"
                self._bill_start(w)
                self._start_request(w)
                self.ready_log.append((self.now, a.worker))
            elif w.state in ("off", "dead", "released"):
                boot = 0.0 if w.state == "released" else self.cfg.boot_s
                w.epoch += 1
                w.state = "booting"
                self._bill_start(w)
                fetch = self.cfg.net.snapshot_bytes * 8 / (self.cfg.storage_mbps * MBIT)  # from storage, not a relay
                self._push(self.now + boot + fetch + self.cfg.net.install_s, "booted", a.worker, w.epoch, self.latest_published)
        elif a.kind == "release":
            if w.state == "active":
                w.state = "released"
                self._bill_stop(w)
        elif a.kind == "failed":
            if w.state != "dead":
                self._kill(w)

    def _on_booted(self, name: str, epoch: int, version: int) -> None:
        w = self.w[name]
        if epoch != w.epoch or w.state != "booting":
            return
        w.state = "active"
        w.installed = max(w.installed, version)
        w.paused_for = None
        w.busy = False
        if self.sched is not None and self.sched.workers[name].state != "active":
            self.sched.mark_active(name, self.now)
        self.ready_log.append((self.now, name))
        self._start_request(w)

    def _kill(self, w: _W) -> None:
        w.state = "dead"
        w.epoch += 1
        w.busy = False
        self._bill_stop(w)

    # ---------------------------------------------------------------- faults

    def _pick(self, role: str) -> str | None:
        active = self._active()
        plan = self.current_plan
        if role == "forwarder":
            if plan is None:
                return None
            best, tail = None, -1
            for chain in plan.chains:
                for i, w in enumerate(chain[:-1]):
                    if w in active and len(chain) - 1 - i > tail:
                        best, tail = w, len(chain) - 1 - i
            return best
        if role == "rollout":
            relays = set()
            if plan is not None:
                relays = {w for c in plan.chains for w in c[:-1]} | {p for _, p in plan.leaves}
            pick = [w for w in active if w not in relays]
            return pick[-1] if pick else (active[-1] if active else None)
        return role if role in self.w else None

    def _on_fault(self, f: Fault) -> None:
        name = self._pick(f.worker)
        entry = {"t": self.now, "role": f.worker, "kind": f.kind, "worker": name, "factor": f.factor}
        self.fault_log.append(entry)
        if name is None:
            return
        w = self.w[name]
        if f.kind == "slow":
            if f.worker == "forwarder":
                w.link_factor *= f.factor
                entry["chain_resolved_at"] = self._reroute(name, "slow", f.factor)
            else:
                w.rate_factor *= f.factor
        else:
            self._kill(w)
            entry["chain_resolved_at"] = self._reroute(name, "drop", 0.0)

    # ---------------------------------------------------------------- results

    def _result(self, initial: list[str], t_bcast_cal: float, mu_min: float | None, mu_target: float | None) -> SimResult:
        cfg = self.cfg
        q = 1 / cfg.gamma
        tq, tall, pubs = [], [], []
        for v, p in sorted(self.published.items()):
            exp = p["expected"]
            got = sorted(t - p["t0"] for n, t in p["installed"].items() if n in exp)
            b_q = capacity.t_bcast_quantile(got, len(exp), q) if exp else None
            b_all = got[-1] if exp and len(got) == len(exp) else None
            if b_q is not None:
                tq.append(b_q)
            if b_all is not None:
                tall.append(b_all)
            pubs.append({"version": v, "t0": p["t0"], "workers": len(exp), "t_bcast_s": b_q, "t_bcast_all_s": b_all})
        stats = self.buffer.stats()  # counters in groups (one record per group)
        hist = {int(k): v * cfg.group_size for k, v in stats["staleness_hist"].items()}
        wall = self.now
        cost_total = self.cost_workers + cfg.learner_price_per_hour * wall / 3600
        steps = max(1, self.steps_done)
        busy, idle = self.busy_time, self.idle
        return SimResult(
            steps=self.steps_done,
            wall_s=wall,
            bubble_ratio=idle / (idle + busy) if idle + busy > 0 else 0.0,
            bubble_ratio_all=(idle + self.first_fill) / (idle + self.first_fill + busy) if busy > 0 else 0.0,
            learner_wait_s=idle / max(1, self.steps_done - 1),
            t_train_s=statistics.median(self.step_times) if self.step_times else 0.0,
            t_bcast_s=statistics.median(tq) if tq else None,
            t_bcast_all_s=statistics.median(tall) if tall else None,
            T_bcast_calibrated=t_bcast_cal,
            mu_min=mu_min,
            mu_target=mu_target,
            machines_initial=len(initial),
            machines_max=max(self.machines_seen, default=len(initial)),
            machines_mean=statistics.fmean(self.machines_seen) if self.machines_seen else float(len(initial)),
            cost_total=cost_total,
            cost_per_step=cost_total / steps,
            cost_per_step_steady=(cost_total - self.cost_at_first_step) / steps,
            cost_per_hour_workers=self.cost_workers / (wall / 3600) if wall > 0 else 0.0,
            staleness_hist=hist,
            staleness_max=max(hist, default=0),
            buffer=stats,
            actions=self.actions,
            publications=pubs,
            timeline=self.timeline,
            faults=self.fault_log,
            initial_active=list(initial),
            step_log=self.step_log,
            delivered_log=self.delivered_log,
            ready_log=self.ready_log,
            stuck=self.stuck,
        )


def simulate(cfg: SimConfig) -> SimResult:
    """Run one simulated deployment."""
    return Simulation(cfg).run()
