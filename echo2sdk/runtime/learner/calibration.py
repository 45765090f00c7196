"""Cost-aware provisioning as the run applies it (paper §4.3, §5.1): the warm-up measurements (`Calibration`:
T_train, T_bcast, mu_i), the provisioning decision (`decide`), and the closed loop that keeps the pool near
mu_target during the run (`Provisioning`: the core Scheduler driven by a LiveLoop over a machine provider)."""

from __future__ import annotations

import logging
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from echo2sdk.config import Config
from echo2sdk.core import capacity
from echo2sdk.core.verdict import filtered_share
from echo2sdk.errors import CapacityError, Echo2Error
from echo2sdk.runtime.learner.batches import Batches
from echo2sdk.runtime.learner.build import worker_allowances
from echo2sdk.runtime.learner.console import event_log
from echo2sdk.runtime.learner.metrics import RunMetrics
from echo2sdk.runtime.learner.publication import Publication

__all__ = ["decide", "Calibration", "Provisioning"]

log = logging.getLogger("echo2sdk.learner")


def decide(
    measured: dict[str, Any], prices: dict[str, float], *, R: int, S: int, kappa: int, gamma: float, solver: str = "exact"
) -> dict[str, Any]:
    """The provisioning plan for what warm-up calibration measured (T_train, T_bcast, mu per worker) at
    these prices: `measured` plus prices, the plan and its text ("decision")."""
    from echo2sdk.plan import CatalogEntry, format_plan, make_plan

    catalog = [CatalogEntry(wid, prices[wid], m) for wid, m in sorted(measured["mu"].items())]
    f = measured.get("filter_rate", 0.0)
    plan = make_plan(catalog, T_train=measured["T_train"], R=R, S=S, kappa=kappa, gamma=gamma, T_bcast=measured["T_bcast"],
                     solver=solver, filter_rate=f, filter_rate_source="measured during warm-up")
    return {**measured, "prices": prices, "plan": plan.to_dict(), "decision": format_plan(plan)}


class Calibration:
    """The warm-up measurements:

    - the calibration batch: the first R trajectories the pool delivers (consumed here);
    - mu_i: each worker's end-to-end throughput (trajectories accepted per second) while the learner
      runs the offline steps and the publication below (its own generation rate if it delivered none);
    - T_train: median of `steps` offline learner steps on that batch: real forward, backward and
      optimizer steps at learning rate 0, the optimizer state restored after, so the policy is unchanged;
    - T_bcast: one real publication of the unchanged policy as the next version (1; after a resume, one
      above the resumed version: a new number for the same weights), timed to its installation on
      q = 1/gamma of the workers."""

    def __init__(self, coordinator: Any, batches: Batches, learner: Any, publication: Publication, *,
                 workers: int, logs: Path):
        self.coordinator, self.batches, self.learner, self.publication = coordinator, batches, learner, publication
        self.workers, self.logs = workers, logs

    def measure(self, k: int, steps: int = 5, join_timeout_s: float = 120.0) -> tuple[dict[str, Any], dict[str, Any]]:
        """T_train, its `steps` samples, T_bcast, mu per worker and the filter rate (the share of the groups completed
        so far that dynamic sampling dropped: the pool is sized on useful rollouts); and the state published to time
        T_bcast."""
        self.batches.wait(k, whole=True)  # T_train of a full batch, whatever learner.max_wait_s says
        groups = self.batches.buffer.sample(k)
        own = self._await_own_rates(join_timeout_s)
        t_a, got_a = time.monotonic(), {w.worker_id: w.trajectories for w in self.coordinator.alive_workers()}
        with self.learner.offline():  # learning rate 0; the optimizer state and the schedule restored after
            times = [self.learner.step(groups).t_train_s for _ in range(steps)]
        t_bcast, state = self._time_publication(join_timeout_s)
        mu = self._delivered_rates(time.monotonic() - t_a, got_a, own)
        return {"T_train": statistics.median(times), "T_train_steps": times, "T_bcast": t_bcast, "mu": mu,
                "filter_rate": filtered_share(self.batches.buffer.stats())}, state

    def _await_own_rates(self, timeout_s: float) -> dict[str, float]:
        """Wait until every joined worker has measured itself once; their own generation rates."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            alive = self.coordinator.alive_workers()
            if alive and all(w.rollouts_per_s > 0 for w in alive) and len(alive) >= self.workers:
                break
            time.sleep(0.2)
        return {w.worker_id: w.rollouts_per_s for w in self.coordinator.alive_workers() if w.rollouts_per_s > 0}

    def _time_publication(self, timeout_s: float) -> tuple[float, dict[str, Any]]:
        """T_bcast: publish the unchanged policy as the next version and wait for its installation time."""
        pub = self.publication
        pub.advance()  # the unchanged policy, published once to time the real path
        state = pub.publish_now()
        t_bcast = None
        deadline = time.monotonic() + timeout_s
        while t_bcast is None and time.monotonic() < deadline:
            time.sleep(0.1)
            t_bcast = pub.bcast_times(pub.version).installed
        if t_bcast is None:
            raise Echo2Error(f"T_bcast calibration: snapshot v{pub.version} not installed within {timeout_s:g} s")
        return t_bcast, state

    def _delivered_rates(self, span: float, got_a: dict[str, int], own: dict[str, float]) -> dict[str, float]:
        """mu_i end to end, while the learner trained and published (accepted trajectories per second);
        a worker that delivered nothing in that span keeps its own generation-rate estimate."""
        mu = {}
        for w in self.coordinator.alive_workers():
            delivered = w.trajectories - got_a.get(w.worker_id, w.trajectories)
            rate = delivered / span if delivered > 0 else own.get(w.worker_id, 0.0)
            if rate > 0:
                mu[w.worker_id] = rate
        if not mu:
            raise Echo2Error(f"calibration: no worker delivered trajectories in {span:.0f} s; see {self.logs}")
        return mu

    def prices(self, configured: dict[str, float]) -> dict[str, float]:
        """Each joined worker's price per hour: scheduler.prices first, then what the worker announced."""
        return {w.worker_id: configured.get(w.worker_id, w.price_per_hour) for w in self.coordinator.alive_workers()}


