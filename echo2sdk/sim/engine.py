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
  published snapshot completes. ``"overlap"`` is what ``echo2sdk.runtime.worker.process`` does: it keeps
  generating under the old version while chunks arrive;
- faults: a worker's rollout rate or relay link slowed by a factor, or the worker dropped; a dead relay
  stalls its tail until ``relay_timeout_s``, then the tail is re-attached to the nearest healthy
  ancestor and resumes from the chunks it holds; a replacement boots for ``boot_s`` (or a latency drawn
  from ``launch_s``) and fetches the current snapshot from storage at ``storage_mbps``;
- spot preemptions: with ``preempt_per_hour`` every active machine dies after an exponential time (a
  Poisson process per machine-hour), like a "drop" fault; the scheduler notices by silence only. Once
  it has declared the machine failed, its slot goes back to the standby pool (another machine of that
  type can be rented; starting it takes a launch latency again).

Nothing here imports numpy or torch; a 76-worker, 100-step run takes seconds.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from echo2sdk.core import capacity
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.provisioning import Solver, WorkerOffer
from echo2sdk.core.provisioning import provision as core_provision
from echo2sdk.core.records import Meta, Trajectory
from echo2sdk.core.scheduler import Scheduler
from echo2sdk.errors import CapacityError, ConfigError, TrajectoryRejected
from echo2sdk.sim.accounting import Ledger
from echo2sdk.sim.broadcast import Dissemination
from echo2sdk.sim.clock import EventQueue
from echo2sdk.sim.faults import Fault, pick_worker
from echo2sdk.sim.inputs import SimConfig, SimWorker
from echo2sdk.sim.network import MBIT, Network, install_times, t_bcast_quantile
from echo2sdk.sim.results import SimResult, summarize
from echo2sdk.sim.workers import WorkerState

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


# ==================================================================== the simulation


