"""A simulated run's accounting as it goes: the workers' bills, the learner's busy and idle time, and the logs
that SimResult reports."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from echo2sdk.sim.workers import WorkerState

__all__ = ["Ledger"]


@dataclass
class Ledger:
    """Costs in $, times in virtual seconds."""

    cost_workers: float = 0.0  # billed to workers (a running bill is added when it stops)
    cost_at_first_step: float = 0.0  # everything billed when the first step began (the first fill)
    wait_since: float | None = 0.0  # when the learner began waiting for a batch (None: it is training)
    first_fill: float = 0.0  # T_idle before the first step
    idle: float = 0.0  # T_idle after it
    busy_time: float = 0.0  # T_train,active: the steps' times summed
    step_times: list[float] = field(default_factory=list)
    step_log: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of every learner step
    delivered_log: list[tuple[float, int]] = field(default_factory=list)  # (time, admitted rollouts)
    ready_log: list[tuple[float, str]] = field(default_factory=list)  # (time, worker) a (re)activated worker starts generating
    machines_seen: list[int] = field(default_factory=list)  # machines up or booting, at every heartbeat
    actions: list[dict[str, Any]] = field(default_factory=list)  # the scheduler's, as applied
    timeline: list[tuple[float, float, float]] = field(default_factory=list)  # (t, mu_pool seen, true rate)
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    groups_filtered: int = 0  # completed groups dropped for zero reward variance (SimConfig.filter_rate_after)

    def bill_start(self, w: WorkerState, now: float) -> None:
        if w.billed_since is None:
            w.billed_since = now

    def bill_stop(self, w: WorkerState, now: float) -> None:
        if w.billed_since is not None:
            self.cost_workers += w.spec.price_per_hour * (now - w.billed_since) / 3600
            w.billed_since = None

    def batch_ready(self, now: float, first: bool, workers: Iterable[WorkerState], learner_price_per_hour: float) -> None:
        """The learner's batch is ready at `now`: the wait since `wait_since` is the first fill (`first`: before
        the first step, when the bills are settled so that steady-state cost counts from here) or idle time."""
        if self.wait_since is None:
            return
        waited = now - self.wait_since
        if first:
            self.first_fill = waited
            for w in workers:  # settle the bills: steady-state cost counts from here
                if w.billed_since is not None:
                    self.bill_stop(w, now)
                    self.bill_start(w, now)
            self.cost_at_first_step = self.cost_workers + learner_price_per_hour * now / 3600
        else:
            self.idle += waited
        self.wait_since = None

    def step_began(self, now: float, dt: float) -> None:
        """A learner step of `dt` seconds began at `now`."""
        self.busy_time += dt
        self.step_times.append(dt)
        self.step_log.append((now, now + dt))