class Provisioning:
    """With scheduler.enabled: the cheapest workers reaching mu_target stay active, the others idle, and a LiveLoop
    keeps mu_pool near the target during the run (standby machines through scheduler.provider). `stop` ends it."""

    def __init__(self, cfg: Config, coordinator: Any, metrics: RunMetrics, out: Path):
        self.cfg, self.coordinator, self.metrics, self.out = cfg, coordinator, metrics, out
        self.loop: Any = None
        self.provider: Any = None
        self.initial: list[str] = []  # machines launched before warm-up
        self.warmup_failed: dict[str, str] = {}  # warm-up launches that failed: name -> reason
        self._watching = threading.Event()
        self._watcher: threading.Thread | None = None
        self._events: Any = None

    def start(self, cal: dict[str, Any]) -> None:
        """Provision from the calibration `cal` (decide's output) and start the live loop."""
        from echo2sdk.runtime.learner.live_loop import LiveLoop

        cfg, sc = self.cfg, self.cfg.scheduler
        self._stop_watching()  # the live loop reads the provider's failures from now on
        now = time.monotonic()
        sched = self._scheduler()
        prior = statistics.fmean(list(cal["mu"].values()) or [1.0])
        alive = {w.worker_id for w in self.coordinator.alive_workers()}
        for name in self.initial:
            if name not in alive:  # a warm-up machine that never joined bills for nothing: the scheduler relaunches
                log.warning("warm-up machine %s did not join before warm-up ended: stopping it", name)
                self.provider.stop(name)
        kinds = {w: m.name for m in cfg.scheduler.machines for w in m.workers()}
        for w in self.coordinator.alive_workers():
            sched.add_worker(w.worker_id, cal["prices"][w.worker_id], cal["mu"].get(w.worker_id, prior), now=now,
                             kind=kinds.get(w.worker_id))
        self.provider = self._standby(sched, prior, now)
        for name, reason in self.warmup_failed.items():  # its machine type backs off, as in the live loop
            if name in sched.workers:
                sched.mark_launch_failed(name, now, reason)
        try:
            sched.calibrate(T_train=cal["T_train"], T_bcast=cal["T_bcast"], kappa=cfg.kappa,
                            R=capacity.raw_rate(cfg.learner.trajectories_per_step, cal.get("filter_rate", 0.0)))
        except CapacityError as e:
            log.warning("scheduler off: %s; every worker stays active", e)
            return
        decided = sched.provision(now)
        chosen = {a.worker for a in decided}
        self.coordinator.join_idle()  # later joiners idle until the scheduler wants them
        for w in self.coordinator.alive_workers():
            self.coordinator.set_active(w.worker_id, w.worker_id in chosen)
        self._events, write = event_log(self.out / "scheduler.jsonl")
        for name, reason in self.warmup_failed.items():
            write({"t": now, "event": "launch_failed", "worker": name, "reason": reason, "during": "warm-up"})
        write({"t": now, "event": "provisioned", "mu_target": sched.mu_target, "active": sorted(chosen),
               "standby": sched.standby()})
        self.loop = LiveLoop(sched, self.coordinator, self.provider, period_s=cfg.run.heartbeat_s,
                             prices=dict(sc.prices), stop_released=sc.stop_released,
                             stop_failed_after_s=sc.stop_failed_after_s, on_event=write,
                             remeasure=self.metrics.remeasure)
        self.loop.apply(decided)  # starts chosen machines that are not up yet
        self.loop.start()

    def _scheduler(self) -> Any:
        from echo2sdk.core.scheduler import Scheduler

        cfg, sc = self.cfg, self.cfg.scheduler
        return Scheduler(gamma=sc.gamma, window_s=sc.window_s, heartbeat_s=cfg.run.heartbeat_s,
                         sustain_s=sc.sustain_s, release_margin=sc.release_margin,
                         fail_after_s=cfg.run.worker_timeout_s, solver=cfg.provisioning.solver,
                         boot_timeout_s=sc.boot_timeout_s, launch_backoff_s=sc.launch_backoff_s,
                         lead_prior_s=sc.lead_prior_s, preempt_per_hour=sc.preempt_per_hour, anticipate=sc.anticipate)

    def _standby(self, sched: Any, prior: float, now: float) -> Any:
        """With scheduler.standby or scheduler.machines: the machine provider, and the machines it may start
        registered with the scheduler as standby (a machine type's at its mu, else at the mean measured mu,
        `prior`). None otherwise."""
        sc = self.cfg.scheduler
        if not sc.standby and not sc.machines:
            return self.provider
        provider = self.provider or make_provider(self.cfg, self.coordinator, self.out)
        for i in range(sc.standby):
            sched.add_worker(f"standby-{i}", sc.standby_price, prior, now=now)
        for m in sc.machines:
            for name in m.workers():
                if name not in sched.workers:  # an initial machine that joined is registered with its measured mu
                    sched.add_worker(name, m.price_per_hour, m.mu or prior, now=now, kind=m.name)
        return provider

    def launch_initial(self) -> list[str]:
        """Before warm-up: launch scheduler.initial_machines of scheduler.machines, cheapest rho = price / mu first
        (the pool a run without local workers calibrates on). Returns their names."""
        sc = self.cfg.scheduler
        if not (sc.enabled and sc.initial_machines):
            return []
        ranked = sorted((m.price_per_hour / m.mu, w, m.price_per_hour)  # type: ignore[operator]
                        for m in sc.machines for w in m.workers())  # config checked: every mu given
        self.provider = make_provider(self.cfg, self.coordinator, self.out)
        for _, name, price in ranked[: sc.initial_machines]:
            self.provider.start(name, price)
            self.initial.append(name)
        log.info("launched %d machine(s) for warm-up: %s", len(self.initial), self.initial)
        if callable(getattr(self.provider, "failures", None)):
            self._watcher = threading.Thread(target=self._replace_failed, args=(ranked,), daemon=True,
                                             name="echo2-warmup-launches")
            self._watcher.start()
        return list(self.initial)

    def _replace_failed(self, ranked: list[tuple[float, str, float]]) -> None:
        """During warm-up (the live loop is not running yet): a failed launch is replaced by the cheapest machine
        not tried yet of another type (of any type once every type failed), so the warm-up gets its pool."""
        kind = {w: m.name for m in self.cfg.scheduler.machines for w in m.workers()}
        tried, failed_kinds = set(self.initial), set()
        while not self._watching.wait(1.0):
            for name, reason in self.provider.failures().items():
                self.warmup_failed[name] = reason
                failed_kinds.add(kind.get(name, name))
                untried = [(n, p) for _, n, p in ranked if n not in tried]
                pick = next(((n, p) for n, p in untried if kind[n] not in failed_kinds), None) or next(iter(untried), None)
                if pick is None:
                    log.error("warm-up machine %s failed (%s); no machine left to try", name, reason)
                    continue
                log.warning("warm-up machine %s failed (%s); launching %s instead", name, reason, pick[0])
                tried.add(pick[0])
                self.provider.start(*pick)
                self.initial.append(pick[0])

    def _stop_watching(self) -> None:
        self._watching.set()
        if self._watcher is not None:
            self._watcher.join(5)
            self._watcher = None

    def stop(self) -> None:
        """Stop the live loop, the standby machines and the event file (a no-op when never started)."""
        self._stop_watching()
        if self.loop is not None:
            self.loop.stop()
            self.loop = None
        if self.provider is not None:
            self.provider.close()
            self.provider = None
        if self._events is not None:
            self._events.close()
            self._events = None


def run_options(cfg: Config, coordinator: Any, out: Path) -> dict[str, Any]:
    """What a provider may take from the run (load_provider passes those its factory names): where workers
    connect, the token, the run folder (its ledger), the local workers' settings, the machine types."""
    c = coordinator
    return {"connect": f"{c.host}:{c.port}", "token": c.token, "run_dir": str(out), "log_dir": str(out / "workers"),
            "threads": cfg.rollout.threads, "nice": cfg.rollout.nice, "allow": worker_allowances(cfg, c),
            "plaintext": not cfg.run.tls, "machines": {m.name: m.resources for m in cfg.scheduler.machines}}


def make_provider(cfg: Config, coordinator: Any, out: Path) -> Any:
    """The run's machine provider (scheduler.provider with scheduler.provider_options over run_options)."""
    from echo2sdk.runtime.providers import load_provider

    return load_provider(cfg.scheduler.provider, run=run_options(cfg, coordinator, out), **cfg.scheduler.provider_options)
