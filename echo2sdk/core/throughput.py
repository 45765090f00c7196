"""The rollout workers a :class:`echo2sdk.core.scheduler.Scheduler` tracks, and what their heartbeats measure
(paper §4.3, appendix C.2.1): each worker's state, mu_i(t) and a_i(t) over a sliding window, rho_i = c_i / mu_i,
and the pool's figures mu_pool(t) and mu_pending(t). Symbols as in :mod:`echo2sdk.core.scheduler`.

A pure record over a caller-supplied clock: the scheduler decides, this class only counts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from echo2sdk.core.provisioning import WorkerOffer
from echo2sdk.errors import CapacityError

__all__ = ["ACTIVE", "FAILED", "STANDBY", "Throughput", "Worker"]

STANDBY, ACTIVE, FAILED = "standby", "active", "failed"


@dataclass
class Worker:
    name: str
    price_per_hour: float
    mu_prior: float
    state: str = STANDBY
    since: float = 0.0  # when the current state began
    samples: deque = field(default_factory=deque)  # (t, cumulative rollouts, rate, cumulative busy s); any may be None
    last_beat: float | None = None
    first_beat: float | None = None  # first heartbeat in the current state
    last_mu: float | None = None  # the last measured mu_i, kept across release for ranking
    kind: str = ""  # the machine type (launch failures back off a kind; lead times are per kind)
    launched_at: float | None = None  # activated by us and no heartbeat since: pending (launching)


class Throughput:
    """The registered workers (``workers``: name -> :class:`Worker`), their states, and the heartbeat statistics
    over a sliding window of ``window_s`` seconds, heartbeats expected every ``heartbeat_s`` seconds."""

    def __init__(self, window_s: float, heartbeat_s: float) -> None:
        self.window_s, self.heartbeat_s = window_s, heartbeat_s
        self.workers: dict[str, Worker] = {}

    def get(self, name: str) -> Worker:
        try:
            return self.workers[name]
        except KeyError:
            raise CapacityError(f"unknown worker {name!r}; registered: {sorted(self.workers)}") from None

    def add(self, name: str, price_per_hour: float, mu: float, kind: str | None) -> Worker:
        """Register a STANDBY worker with its price c_i and prior mu_i; ``kind`` defaults to its name."""
        offer = WorkerOffer(name, price_per_hour, mu)  # validates
        if name in self.workers:
            raise CapacityError(f"worker {name!r} is already registered")
        if kind is not None and (not isinstance(kind, str) or not kind):
            raise CapacityError(f"kind of worker {name!r} must be a non-empty string, got kind={kind!r}")
        w = self.workers[name] = Worker(name, offer.price_per_hour, offer.mu, kind=kind or name)
        return w

    # ------------------------------------------------------------------ states

    def set_state(self, w: Worker, state: str, now: float) -> None:
        w.state, w.since = state, now
        w.first_beat = w.launched_at = None
        w.samples.clear()  # measurements restart with the new state (an idle spell says nothing of mu_i)

    def launch(self, w: Worker, now: float) -> None:
        """Our activation: ACTIVE and pending until its first heartbeat."""
        self.set_state(w, ACTIVE, now)
        w.launched_at = now

    def active(self) -> list[str]:
        """The active set A: activated workers that are up (not pending)."""
        return [n for n, w in self.workers.items() if w.state == ACTIVE and w.launched_at is None]

    def pending(self) -> list[str]:
        """Workers the scheduler activated that have not sent a heartbeat since (launching). Their
        ``state`` is ACTIVE: the decision stands; they are not in A yet."""
        return [n for n, w in self.workers.items() if w.state == ACTIVE and w.launched_at is not None]

    def activated(self) -> list[str]:
        """Active and pending workers: those the decisions stand for."""
        return [n for n, w in self.workers.items() if w.state == ACTIVE]

    def standby(self) -> list[str]:
        return [n for n, w in self.workers.items() if w.state == STANDBY]

    def failed(self) -> list[str]:
        return [n for n, w in self.workers.items() if w.state == FAILED]

    # ------------------------------------------------------------------ heartbeats

    def record(
        self, name: str, now: float, rollouts: float | None, rate: float | None, busy_s: float | None
    ) -> Worker | None:
        """Count a heartbeat (see :meth:`echo2sdk.core.scheduler.Scheduler.heartbeat`). Returns its worker, or None
        for a heartbeat ignored: from an unknown or failed worker, or a repeated reading of the last one."""
        w = self.workers.get(name)
        if w is None or w.state == FAILED:
            return None
        if w.last_beat is not None and now <= w.last_beat:
            return None  # a repeated reading of the same heartbeat
        w.last_beat = now
        if w.first_beat is None:
            w.first_beat = now
        w.samples.append((now, rollouts, rate, busy_s))
        self._trim(w, now)
        return w

    def overdue(self, now: float, boot_timeout_s: float, fail_after_s: float) -> list[tuple[Worker, str, bool]]:
        """Liveness: (worker, why, launching) for each activated worker to declare failed at `now`: a pending one
        without a heartbeat ``boot_timeout_s`` after its activation (launching: True, a failed launch), one
        activated without our launch that sent none within ``boot_timeout_s``, or one silent for ``fail_after_s``."""
        due = []
        for w in self.workers.values():
            if w.state != ACTIVE:
                continue
            if w.launched_at is not None:
                if now - w.launched_at > boot_timeout_s:
                    due.append((w, f"no heartbeat {now - w.launched_at:.0f} s after activation", True))
            elif w.last_beat is None or w.last_beat < w.since:
                if now - w.since > boot_timeout_s:
                    due.append((w, f"no heartbeat {now - w.since:.0f} s after activation", False))
            elif now - w.last_beat > fail_after_s:
                due.append((w, f"silent for {now - w.last_beat:.0f} s", False))
        return due

    # ------------------------------------------------------------------ estimates

    def _trim(self, w: Worker, now: float) -> None:
        while w.samples and w.samples[0][0] < now - self.window_s:
            w.samples.popleft()

    def mu_i(self, name: str, now: float) -> float:
        """mu_i(t): delivered rollouts per second over the window since the worker's state began; the
        prior until at least half a window of heartbeats spans the measurement."""
        w = self.get(name)
        self._trim(w, now)
        s = w.samples  # all inside the window and since the state began (cleared on every change)
        if self.measured(w):
            if s[0][1] is not None and s[-1][1] is not None:
                if s[0][3] is not None and s[-1][3] is not None:
                    busy = s[-1][3] - s[0][3]
                    if busy >= self.window_s / 2 or (busy > 0 and w.last_mu is None):
                        w.last_mu = max(0.0, (s[-1][1] - s[0][1]) / busy)
                    return w.last_mu if w.last_mu is not None else w.mu_prior
                w.last_mu = max(0.0, (s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0]))
                return w.last_mu
            rates = [r for _, _, r, _ in s if r is not None]
            if rates:
                w.last_mu = max(0.0, sum(rates) / len(rates))
                return w.last_mu
        return w.mu_prior

    def measured(self, w: Worker) -> bool:
        """Whether heartbeats spanning at least half a window measure mu_i of `w` (else: its prior)."""
        s = w.samples
        return len(s) >= 2 and s[-1][0] - s[0][0] >= self.window_s / 2

    def a_i(self, name: str, now: float) -> float:
        """a_i(t): heartbeats received over those expected in the window, counted from the first
        heartbeat of the current state (1.0 for a worker too new to judge, 0.0 for a failed or a pending
        one: a launching machine is not capacity yet; one that never reports is failed after
        boot_timeout_s)."""
        w = self.get(name)
        if w.state == FAILED or (w.state == ACTIVE and w.launched_at is not None):
            return 0.0
        if w.first_beat is None:
            return 1.0
        span = min(self.window_s, now - w.first_beat)
        if span < 2 * self.heartbeat_s:
            return 1.0
        self._trim(w, now)
        return min(1.0, len(w.samples) / (span / self.heartbeat_s + 1))

    def rho_i(self, name: str, now: float) -> float:
        """rho_i = c_i / mu_i (inf at mu_i = 0); an inactive worker ranks by its last measured mu_i."""
        w = self.get(name)
        mu = w.last_mu if w.state != ACTIVE and w.last_mu else self.mu_i(name, now)
        return w.price_per_hour / mu if mu > 0 else math.inf

    def contribution(self, name: str, now: float) -> float:
        """a_i(t) * mu_i(t) of one worker."""
        return self.a_i(name, now) * self.mu_i(name, now)

    def mu_pool(self, now: float) -> float:
        """mu_pool(t) = sum over active workers of a_i(t) * mu_i(t) (paper eq. (4)); pending ones are
        not in it."""
        return sum(self.contribution(n, now) for n in self.active())

    def mu_pending(self, now: float) -> float:
        """The capacity on its way: the sum of the pending workers' priors mu_i."""
        return sum(self.workers[n].mu_prior for n in self.pending())

    def cost_per_hour(self) -> float:
        """sum of c_i over active and pending workers (a machine is billed from its activation)."""
        return sum(self.workers[n].price_per_hour for n in self.activated())
