"""The live control loop: a :class:`~echo2sdk.core.scheduler.Scheduler` run against a coordinator.

The scheduler (pure, in core) decides; this loop feeds it the coordinator's worker table every period
and carries out its decisions through the coordinator (wake / idle a registered worker) and a machine
provider (start / stop a machine, :mod:`echo2sdk.runtime.providers`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from echo2sdk.core.scheduler import ACTIVE, FAILED, Action, Scheduler
from echo2sdk.errors import CapacityError
from echo2sdk.runtime.providers import Provider

__all__ = ["LiveLoop", "WorkerRow", "WorkerTable"]

log = logging.getLogger("echo2sdk.scheduler")


class WorkerRow(Protocol):
    """What the loop reads of one registered worker (the coordinator's ``WorkerInfo``)."""

    alive: bool
    active: bool
    trajectories: int  # cumulative accepted trajectories: mu_i is measured end to end
    price_per_hour: float


class WorkerTable(Protocol):
    """What the loop uses of the coordinator."""

    @property
    def workers(self) -> Mapping[str, WorkerRow]: ...

    def set_active(self, worker_id: str, active: bool) -> None: ...


class LiveLoop:
    """Runs a :class:`Scheduler` against a live coordinator on a thread (the trainer's live loop).

    Every ``period_s`` it reads the coordinator's worker table (``workers``: id -> info with
    ``alive``, ``active``, ``trajectories``, ``price_per_hour``), feeds heartbeats of active workers to
    the scheduler (cumulative accepted trajectories: mu_i is the end-to-end rate), reports dropped ones
    as failed, registers newcomers as standby, and applies the decisions: an activation wakes a
    registered idle worker (``coordinator.set_active(id, True)``) or asks the provider to start the
    machine; a release makes the worker idle (``set_active(id, False)``: it stays registered) and,
    with ``stop_released``, stops its machine. A failed worker's replacement is activated at once; its own
    machine is stopped ``stop_failed_after_s`` later unless it re-joined meanwhile (then it waits on
    standby; 0: stop at once). Decisions and status go to ``on_event`` (a callable
    taking a dict), e.g. a JSONL writer. Clock: ``time.monotonic``.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        coordinator: WorkerTable,
        provider: Provider | None = None,
        *,
        period_s: float = 1.0,
        prices: dict[str, float] | None = None,
        stop_released: bool = False,
        stop_failed_after_s: float = 0.0,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        remeasure: Callable[[], dict[str, Any] | None] | None = None,
    ) -> None:
        self.stop_failed_after_s = stop_failed_after_s
        self._stop_due: dict[str, float] = {}  # failed worker -> when its machine is stopped unless it re-joined

        self.remeasure = remeasure  # () -> dict(T_train=..., T_bcast=..., R=..., kappa=...) or None
        self.s, self.coord, self.provider = scheduler, coordinator, provider
        self.period_s, self.prices, self.stop_released = period_s, dict(prices or {}), stop_released
        self.on_event = on_event
        self.events: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._ticks = 0

    def _emit(self, event: dict) -> None:
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="echo2-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.tick(time.monotonic())
            except Exception:  # noqa: BLE001 - the control loop must not take the run down
                log.exception("scheduler tick failed")

    def tick(self, now: float) -> list[Action]:
        """One control step against the coordinator (public for tests)."""
        with self._lock:
            s = self.s
            mean_mu = [w.last_mu or w.mu_prior for w in s.workers.values()]
            prior = sum(mean_mu) / len(mean_mu) if mean_mu else 1.0
            actions: list[Action] = []
            for wid, info in list(self.coord.workers.items()):
                if wid not in s.workers:  # joined after calibration: standby until the scheduler wants it
                    if not info.alive:
                        continue
                    price = self.prices.get(wid, float(info.price_per_hour or 0.0))
                    s.add_worker(wid, price, prior, now=now)
                    self.coord.set_active(wid, False)
                    self._emit({"t": now, "event": "joined", "worker": wid, "price_per_hour": price})
                    continue
                w = s.workers[wid]
                if not info.alive:
                    if w.state != FAILED:
                        a = s.mark_failed(wid, now, "dropped by the coordinator")
                        if a is not None:
                            actions.append(a)
                    continue
                if w.state == FAILED:  # the same id joined again
                    s.mark_standby(wid, now)
                    self.coord.set_active(wid, False)
                    if self._stop_due.pop(wid, None) is not None:
                        self._emit({"t": now, "event": "rejoined", "worker": wid})
                elif w.state == ACTIVE:
                    if not info.active:
                        self.coord.set_active(wid, True)  # activated before it had joined
                    # effective throughput: trajectories the coordinator accepted from it (end to end)
                    s.heartbeat(wid, now, rollouts=float(info.trajectories))
                elif info.active:
                    self.coord.set_active(wid, False)
            actions += self._launch_failures(now)
            actions += s.step(now)
            for a in actions:
                self._apply(a)
            for wid, due in list(self._stop_due.items()):
                if now >= due:  # failed and not back within stop_failed_after_s
                    del self._stop_due[wid]
                    self.provider.stop(wid)  # type: ignore[union-attr]  # only scheduled with a provider
                    self._emit({"t": now, "event": "stopped", "worker": wid, "reason": "failed, did not re-join"})
            self._ticks += 1
            if self._ticks % 10 == 0:
                self._emit({"t": now, "event": "status", "mu_pool": s.mu_pool(now), "mu_target": s.mu_target,
                            "mu": {n: s.mu_i(n, now) for n in s.active()}, "active": s.active(),
                            "delivered": {w: i.trajectories for w, i in self.coord.workers.items()}})
            if s.recalibration_due and self.remeasure is not None:  # §4.3: re-measure after a big pool change
                numbers = self.remeasure()
                if numbers:
                    try:
                        target = s.calibrate(**numbers)
                        self._emit({"t": now, "event": "recalibrated", **numbers, "mu_target": target})
                    except CapacityError as e:
                        self._emit({"t": now, "event": "recalibration_failed", "error": str(e)})
            return actions

    def _launch_failures(self, now: float) -> list[Action]:
        """Launches the provider reports failed (optional ``failures()``): each a failed worker for the scheduler,
        which activates the next-cheapest machine type in its place."""
        failures = getattr(self.provider, "failures", None)
        out = []
        for wid, reason in (failures() if failures is not None else {}).items():
            if wid not in self.s.workers:
                continue
            self._emit({"t": now, "event": "launch_failed", "worker": wid, "reason": reason})
            a = self.s.mark_launch_failed(wid, now, reason)
            if a is not None:
                out.append(a)
        return out

    def apply(self, actions: Iterable[Action]) -> None:
        """Carry out decisions taken outside tick() (the initial provisioning)."""
        with self._lock:
            for a in actions:
                self._apply(a)

    def _apply(self, a: Action) -> None:
        registered = self.coord.workers.get(a.worker)
        if a.kind == "activate":
            if registered is not None and registered.alive:
                self.coord.set_active(a.worker, True)
                self.s.mark_active(a.worker, a.at)  # woken, not launched: capacity now, and no lead-time sample
            elif self.provider is not None:
                try:
                    self.provider.start(a.worker, self.s.workers[a.worker].price_per_hour)
                except Exception as e:  # noqa: BLE001 - a launch that cannot even begin is a failed launch
                    log.error("cannot launch %s: %s", a.worker, e)
                    failed = self.s.mark_launch_failed(a.worker, a.at, f"launch refused: {e}")
                    if failed is not None:
                        self._emit({"t": a.at, "event": "launch_failed", "worker": a.worker, "reason": failed.reason})
        elif a.kind == "release":
            self.coord.set_active(a.worker, False)
            if self.stop_released and self.provider is not None:
                self.provider.stop(a.worker)
        elif a.kind == "failed" and self.provider is not None:
            if self.stop_failed_after_s > 0:  # it may re-join (workers re-dial): stop it later if it does not
                self._stop_due[a.worker] = a.at + self.stop_failed_after_s
            else:
                self.provider.stop(a.worker)
        self._emit({"t": a.at, "event": a.kind, "worker": a.worker, "reason": a.reason})