class Simulation:
    """Runs one :class:`SimConfig`; call :meth:`run` once. The publications are a
    :class:`~echo2sdk.sim.broadcast.Dissemination`, the costs and logs a :class:`~echo2sdk.sim.accounting.Ledger`;
    here are the learner, the rollout workers, the control loop and the faults."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.events = EventQueue()
        self.w: dict[str, WorkerState] = {s.name: WorkerState(s) for s in cfg.pool}
        # One buffer record stands for one GRPO group of n rollouts: every rollout of a group shares its
        # version, so admission, eviction and sampling are exactly those of the real buffer, n times cheaper.
        self.buffer = StalenessBuffer(staleness=cfg.S, group_size=1, order="fifo")
        self.bcast = Dissemination(cfg, self.w, self.events)
        self.ledger = Ledger()
        self.version = 0
        self.steps_done = 0
        self.learner_busy = False
        self._gid = 0
        self.sched: Scheduler | None = None
        self._done = False
        self.stuck: str | None = None
        # own streams, so that launch latencies and preemptions leave the request durations as they were
        self.launch_rng = random.Random(f"launch-{cfg.seed}")
        self.preempt_rng = random.Random(f"preempt-{cfg.seed}")
        self.filter_rng = random.Random(f"filter-{cfg.seed}")  # which groups dynamic sampling drops
        self._preempted: set[str] = set()  # dead by preemption, not yet declared failed by the scheduler

    @property
    def now(self) -> float:
        """The virtual clock (seconds)."""
        return self.events.now

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
                offers, T_train=t_train, R=cfg.R_provision, kappa=cfg.k, gamma=cfg.gamma, net=cfg.net.typical(),
                link_mbps=links, order=cfg.activation, rng=self.rng, solver=cfg.solver,
            )
            names = [o.name for o in chosen]
        times, _ = install_times(names, cfg.net.typical(), links)  # with deltas: the mean publication's bytes
        t_bcast = t_bcast_quantile(times, 0.0, 1 / cfg.gamma)
        return names, t_train, t_bcast

    def _step_time(self) -> float:
        cv = self.cfg.T_train_cv
        if cv == 0:
            return self.cfg.T_train
        sigma = math.sqrt(math.log(1 + cv * cv))
        return self.cfg.T_train * math.exp(self.rng.gauss(-sigma * sigma / 2, sigma))

    def _control(self, names: list[str], t_train: float, t_bcast: float) -> tuple[float | None, float | None]:
        """The closed loop: a Scheduler calibrated on the warm-up's figures, with `names` active (none when
        activation="all", closed_loop is off or the deployment is infeasible). Returns (mu_min, mu_target)."""
        cfg = self.cfg
        mu_min = mu_target = None
        if cfg.activation != "all" and cfg.closed_loop:
            fetch = cfg.net.snapshot_bytes * 8 / (cfg.storage_mbps * MBIT)
            shortest, mean, longest = cfg.launch_range
            lead_prior = mean + fetch + cfg.net.install_s if cfg.lead_prior_s is None else cfg.lead_prior_s
            self.sched = Scheduler(
                gamma=cfg.gamma, window_s=cfg.window_s, heartbeat_s=cfg.heartbeat_s, sustain_s=cfg.sustain_s,
                release_margin=cfg.release_margin, fail_after_s=cfg.fail_after_s,
                boot_timeout_s=longest + fetch + 10 * cfg.heartbeat_s,
                order=cfg.activation, seed=cfg.seed, solver=cfg.solver,
                lead_prior_s=lead_prior, preempt_per_hour=cfg.preempt_per_hour, anticipate=cfg.anticipate,
            )
            for s in cfg.pool:
                self.sched.add_worker(s.name, s.price_per_hour, s.mu, active=s.name in names, kind=s.kind)
            try:
                mu_target = self.sched.calibrate(T_train=t_train, T_bcast=t_bcast, R=cfg.R_provision, kappa=cfg.k)
                mu_min = self.sched.mu_min
            except CapacityError:
                self.sched = None  # infeasible: run open loop with the chosen pool
        else:
            try:
                mu_min = capacity.mu_min(t_train, t_bcast, cfg.R_provision, cfg.k)
                mu_target = capacity.mu_target(mu_min, cfg.gamma)
            except CapacityError:
                pass
        return mu_min, mu_target

    # ---------------------------------------------------------------- run

    def run(self) -> SimResult:
        cfg = self.cfg
        names, t_train_cal, t_bcast_cal = self._calibrate()
        mu_min, mu_target = self._control(names, t_train_cal, t_bcast_cal)
        for n in names:  # the initial policy (version 0) is on every machine at start
            w = self.w[n]
            w.state = "active"
            self.ledger.bill_start(w, self.now)
            self._start_request(w)
            self._up(w)
        for f in cfg.faults:
            self.events.push(f.at_s, "fault", f)
        self.events.push(cfg.heartbeat_s, "tick")
        self._learner_try()
        while self.events and not self._done:
            kind, data = self.events.pop()
            getattr(self, "_on_" + kind)(*data)
        for w in self.w.values():
            self.ledger.bill_stop(w, self.now)
        return summarize(
            cfg, self.ledger, self.bcast.published, self.buffer.stats(), steps_done=self.steps_done, wall=self.now,
            initial=names, t_bcast_cal=t_bcast_cal, mu_min=mu_min, mu_target=mu_target, stuck=self.stuck,
        )

    # ---------------------------------------------------------------- learner

    def _learner_try(self) -> None:
        if self.learner_busy or self._done:
            return
        k = self.cfg.R // self.cfg.group_size
        if self.buffer.ready_groups() < k:
            if self.ledger.wait_since is None:
                self.ledger.wait_since = self.now
            return
        self.ledger.batch_ready(self.now, self.steps_done == 0, self.w.values(), self.cfg.learner_price_per_hour)
        self.buffer.sample(k)
        dt = self._step_time()
        self.learner_busy = True
        self.ledger.step_began(self.now, dt)
        self.events.push(self.now + dt, "learner_done")

    def _on_learner_done(self) -> None:
        self.learner_busy = False
        self.steps_done += 1
        self.version += 1
        self.buffer.set_version(self.version)
        if self.steps_done >= self.cfg.steps:
            self._done = True
            return
        if self.version % self.cfg.k == 0:
            self.bcast.publish(self.version)
        self._learner_try()

    def _on_installed(self, name: str, v: int, token: int, epoch: int) -> None:
        w = self.w[name]
        if epoch != w.epoch or token != w.install_token or w.state not in ("active", "released"):
            return
        if v > w.installed:
            w.installed = v
        pub = self.bcast.published.get(v)
        if pub is not None:
            pub["installed"].setdefault(name, self.now)
        if w.paused_for is not None and w.paused_for <= v:
            w.paused_for = None
        if w.state == "active" and not w.busy:
            self._start_request(w)

    # ---------------------------------------------------------------- rollout workers

    def _start_request(self, w: WorkerState) -> None:
        if w.busy or w.state != "active" or w.paused_for is not None:
            return
        cfg = self.cfg
        mean = cfg.groups_per_request * cfg.group_size / (w.spec.mu * w.rate_factor)
        cv = w.spec.cv
        dur = self.rng.gammavariate(1 / (cv * cv), mean * cv * cv) if cv > 0 else mean
        w.busy = True
        self.events.push(self.now + dur, "request_done", w.spec.name, w.installed, w.epoch, self.now)

    def _on_request_done(self, name: str, version: int, epoch: int, began: float) -> None:
        w = self.w[name]
        if epoch != w.epoch:
            return
        w.busy = False
        n = self.cfg.group_size
        w.generated += n * self.cfg.groups_per_request
        w.busy_s += self.now - began
        for _ in range(self.cfg.groups_per_request):
            # skipped prompts were never drawn here: the generated groups are zero-variance at f_after
            if self.cfg.filter_rate_after and self.filter_rng.random() < self.cfg.filter_rate_after:
                self.ledger.groups_filtered += 1  # zero reward variance: dropped, generated all the same
                continue
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
                self.ledger.delivered_log.append((self.now, n))
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
        self.ledger.machines_seen.append(sum(1 for w in self.w.values() if w.state in ("active", "booting")))
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
            self.ledger.timeline.append((self.now, seen, true_rate))
        self.events.push(self.now + cfg.heartbeat_s, "tick")

    def _on_probe(self) -> None:
        seen = self.sched.mu_pool(self.now) if self.sched is not None else float("nan")
        self.ledger.timeline.append((self.now, seen, self.pool_rate()))

    def pool_rate(self) -> float:
        """The pool's true generating capacity now: sum of mu_i (times any slow-down) over active workers
        that are up and not stalled behind a failed or slowed relay (a normal broadcast is not a loss)."""
        total = 0.0
        for n, w in self.w.items():
            if w.state != "active":
                continue
            if self.bcast.stalled(n, self.now):
                continue
            total += w.spec.mu * w.rate_factor
        return total

    def _apply(self, a: Any) -> None:
        w = self.w[a.worker]
        self.ledger.actions.append({"t": self.now, "kind": a.kind, "worker": a.worker, "reason": a.reason})
        if a.kind == "activate":
            if w.state == "released" and w.installed >= self.bcast.latest_published:  # idle, current: resumes at once
                w.state = "active"
                self.ledger.bill_start(w, self.now)
                self._start_request(w)
                self._up(w)
                self.ledger.ready_log.append((self.now, a.worker))
            elif w.state in ("off", "dead", "released"):
                boot = 0.0 if w.state == "released" else self.cfg.draw_launch(self.launch_rng)
                w.epoch += 1
                w.state = "booting"
                self.ledger.bill_start(w, self.now)
                fetch = self.cfg.net.snapshot_bytes * 8 / (self.cfg.storage_mbps * MBIT)  # from storage, not a relay
                self.events.push(self.now + boot + fetch + self.cfg.net.install_s, "booted", a.worker, w.epoch,
                                 self.bcast.latest_published)
        elif a.kind == "release":
            if w.state == "active":
                w.state = "released"
                self.ledger.bill_stop(w, self.now)
        elif a.kind == "failed":
            if w.state != "dead":
                self._kill(w)
            if a.worker in self._preempted and self.sched is not None:  # the slot is back on the market
                self._preempted.discard(a.worker)
                self.sched.mark_standby(a.worker, self.now)

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
        self.ledger.ready_log.append((self.now, name))
        self._start_request(w)
        self._up(w)

    def _up(self, w: WorkerState) -> None:
        """`w` became active: with preempt_per_hour, draw when the spot market takes it back."""
        w.up_token += 1
        if self.cfg.preempt_per_hour > 0:
            at = self.now + self.preempt_rng.expovariate(self.cfg.preempt_per_hour / 3600.0)
            self.events.push(at, "preempt", w.spec.name, w.up_token)

    def _on_preempt(self, name: str, token: int) -> None:
        w = self.w[name]
        if token != w.up_token or w.state != "active" or self._done:
            return
        entry = {"t": self.now, "role": "spot", "kind": "preempt", "worker": name, "factor": 0.0}
        self.ledger.fault_log.append(entry)
        self._kill(w)
        self._preempted.add(name)
        entry["chain_resolved_at"] = self.bcast.reroute(name, "drop", 0.0)

    def _kill(self, w: WorkerState) -> None:
        w.state = "dead"
        w.epoch += 1
        w.busy = False
        self.ledger.bill_stop(w, self.now)

    # ---------------------------------------------------------------- faults

    def _on_fault(self, f: Fault) -> None:
        name = pick_worker(f.worker, self._active(), self.bcast.current_plan, self.w)
        entry = {"t": self.now, "role": f.worker, "kind": f.kind, "worker": name, "factor": f.factor}
        self.ledger.fault_log.append(entry)
        if name is None:
            return
        w = self.w[name]
        if f.kind == "slow":
            if f.worker == "forwarder":
                w.link_factor *= f.factor
                entry["chain_resolved_at"] = self.bcast.reroute(name, "slow", f.factor)
            else:
                w.rate_factor *= f.factor
        else:
            self._kill(w)
            entry["chain_resolved_at"] = self.bcast.reroute(name, "drop", 0.0)


def simulate(cfg: SimConfig) -> SimResult:
    """Run one simulated deployment."""
    return Simulation(cfg).run()
