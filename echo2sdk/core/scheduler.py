"""Cost-aware, closed-loop activation of rollout workers (paper §3.4, §4.3, appendices C.2.1 and D).

Symbols as in the paper:

- ``c_i``      price of worker i in $/h (it comes with the worker's registration)
- ``mu_i(t)``  its effective throughput in rollouts/s, measured from heartbeats over a sliding window
- ``a_i(t)``   its availability over the same window: heartbeats received / heartbeats expected
- ``rho_i``    unit throughput cost c_i / mu_i
- ``mu_pool(t) = sum_{i in A} a_i(t) * mu_i(t)`` over the active set A (eq. (4))
- ``mu_target = gamma * mu_min(kappa)`` with mu_min from :func:`echo2sdk.core.capacity.mu_min`

Launch latency and preemption (not in the paper; real machines take minutes to start, spot machines get
preempted):

- a worker the scheduler activated is *pending* (launching) until its first heartbeat since the
  activation; it is not in A and not in mu_pool (a_i = 0), and ``mu_pending(t)`` is the sum of the
  pending workers' priors mu_i. Decisions count it as coming: a shortfall activates only for
  ``mu_target - (mu_pool + mu_pending)``, a release never picks a pending worker, and it is billed
  from its activation (``cost_per_hour``)
- ``L``        lead time: activation to first heartbeat, the median of the last launches, per kind of
  machine and overall (:meth:`Scheduler.lead_s`; the prior ``lead_prior_s`` until one is measured)
- ``lambda``   preemption rate: failures of active (heartbeating) workers per active machine-hour
  (:meth:`Scheduler.preempt_rate`; the prior ``preempt_per_hour`` weighs as ``PRIOR_HOURS`` of observation)
- ``mu_projected(t) = mu_pool + mu_pending - lambda * L * mu_pool``: the capacity expected once the
  pending workers are up, less what preemptions take while a replacement launches. With
  ``anticipate`` the closed loop compares this figure (activations and releases alike) with
  mu_target, so it activates a spare *before* the shortfall; with L = 0 or lambda = 0 it is
  mu_pool + mu_pending

Static provisioning (§3.4), the initial decision of :meth:`Scheduler.provision`, is
:func:`echo2sdk.core.provisioning.select`: the minimum-cost set of workers whose summed throughput
reaches mu_target (``solver="exact"``, the default) or the paper's cheapest-rho prefix
(``solver="greedy"``). ``order="random"`` is the paper's "w/o Cost" ablation (uniform random
activation that still targets full overlap).

The closed loop (:class:`Scheduler`, C.2.1) acts only on a *sustained* deviation: capacity (mu_projected)
below the target for ``sustain_s`` activates the lowest-rho standby workers until the target is met
again; capacity above ``target * (1 + release_margin)`` for ``sustain_s`` releases the most expensive
active worker (highest rho), one at a time, and only when the rest still meets the target. Between the
two thresholds nothing happens, and every decision is followed by a ``cooldown_s`` pause, so noisy
heartbeats do not make it thrash. A failed worker (silent for ``fail_after_s``, or reported failed) is
replaced from the standby pool at once when its loss drops capacity below the target (appendix D).
A failed launch (:meth:`Scheduler.mark_launch_failed`, or no heartbeat within ``boot_timeout_s`` of
the activation) is replaced the same way, and its kind of machine is skipped for ``launch_backoff_s``:
the retry goes to the next-cheapest kind.

The registered workers, their states and their heartbeat statistics (mu_i, a_i, rho_i, mu_pool) are kept by
:class:`echo2sdk.core.throughput.Throughput`, which the scheduler holds; :class:`Patience` keeps the closed loop's
hysteresis timers.

The scheduler is a pure state machine over a caller-supplied clock: it never sleeps, starts or stops
anything. It returns :class:`Action` values; the caller applies them: :class:`echo2sdk.runtime.learner.live_loop.LiveLoop` (the trainer's
thread against the coordinator and a provider from :mod:`echo2sdk.providers`) or the simulator in
:mod:`echo2sdk.sim`.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Literal

from echo2sdk.core import capacity
from echo2sdk.core.provisioning import Solver, WorkerOffer, check_solver, select
from echo2sdk.core.throughput import ACTIVE, FAILED, STANDBY, Throughput, Worker
from echo2sdk.errors import CapacityError

__all__ = [
    "Action",
    "Scheduler",
    "LaunchStats",
    "Patience",
    "STANDBY",
    "PRIOR_HOURS",
    "LEAD_SAMPLES",
    "ACTIVE",
    "FAILED",
]

_REL = 1e-9  # relative tolerance when comparing a capacity against the target
PRIOR_HOURS = 10.0  # the prior preemption rate weighs as this many active machine-hours of observation
LEAD_SAMPLES = 5  # lead time L: the median of this many last launches


@dataclass(frozen=True)
class Action:
    """A decision of the scheduler. ``kind``: "activate" (start or wake the worker), "release" (stop
    giving it work; it stays registered and idle) or "failed" (it was declared dead; clean it up)."""

    kind: Literal["activate", "release", "failed"]
    worker: str
    at: float
    reason: str


class LaunchStats:
    """What launches taught the scheduler: the lead time L per kind of machine (activation to first heartbeat,
    the median of the last LEAD_SAMPLES), the preemption rate lambda (failures of heartbeating workers per active
    machine-hour, the prior `preempt_per_hour` weighing as PRIOR_HOURS of observation) and the kinds backed off
    after a failed launch."""

    def __init__(self, *, lead_prior_s: float, preempt_per_hour: float) -> None:
        self.lead_prior_s, self.preempt_per_hour = lead_prior_s, preempt_per_hour
        self.preemptions = 0  # failures of active (heartbeating) workers
        self.up_hours = 0.0  # active (heartbeating) machine-hours observed
        self._last: float | None = None
        self._leads: dict[str | None, deque] = {None: deque(maxlen=LEAD_SAMPLES)}  # kind (None: any) -> last L
        self._backoff: dict[str, tuple[float, str]] = {}  # kind -> (skipped until, why)

    def note_lead(self, kind: str, lead: float) -> None:
        self._leads[None].append(lead)
        self._leads.setdefault(kind, deque(maxlen=LEAD_SAMPLES)).append(lead)

    def lead_s(self, kind: str | None = None) -> float:
        samples = self._leads.get(kind) or self._leads[None]
        return statistics.median(samples) if samples else self.lead_prior_s

    def observe(self, now: float, active: int) -> None:
        """`active` machines were up since the last observation: exposure for lambda."""
        if self._last is not None and now > self._last:
            self.up_hours += active * (now - self._last) / 3600.0
        self._last = now if self._last is None else max(now, self._last)

    def preempt_rate(self) -> float:
        return (self.preemptions + self.preempt_per_hour * PRIOR_HOURS) / (self.up_hours + PRIOR_HOURS)

    def back_off(self, kind: str, until: float, why: str) -> None:
        self._backoff[kind] = (max(until, self._backoff.get(kind, (until, ""))[0]), why)

    def backoff(self, kind: str, now: float) -> tuple[float, str] | None:
        """(skipped until, why) while `kind` is backed off, else None."""
        b = self._backoff.get(kind)
        return b if b is not None and now < b[0] else None

    def backed_off_until(self, now: float) -> dict[str, float]:
        return {k: until for k, (until, _) in self._backoff.items() if until > now}


class Patience:
    """The closed loop's hysteresis (C.2.1): since when capacity has been below the target (``below_since``) and
    above the release threshold (``above_since``), when the last decision was taken, and whether a failed worker
    awaits its replacement. A deviation is acted on once it has lasted ``sustain_s`` and ``cooldown_s`` have
    passed since the last decision."""

    def __init__(self, *, sustain_s: float, cooldown_s: float) -> None:
        self.sustain_s, self.cooldown_s = sustain_s, cooldown_s
        self.below_since: float | None = None
        self.above_since: float | None = None
        self.last_action = -math.inf
        self.failure_pending = False

    def below(self, now: float) -> bool:
        """Capacity is below the target at `now`: whether that is sustained (and the cooldown over)."""
        self.above_since = None
        if self.below_since is None:
            self.below_since = now
        return now - self.below_since >= self.sustain_s and now - self.last_action >= self.cooldown_s

    def above(self, now: float) -> bool:
        """Capacity is above the release threshold at `now`: whether that is sustained (and the cooldown over)."""
        self.below_since = None
        self.failure_pending = False
        if self.above_since is None:
            self.above_since = now
        return now - self.above_since >= self.sustain_s and now - self.last_action >= self.cooldown_s

    def within(self) -> None:
        """Capacity is between the two thresholds: nothing to act on."""
        self.below_since = self.above_since = None
        self.failure_pending = False


class Scheduler:
    """Closed-loop cost-aware activation; see the module docstring.

    Args:
        gamma: safety factor, mu_target = gamma * mu_min (paper: 1.1).
        window_s: sliding window for mu_i(t) and a_i(t).
        heartbeat_s: the heartbeat period workers use (for availability).
        sustain_s: a deviation must last this long before the scheduler acts.
        release_margin: release only while capacity > target * (1 + release_margin).
        cooldown_s: minimum time between two decisions (default: sustain_s).
        fail_after_s: an active worker silent this long is declared failed (default: 3 windows' worth
            of heartbeats, i.e. max(5 * heartbeat_s, window_s / 2)).
        boot_timeout_s: an activated worker that never sends a heartbeat is failed after this long.
        order: "rho" (cost-aware, the paper) or "random" (the w/o-Cost ablation: activate and release
            in a random order).
        seed: for order="random".
        launch_backoff_s: after a failed launch, standby workers of the same kind are skipped this long
            when picking activations (the retry goes to the next-cheapest kind).
        lead_prior_s: the lead time L (activation to first heartbeat) assumed until one is measured.
        preempt_per_hour: the prior preemption rate lambda (failures per active machine-hour), blended
            with the measured rate (it weighs as ``PRIOR_HOURS`` machine-hours of observation).
        anticipate: compare mu_projected (with the expected loss lambda * L * mu_pool) with the target,
            i.e. activate spares before the shortfall; False: mu_pool + mu_pending.
        solver: how :meth:`provision` picks the initial set (order="rho"): "exact" (minimum-cost cover,
            the default) or "greedy" (the paper's cheapest-rho prefix); see
            :mod:`echo2sdk.core.provisioning`. The closed loop's later activations and releases go by
            rho one worker at a time either way.
    """

    def __init__(
        self,
        *,
        gamma: float = 1.1,
        window_s: float = 60.0,
        heartbeat_s: float = 1.0,
        sustain_s: float = 30.0,
        release_margin: float = 0.15,
        cooldown_s: float | None = None,
        fail_after_s: float | None = None,
        boot_timeout_s: float = 600.0,
        order: Literal["rho", "random"] = "rho",
        seed: int = 0,
        solver: Solver = "exact",
        launch_backoff_s: float = 600.0,
        lead_prior_s: float = 0.0,
        preempt_per_hour: float = 0.0,
        anticipate: bool = True,
    ) -> None:
        self.gamma = capacity.quantity("gamma", gamma)
        if self.gamma < 1.0:
            raise CapacityError(f"safety factor gamma must be >= 1, got gamma={gamma!r}")
        self.window_s = capacity.quantity("window_s", window_s)
        self.heartbeat_s = capacity.quantity("heartbeat_s", heartbeat_s)
        self.sustain_s = capacity.quantity("sustain_s", sustain_s, allow_zero=True)
        self.release_margin = capacity.quantity("release_margin", release_margin, allow_zero=True)
        self.cooldown_s = self.sustain_s if cooldown_s is None else capacity.quantity("cooldown_s", cooldown_s, allow_zero=True)
        default_fail = max(5 * self.heartbeat_s, self.window_s / 2)
        self.fail_after_s = default_fail if fail_after_s is None else capacity.quantity("fail_after_s", fail_after_s)
        self.boot_timeout_s = capacity.quantity("boot_timeout_s", boot_timeout_s)
        if order not in ("rho", "random"):
            raise CapacityError(f"order must be 'rho' or 'random', got order={order!r}")
        self.order = order
        self.solver = check_solver(solver)
        self.launch_backoff_s = capacity.quantity("launch_backoff_s", launch_backoff_s, allow_zero=True)
        self.lead_prior_s = capacity.quantity("lead_prior_s", lead_prior_s, allow_zero=True)
        self.preempt_per_hour = capacity.quantity("preempt_per_hour", preempt_per_hour, allow_zero=True)
        self.anticipate = bool(anticipate)
        self._rng = random.Random(seed)
        self._random_rank: dict[str, float] = {}
        self.throughput = Throughput(self.window_s, self.heartbeat_s)  # the workers and their heartbeat statistics
        self.workers: dict[str, Worker] = self.throughput.workers
        self.mu_min: float | None = None
        self.mu_target: float | None = None
        self.calibration: dict[str, float] = {}
        self.patience = Patience(sustain_s=self.sustain_s, cooldown_s=self.cooldown_s)
        self._changes_since_calibration = 0
        self._active_at_calibration = 0
        self.launches = LaunchStats(lead_prior_s=self.lead_prior_s, preempt_per_hour=self.preempt_per_hour)
        self.log: list[Action] = []

    # ------------------------------------------------------------------ target

    def calibrate(self, *, T_train: float, T_bcast: float, R: float, kappa: int) -> float:
        """Set mu_target = gamma * mu_min(kappa) from measured T_train, T_bcast (paper §4.3: calibrated
        at deployment, re-measured when the pool changes substantially). Returns mu_target.
        Raises CapacityError when kappa * T_train <= T_bcast (no pool can keep the learner busy)."""
        self.mu_min = capacity.mu_min(T_train, T_bcast, R, kappa)
        self.mu_target = capacity.mu_target(self.mu_min, self.gamma)
        self.calibration = {"T_train": float(T_train), "T_bcast": float(T_bcast), "R": float(R), "kappa": kappa}
        self._changes_since_calibration = 0
        self._active_at_calibration = len(self.throughput.activated())
        return self.mu_target

    def set_target(self, mu_target: float) -> None:
        """Set mu_target directly (for a target computed elsewhere)."""
        self.mu_target = capacity.quantity("mu_target", mu_target)

    @property
    def recalibration_due(self) -> bool:
        """True once activations, releases and failures since the last calibration reach a quarter of
        the active set at that time (at least one): the pool changed substantially (§4.3)."""
        return self._changes_since_calibration >= max(1, math.ceil(0.25 * self._active_at_calibration))

    # ------------------------------------------------------------------ registry

    def add_worker(
        self, name: str, price_per_hour: float, mu: float, *, active: bool = False, now: float = 0.0, kind: str | None = None
    ) -> None:
        """Register a worker with its price c_i and a prior mu_i (catalog value or warm-up measurement),
        used until heartbeats measure it. ``active=True`` registers it as already working (up, not
        pending). ``kind``: its machine type (default: its name), for launch back-off and lead times."""
        w = self.throughput.add(name, price_per_hour, mu, kind)
        if active:
            self.throughput.set_state(w, ACTIVE, now)

    def remove_worker(self, name: str) -> None:
        self.workers.pop(name, None)

    def set_prior(self, name: str, mu: float) -> None:
        """Replace a worker's prior throughput (e.g. after a warm-up measurement)."""
        self.throughput.get(name).mu_prior = capacity.quantity(f"mu of worker {name!r}", mu)

    def mark_active(self, name: str, now: float) -> None:
        """Record that a worker is active without a decision of ours (e.g. it joined already working)."""
        self.throughput.set_state(self.throughput.get(name), ACTIVE, now)

    def mark_standby(self, name: str, now: float) -> None:
        """Return a (failed or released) worker to the standby pool, e.g. after it re-joined."""
        self.throughput.set_state(self.throughput.get(name), STANDBY, now)

    def mark_failed(self, name: str, now: float, reason: str = "reported failed") -> Action | None:
        """Declare a worker failed (the coordinator dropped it). Returns the "failed" action, if any. The
        failure of an active worker that had sent a heartbeat counts toward the preemption rate lambda."""
        w = self.throughput.get(name)
        if w.state == FAILED:
            return None
        if w.state == ACTIVE and w.launched_at is None and w.first_beat is not None:
            self.launches.preemptions += 1
        return self._fail(w, now, reason)

    def mark_launch_failed(self, name: str, now: float, reason: str = "launch failed") -> Action | None:
        """The machine of worker `name` could not be launched (the provider said so, or it sent no
        heartbeat within boot_timeout_s of its activation). It is FAILED, replaced at once when the
        target needs it, and its kind is skipped for ``launch_backoff_s`` when picking activations, so
        the retry goes to the next-cheapest kind (by rho). Returns the "failed" action (None when the
        worker had already failed; the back-off applies either way)."""
        w = self.throughput.get(name)
        if self.launch_backoff_s > 0:
            self.launches.back_off(w.kind, now + self.launch_backoff_s, reason)
        if w.state == FAILED:
            return None
        return self._fail(w, now, f"{reason}; kind {w.kind!r} skipped for {self.launch_backoff_s:.0f} s")

    def _fail(self, w: Worker, now: float, reason: str) -> Action:
        """`w` is FAILED now; an active one is to be replaced. The "failed" action, logged."""
        if w.state == ACTIVE:
            self.patience.failure_pending = True
            self._changes_since_calibration += 1
        self.throughput.set_state(w, FAILED, now)
        action = Action("failed", w.name, now, reason)
        self.log.append(action)
        return action

    def heartbeat(
        self, name: str, now: float, *, rollouts: float | None = None, rate: float | None = None, busy_s: float | None = None
    ) -> None:
        """A heartbeat from worker `name` at time `now`. ``rollouts``: its cumulative count of delivered
        rollouts; with ``busy_s`` (cumulative seconds spent generating) mu_i is delta rollouts / delta
        busy over the window (the rate while generating, immune to idle spells); without it, delta
        rollouts / delta time. ``rate``: the worker's own estimate in rollouts/s, averaged over the
        window when no counts are given. Heartbeats from unknown or failed workers are ignored."""
        w = self.throughput.record(name, now, rollouts, rate, busy_s)
        if w is not None and w.launched_at is not None and w.state == ACTIVE:  # the first since we activated it: up
            self.launches.note_lead(w.kind, now - w.launched_at)
            w.launched_at = None

    # ------------------------------------------------------------------ estimates

    def mu_i(self, name: str, now: float) -> float:
        """mu_i(t): delivered rollouts per second over the window (:meth:`Throughput.mu_i`)."""
        return self.throughput.mu_i(name, now)

    def a_i(self, name: str, now: float) -> float:
        """a_i(t): heartbeats received over those expected in the window (:meth:`Throughput.a_i`)."""
        return self.throughput.a_i(name, now)

    def rho_i(self, name: str, now: float) -> float:
        """rho_i = c_i / mu_i (:meth:`Throughput.rho_i`)."""
        return self.throughput.rho_i(name, now)

    def active(self) -> list[str]:
        """The active set A: activated workers that are up (not pending)."""
        return self.throughput.active()

    def pending(self) -> list[str]:
        """Activated workers without a heartbeat since (launching; :meth:`Throughput.pending`)."""
        return self.throughput.pending()

    def standby(self) -> list[str]:
        return self.throughput.standby()

    def contribution(self, name: str, now: float) -> float:
        """a_i(t) * mu_i(t) of one worker."""
        return self.throughput.contribution(name, now)

    def mu_pool(self, now: float) -> float:
        """mu_pool(t) = sum over active workers of a_i(t) * mu_i(t) (paper eq. (4)); pending ones are not in it."""
        return self.throughput.mu_pool(now)

    def mu_pending(self, now: float) -> float:
        """The capacity on its way: the sum of the pending workers' priors mu_i."""
        return self.throughput.mu_pending(now)

    def lead_s(self, kind: str | None = None) -> float:
        """L: seconds from activation to first heartbeat, the median of the last ``LEAD_SAMPLES``
        launches of machines of `kind` (of any kind when None or when none of it was measured yet),
        ``lead_prior_s`` until one is measured."""
        return self.launches.lead_s(kind)

    def preempt_rate(self) -> float:
        """lambda: failures of active (heartbeating) workers per active machine-hour, measured, blended
        with the prior ``preempt_per_hour`` as ``PRIOR_HOURS`` machine-hours of observation."""
        return self.launches.preempt_rate()

    def expected_loss(self, now: float) -> float:
        """lambda * L * mu_pool: the capacity preemptions are expected to take while a replacement
        launches (0 without ``anticipate``)."""
        return self._loss_fraction() * self.mu_pool(now)

    def _loss_fraction(self) -> float:
        """lambda * L (at most 1): the share of mu_pool expected lost during one lead time."""
        return min(1.0, self.preempt_rate() * self.lead_s() / 3600.0) if self.anticipate else 0.0

    def mu_projected(self, now: float) -> float:
        """mu_pool + mu_pending - lambda * L * mu_pool: the figure the closed loop compares with mu_target."""
        return self.mu_pool(now) + self.mu_pending(now) - self.expected_loss(now)

    def cost_per_hour(self) -> float:
        """sum of c_i over active and pending workers (a machine is billed from its activation)."""
        return self.throughput.cost_per_hour()

    # ------------------------------------------------------------------ decisions

    def provision(self, now: float) -> list[Action]:
        """Initial provisioning (§3.4): activate the standby workers that
        :func:`echo2sdk.core.provisioning.select` picks with this scheduler's `solver` (by their
        priors) to reach mu_target together with the workers already active, the same decision
        `echo2 plan` prints. No hysteresis: this is the deployment decision. The closed loop
        (:meth:`step`) then activates standby workers in cheapest-rho order, one decision at a time:
        an incremental top-up, not a re-solve."""
        self._need_target()
        assert self.mu_target is not None
        if self.order == "random":
            actions = self._activate_until_target(now, "initial provisioning")
        else:
            have = sum(self.workers[n].mu_prior for n in self.throughput.activated())
            offers = [WorkerOffer(n, self.workers[n].price_per_hour, self.workers[n].mu_prior)
                      for n in self.standby() if self.launches.backoff(self.workers[n].kind, now) is None]
            actions = []
            if have < self.mu_target * (1 - _REL) and offers:
                sel = select(offers, self.mu_target - have, self.solver)
                for o in sel.chosen:
                    self.throughput.launch(self.workers[o.name], now)
                    actions.append(Action("activate", o.name, now, f"initial provisioning; rho={o.rho:.4g}"))
                self.patience.last_action = now
                self.log += actions
        self.patience.below_since = self.patience.above_since = None
        return actions

    def step(self, now: float) -> list[Action]:
        """One control tick; returns the decisions taken (often none). See the module docstring."""
        self._need_target()
        assert self.mu_target is not None
        actions: list[Action] = []
        self.launches.observe(now, len(self.active()))  # exposure for lambda
        for w, why, launching in self.throughput.overdue(now, self.boot_timeout_s, self.fail_after_s):  # liveness
            actions.append((self.mark_launch_failed if launching else self.mark_failed)(w.name, now, why))
        actions = [a for a in actions if a is not None]

        cap = self.mu_projected(now)
        target = self.mu_target
        p = self.patience
        if cap < target * (1 - _REL):
            sustained = p.below(now)
            if (p.failure_pending or sustained) and self.standby():
                assert p.below_since is not None
                why = "replace failed worker" if p.failure_pending else (
                    f"{self._describe(now, cap)} < mu_target {target:.3g} for {now - p.below_since:.0f} s"
                )
                actions += self._activate_until_target(now, why)
                p.below_since = None
            p.failure_pending = False
        elif cap > target * (1 + self.release_margin):
            if p.above(now):
                action = self._release_one(now, cap)
                if action is not None:
                    actions.append(action)
                p.above_since = None  # one release per sustained interval: gradual
        else:
            p.within()
        return actions

    @property
    def infeasible(self) -> bool:
        """True when the target is set, no standby worker is left, and the active set misses it by
        its priors (the plain warning `status()` reports)."""
        return bool(self.mu_target) and not self.standby() and (
            sum(self.workers[n].mu_prior for n in self.throughput.activated()) < self.mu_target * (1 - _REL)
        )

    def status(self, now: float) -> dict:
        """Numbers for logs and metrics."""
        return {
            "mu_min": self.mu_min,
            "mu_target": self.mu_target,
            "mu_pool": self.mu_pool(now),
            "mu_pending": self.mu_pending(now),
            "mu_projected": self.mu_projected(now),
            "active": self.active(),
            "pending": self.pending(),
            "standby": self.standby(),
            "failed": self.throughput.failed(),
            "cost_per_hour": self.cost_per_hour(),
            "cost_per_hour_pending": sum(self.workers[n].price_per_hour for n in self.pending()),
            "lead_s": self.lead_s(),
            "preempt_per_hour": self.preempt_rate(),
            "backoff": self.launches.backed_off_until(now),
            "recalibration_due": self.recalibration_due,
        }

    # ------------------------------------------------------------------ internals

    def _need_target(self) -> None:
        if self.mu_target is None:
            raise CapacityError("the scheduler has no mu_target: call calibrate(...) or set_target(...) first")

    def _describe(self, now: float, cap: float) -> str:
        """The capacity figure a reason quotes: mu_pool alone while nothing is pending or expected lost."""
        pending, loss = self.mu_pending(now), self.expected_loss(now)
        if not pending and not loss:
            return f"mu_pool {cap:.3g}"
        return (f"mu_projected {cap:.3g} (mu_pool {self.mu_pool(now):.3g} + mu_pending {pending:.3g}"
                f" - lambda*L*mu_pool {loss:.3g})")

    def _order_key(self, name: str, now: float) -> float:
        if self.order == "random":
            if name not in self._random_rank:
                self._random_rank[name] = self._rng.random()
            return self._random_rank[name]
        return self.rho_i(name, now)

    def _activate_until_target(self, now: float, reason: str) -> list[Action]:
        assert self.mu_target is not None
        cap = self.mu_projected(now)  # pending workers count as coming: no second launch for their deficit
        actions = []
        skipped: dict[str, str] = {}  # kinds backed off after a failed launch, cheaper than what we pick
        for name in sorted(self.standby(), key=lambda n: (self._order_key(n, now), n)):
            if cap >= self.mu_target * (1 - _REL):
                break
            w = self.workers[name]
            if (backoff := self.launches.backoff(w.kind, now)) is not None:
                until, why = backoff
                skipped.setdefault(w.kind, f"kind {w.kind!r} skipped until t={until:.0f} s (launch failed: {why})")
                continue
            mu_guess = w.last_mu or w.mu_prior
            self.throughput.launch(w, now)
            cap += mu_guess
            note = "".join(f"; {s}" for s in skipped.values())
            actions.append(Action("activate", name, now, f"{reason}; rho={w.price_per_hour / mu_guess:.4g}{note}"))
        if actions:
            self.patience.last_action = now
            self._changes_since_calibration += len(actions)
        self.log += actions
        return actions

    def _release_one(self, now: float, cap: float) -> Action | None:
        """Release the highest-rho measured active worker whose loss keeps mu_projected (`cap`) at the
        target; never a pending one (not in active())."""
        assert self.mu_target is not None
        keep = 1.0 - self._loss_fraction()
        ranked = sorted(self.active(), key=lambda n: (-self._order_key(n, now), n))
        for name in ranked:  # most expensive first
            if not self.throughput.measured(self.workers[name]):
                continue  # too new to judge
            rest = cap - self.contribution(name, now) * keep  # its mu_pool share, less its expected loss
            if rest >= self.mu_target * (1 + _REL):
                self.throughput.set_state(self.workers[name], STANDBY, now)
                self.patience.last_action = now
                self._changes_since_calibration += 1
                why = f"{self._describe(now, cap)} > mu_target {self.mu_target:.3g}; {rest:.3g} without it"
                action = Action("release", name, now, why)
                self.log.append(action)
                return action
        return None
