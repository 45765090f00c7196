"""The run recipe: setup -> run -> save -> cleanup. Ties the learning plane (Learner), the buffer and the
coordinator together, and starts local rollout-worker processes.

Algorithm 1 of the paper, learner side: wait until R admissible trajectories (v >= v_t - S) are in the
buffer, update, advance v_t, publish a snapshot every kappa updates; rollout, dissemination and
training overlap because workers keep generating under their installed version meanwhile.

The configuration stays out of the classes: the builders below (`learner_args`, `buffer_args`,
`worker_config`, `coordinator_args`, `worker_command`) turn a `Config` into the flat arguments each part
takes, and `metrics_row` assembles one line of metrics.jsonl.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import statistics
import subprocess
import sys
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from echo2sdk.config import Config
from echo2sdk.core import capacity
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.runtime.coordinator import Coordinator
from echo2sdk.runtime.delivery import DirectPush
from echo2sdk.core.contracts import TaskAdapter
from echo2sdk.errors import CapacityError, Echo2Error

if TYPE_CHECKING:
    from echo2sdk.core.learner import StepStats

__all__ = ["Trainer"]

log = logging.getLogger("echo2sdk.trainer")


# -- builders: Config -> flat arguments ----------------------------------------------------------------
def learner_args(cfg: Config) -> dict[str, Any]:
    """Keyword arguments of `Learner(model_path, **learner_args(cfg))`."""
    L = cfg.learner
    return dict(
        lr=L.lr,
        beta=L.beta,
        clip_eps=L.clip_eps,
        is_cap=L.is_cap,
        adv_eps=L.adv_eps,
        grad_clip=L.grad_clip,
        micro_batch=L.micro_batch,
        precision=L.precision,
        temperature=cfg.rollout.temperature,
        weight_decay=L.weight_decay,
        reference=cfg.model.reference,
        threads=L.threads,
        seed=cfg.run.seed,
    )


def buffer_args(cfg: Config) -> dict[str, Any]:
    """Keyword arguments of `StalenessBuffer(**buffer_args(cfg))`: S, the group size n and the order."""
    return dict(staleness=cfg.learner.staleness, group_size=cfg.rollout.group_size, order=cfg.learner.order)


def worker_config(cfg: Config, model_path: str) -> dict[str, Any]:
    """What the coordinator hands every worker that joins: model, task, backend and sampling."""
    ro = cfg.rollout
    return {
        "model": cfg.model.policy,
        "model_path": model_path,
        "adapter": cfg.task.adapter,
        "adapter_options": cfg.task.options,
        "backend": ro.backend,
        "backend_options": ro.backend_options,
        "group_size": ro.group_size,
        "tasks_per_request": ro.tasks_per_request,
        "sampling": {"max_new_tokens": ro.max_new_tokens, "temperature": ro.temperature, "top_p": ro.top_p},
        "max_len": cfg.learner.max_len,
    }


def coordinator_args(cfg: Config, token: str) -> dict[str, Any]:
    """The Coordinator's address, liveness and delivery arguments (setup adds buffer, tasks and the model's
    facts)."""
    run = cfg.run
    return dict(
        max_len=cfg.learner.max_len,
        token=token,
        host=run.host,
        port=run.port,
        heartbeat_s=run.heartbeat_s,
        worker_timeout_s=run.worker_timeout_s,
        delivery=_delivery(cfg, token),
    )


def worker_command(host: str, port: int, worker_id: str, nice: int) -> list[str]:
    """The command line of one local rollout worker (the token travels in its environment: ps shows argv)."""
    cmd = [sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"{host}:{port}", "--id", worker_id]
    return cmd + ["--nice", str(nice)]


def worker_env(token: str, threads: int) -> dict[str, str]:
    """The environment of a local rollout worker: the token and its thread counts."""
    env = dict(os.environ, ECHO2_TOKEN=token)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    return env


# -- one step's metrics --------------------------------------------------------------------------------
def metrics_row(
    step: int,
    version: int,
    records: list,
    deltas: list[int],
    st: StepStats,
    *,
    time_s: float,
    wall_s: float,
    wait_s: float,
    publish_s: float,
    t_bcast: tuple[float | None, float | None],
    rejected: int,
    evicted: int,
    workers_alive: int,
    broadcast_repairs: int,
) -> dict[str, Any]:
    """One line of metrics.jsonl: the update's timings (seconds), the batch's rewards and staleness
    (Delta = v_t - v), the learner's StepStats `st`, and the pool's counters at the end of the step."""
    rewards = [t.reward for t in records]
    correct = [t.meta.extra.get("correct") for t in records]
    t_q, t_all = t_bcast
    return {
        "step": step,
        "version": version,
        "time_s": round(time_s, 3),
        "t_train_s": round(st.t_train_s, 4),
        "t_forward_s": round(st.t_forward_s, 4),
        "t_backward_s": round(st.t_backward_s, 4),
        "t_optim_s": round(st.t_optim_s, 4),
        "t_publish_s": round(publish_s, 4),
        "t_step_wall_s": round(wall_s, 4),
        "learner_wait_s": round(wait_s, 4),
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "accuracy": statistics.fmean(bool(c) for c in correct) if correct else None,
        "staleness_max": max(deltas),
        "staleness_mean": statistics.fmean(deltas),
        "trajectories": len(records),
        "tokens": st.tokens,
        "rejected": rejected,
        "evicted": evicted,
        "loss": st.loss,
        "kl": st.kl,
        "clip_frac": st.clip_frac,
        "is_weight_mean": st.is_weight_mean,
        "is_truncated_frac": st.is_truncated_frac,
        "grad_norm": st.grad_norm,
        "task": _extra_means(records),
        "workers_alive": workers_alive,
        "t_bcast_s": t_q,
        "t_bcast_all_s": t_all,
        "broadcast_repairs": broadcast_repairs,
    }


# -- the provisioning decision (paper §4.3) -------------------------------------------------------------
def decide(
    measured: dict[str, Any], prices: dict[str, float], *, R: int, S: int, kappa: int, gamma: float, solver: str = "exact"
) -> dict[str, Any]:
    """The provisioning plan for what warm-up calibration measured (T_train, T_bcast, mu per worker) at
    these prices: `measured` plus prices, the plan and its text ("decision")."""
    from echo2sdk.plan import CatalogEntry, format_plan, make_plan

    catalog = [CatalogEntry(wid, prices[wid], m) for wid, m in sorted(measured["mu"].items())]
    plan = make_plan(catalog, T_train=measured["T_train"], R=R, S=S, kappa=kappa, gamma=gamma, T_bcast=measured["T_bcast"],
                     solver=solver)
    return {**measured, "prices": prices, "plan": plan.to_dict(), "decision": format_plan(plan)}


class Trainer:
    """The recipe: `setup` (learner, buffer, coordinator, local workers), `run` (learner.steps updates,
    then `save` and summary.json), `close` (cleanup). `calibrate` is the optional warm-up between setup
    and run."""

    def __init__(self, cfg: Config, adapter: TaskAdapter | None = None):
        self.cfg = cfg
        self.out = Path(cfg.run.out)
        self._adapter = adapter
        self.procs: list[subprocess.Popen] = []
        self.coordinator: Coordinator | None = None
        self.learner = None
        self.version = 0  # v_t
        self.rows: list[dict[str, Any]] = []
        self.last_batch: list = []
        self._published: list[int] = []  # versions published, oldest first
        self._ready = False

    # -- setup -------------------------------------------------------------------------------------
    def setup(self) -> None:
        if self._ready:
            return
        from echo2sdk.core.learner import Learner
        from echo2sdk.weights import resolve_model
        from echo2sdk.plugins import load_adapter

        cfg, L = self.cfg, self.cfg.learner
        self.out.mkdir(parents=True, exist_ok=True)
        _log_to(self.out / "run.log")
        self.model_path = resolve_model(cfg.model.policy)
        adapter = self._adapter or load_adapter(cfg.task.adapter, cfg.task.options)
        self.learner = Learner(self.model_path, **learner_args(cfg))
        self.buffer = StalenessBuffer(**buffer_args(cfg))
        token = cfg.run.token or os.environ.get("ECHO2_TOKEN") or secrets.token_urlsafe(24)
        self.coordinator = Coordinator(
            buffer=self.buffer,
            tasks=adapter.tasks(cfg.run.seed),
            worker_config=worker_config(cfg, self.model_path),
            vocab_size=self.learner.vocab_size,
            **coordinator_args(cfg, token),
        )
        host, port = self.coordinator.start()
        log.info("coordinator on %s:%d (R=%d, S=%d, kappa=%d); learner %s (precision=%s)", host, port,
                 L.trajectories_per_step, L.staleness, cfg.kappa, "bf16 autocast" if self.learner.autocast else "fp32",
                 L.precision)
        self._start_local_workers(host, port)
        self._ready = True

    def _start_local_workers(self, host: str, port: int) -> None:
        ro = self.cfg.rollout
        logs = self.out / "workers"
        logs.mkdir(exist_ok=True)
        env = worker_env(self.coordinator.token, ro.threads)
        for i in range(ro.workers):
            with open(logs / f"local-{i}.log", "w") as fh:
                cmd = worker_command(host, port, f"local-{i}", ro.nice)
                self.procs.append(subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT))

    # -- run ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """setup, learner.steps updates (one metrics.jsonl row each), save, summary.json; returns the summary."""
        self.setup()
        steps = self.cfg.learner.steps
        with (
            open(self.out / "metrics.jsonl", "w") as metrics,
            _progress(steps, self.cfg.run.progress) as bar,
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo2-publish") as publisher,
        ):
            t_start = time.perf_counter()
            for step in range(1, steps + 1):
                self._record(self.train_step(step, publisher, t_start), metrics, bar)
        self.save()
        summary = self.summary(time.perf_counter() - t_start)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def train_step(self, step: int, publisher: Executor, t_start: float) -> dict[str, Any]:
        """One update: wait for k = R/n admissible groups, step the learner, advance v_t, publish every
        kappa updates. Returns the step's metrics row."""
        k = self._groups_per_step()
        t_wait = self._wait_for_groups(k)
        t0 = time.perf_counter()
        groups = self.last_batch = self.buffer.sample(k)
        records = [t for g in groups for t in g]
        deltas = [self.version - t.version for t in records]  # Delta = v_t - v, <= S by admission
        st = self.learner.step(groups)
        self.version += 1
        self.buffer.set_version(self.version)
        t_pub = self._publish_if_due(publisher)
        t_bcast = self._last_bcast()
        now = time.perf_counter()
        return metrics_row(step, self.version, records, deltas, st, time_s=now - t_start, wall_s=now - t0 + t_wait,
                           wait_s=t_wait, publish_s=t_pub, t_bcast=t_bcast, **self._pool_counters())

    def _groups_per_step(self) -> int:
        return self.cfg.learner.trajectories_per_step // self.cfg.rollout.group_size  # k = R / n

    def _publish_if_due(self, publisher: Executor) -> float:
        """Every kappa updates: copy the weights now, serialize and send them on the publisher thread.
        Returns the learner's share of the publication (t_publish_s); 0.0 between publications."""
        if self.version % self.cfg.kappa:
            return 0.0
        t0 = time.perf_counter()
        state = self.learner.snapshot_state(self.cfg.learner.snapshot_dtype)  # copy now; serialize off-thread
        publisher.submit(self._publish, self.version, state)
        self._published.append(self.version)
        return time.perf_counter() - t0

    def _pool_counters(self) -> dict[str, int]:
        return {
            "rejected": sum(self.coordinator.rejected.values()),
            "evicted": self.buffer.stats()["evicted"],
            "workers_alive": len(self.coordinator.alive_workers()),
            "broadcast_repairs": len(self.coordinator.broadcast_repairs),
        }

    def _record(self, row: dict[str, Any], metrics: IO[str], bar: Any) -> None:
        self.rows.append(row)
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", acc=f"{row['accuracy'] or 0:.2f}",
                        wait=f"{row['learner_wait_s']:.1f}s")

    def _publish(self, version: int, state: dict) -> None:
        """Runs on the publisher thread: the state is already a private, cast copy."""
        from echo2sdk.core.snapshot import serialize_state

        try:
            self.coordinator.publish(version, serialize_state(state))
        except Exception:  # noqa: BLE001 - a failed publication must be visible, not lost in a Future
            log.exception("publishing snapshot v%d failed; workers keep their current version", version)

    def _wait_for_groups(self, k: int) -> float:
        """Block until k complete admissible groups are buffered; the time spent is learner_wait_s."""
        t0 = time.perf_counter()
        last_progress = t0
        have = self.buffer.ready_groups()
        while not self.buffer.wait_for(k, timeout=1.0):
            now = time.perf_counter()
            if self.buffer.ready_groups() != have:
                have, last_progress = self.buffer.ready_groups(), now
            local_gone = bool(self.procs) and all(p.poll() is not None for p in self.procs)
            if local_gone and not self.coordinator.alive_workers() and now - last_progress > 5 * self.cfg.run.heartbeat_s:
                raise Echo2Error(f"every rollout worker has exited and none is connected; see {self.out / 'workers'}")
            if now - last_progress > self.cfg.learner.data_timeout_s:
                alive = len(self.coordinator.alive_workers())
                dead = [p.args[-1] for p in self.procs if p.poll() is not None]
                raise Echo2Error(
                    f"no admissible trajectories for {now - last_progress:.0f} s "
                    f"(learner.data_timeout_s={self.cfg.learner.data_timeout_s}); workers alive: {alive}; "
                    f"exited local workers: {dead}; see {self.out / 'workers'}"
                )
        return time.perf_counter() - t0

    def _last_bcast(self) -> tuple[float | None, float | None]:
        """T_bcast (quantile, all workers) of the newest publication that has one."""
        for v in reversed(self._published):
            t_q, t_all = self.coordinator.t_bcast(v)
            if t_q is not None:
                return t_q, t_all
        return None, None

    # -- save / summarize --------------------------------------------------------------------------
    def save(self) -> None:
        self.learner.save(str(self.out / "checkpoint"), tokenizer_from=self.model_path)

    def summary(self, wall_s: float) -> dict[str, Any]:
        rows, cfg = self.rows, self.cfg
        head, tail = rows[:5], rows[-5:]
        mean = lambda rs, key: statistics.fmean(r[key] for r in rs) if rs else None  # noqa: E731
        t_train = statistics.median(r["t_train_s"] for r in rows)
        bcasts = [r["t_bcast_s"] for r in rows if r["t_bcast_s"] is not None]
        t_bcast = statistics.median(bcasts) if bcasts else 0.0
        rates = [w.rollouts_per_s for w in self.coordinator.workers.values() if w.rollouts_per_s > 0]
        mu_pool = sum(rates)
        R, kappa = cfg.learner.trajectories_per_step, cfg.kappa
        try:
            mu_min = capacity.mu_min(t_train, t_bcast, R, kappa)
        except CapacityError as e:
            mu_min = str(e)
        wait = sum(r["learner_wait_s"] for r in rows)
        busy = sum(r["t_train_s"] for r in rows)
        return {
            "steps": len(rows),
            "wall_s": round(wall_s, 2),
            "reward_first5": mean(head, "reward_mean"),
            "reward_last5": mean(tail, "reward_mean"),
            "accuracy_first5": mean(head, "accuracy"),
            "accuracy_last5": mean(tail, "accuracy"),
            "staleness_max": max(r["staleness_max"] for r in rows),
            "S": cfg.learner.staleness,
            "kappa": kappa,
            "R": R,
            "T_train_median_s": t_train,
            "T_bcast_median_s": t_bcast,
            "mu_pool_measured": mu_pool,
            "mu_min": mu_min,
            "bubble_ratio": wait / (wait + busy) if wait + busy > 0 else 0.0,  # T_idle / (T_idle + T_train,active)
            "buffer": self.buffer.stats(),
            "coordinator": self.coordinator.stats(),
            "workers": self.coordinator.worker_table(),
            "checkpoint": str(self.out / "checkpoint"),
            "config": cfg.model_dump(),
        }

    # -- cost-aware provisioning (paper §4.3): warm-up calibration and the live scheduler loop --------
    def calibrate(self, steps: int = 5, join_timeout_s: float = 120.0) -> dict[str, Any]:
        """Warm-up measurements (paper §4.3, §5.1) and the provisioning decision.

        - the calibration batch: the first R trajectories the pool delivers (consumed here);
        - mu_i: each worker's end-to-end throughput (trajectories accepted per second) while the learner
          runs the offline steps and the publication below (its own generation rate if it delivered none);
        - T_train: median of `steps` offline learner steps on that batch: real forward, backward and
          optimizer steps at learning rate 0, the optimizer state restored after, so the policy is unchanged;
        - T_bcast: one real publication of the unchanged policy as version 1 (an update at learning rate 0),
          timed to its installation on q = 1/gamma of the workers.

        With scheduler.enabled the numbers go to a Scheduler: the cheapest-rho workers reaching mu_target
        stay active, the others are deactivated (registered, idle), and a LiveLoop keeps mu_pool near the
        target during run(). Writes DIR/calibration.json; returns the numbers and the decision text."""
        self.setup()
        if self.version != 0:
            raise Echo2Error(f"calibrate() runs before training (learner at version {self.version})")
        cfg, L, sc = self.cfg, self.cfg.learner, self.cfg.scheduler
        measured = self.measure(steps, join_timeout_s)
        out = decide(measured, self._prices(), R=L.trajectories_per_step, S=L.staleness, kappa=cfg.kappa, gamma=sc.gamma,
                     solver=cfg.provisioning.solver)
        log.info("warm-up calibration:\n%s", out["decision"])
        if sc.enabled:
            self._start_scheduler(out)
        (self.out / "calibration.json").write_text(json.dumps(out, indent=2, default=str))
        return out

    def measure(self, steps: int = 5, join_timeout_s: float = 120.0) -> dict[str, Any]:
        """The warm-up measurements of `calibrate`: T_train, its `steps` samples, T_bcast and mu per worker."""
        k = self._groups_per_step()
        self._wait_for_groups(k)
        groups = self.buffer.sample(k)
        own = self._await_own_rates(join_timeout_s)
        t_a, got_a = time.monotonic(), {w.worker_id: w.trajectories for w in self.coordinator.alive_workers()}
        times = self._time_offline_steps(groups, steps)
        t_bcast = self._time_publication(join_timeout_s)
        mu = self._delivered_rates(time.monotonic() - t_a, got_a, own)
        return {"T_train": statistics.median(times), "T_train_steps": times, "T_bcast": t_bcast, "mu": mu}

    def _await_own_rates(self, timeout_s: float) -> dict[str, float]:
        """Wait until every joined worker has measured itself once; their own generation rates."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            alive = self.coordinator.alive_workers()
            if alive and all(w.rollouts_per_s > 0 for w in alive) and len(alive) >= self.cfg.rollout.workers:
                break
            time.sleep(0.2)
        return {w.worker_id: w.rollouts_per_s for w in self.coordinator.alive_workers() if w.rollouts_per_s > 0}

    def _time_offline_steps(self, groups: list, steps: int) -> list[float]:
        """T_train samples: `steps` real updates at learning rate 0, the optimizer state restored after."""
        import copy

        opt = self.learner.opt
        saved = copy.deepcopy(opt.state_dict())
        for g in opt.param_groups:
            g["lr"] = 0.0
        try:
            return [self.learner.step(groups).t_train_s for _ in range(steps)]
        finally:
            opt.load_state_dict(saved)  # learning rates and moments as they were

    def _time_publication(self, timeout_s: float) -> float:
        """T_bcast: publish the unchanged policy as version 1 and wait for its installation time."""
        self.version = 1  # the unchanged policy, published once to time the real path
        self.buffer.set_version(self.version)
        self._publish(self.version, self.learner.snapshot_state(self.cfg.learner.snapshot_dtype))
        t_bcast = None
        deadline = time.monotonic() + timeout_s
        while t_bcast is None and time.monotonic() < deadline:
            time.sleep(0.1)
            t_bcast = self.coordinator.t_bcast(self.version)[0]
        if t_bcast is None:
            raise Echo2Error(f"T_bcast calibration: snapshot v1 not installed within {timeout_s:g} s")
        return t_bcast

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
            raise Echo2Error(f"calibration: no worker delivered trajectories in {span:.0f} s; see {self.out / 'workers'}")
        return mu

    def _prices(self) -> dict[str, float]:
        """Each joined worker's price per hour: scheduler.prices first, then what the worker announced."""
        prices = self.cfg.scheduler.prices
        return {w.worker_id: prices.get(w.worker_id, w.price_per_hour) for w in self.coordinator.alive_workers()}

    def _start_scheduler(self, cal: dict[str, Any]) -> None:
        from echo2sdk.core.scheduler import Scheduler
        from echo2sdk.runtime.live_loop import LiveLoop

        cfg, sc = self.cfg, self.cfg.scheduler
        now = time.monotonic()
        sched = Scheduler(gamma=sc.gamma, window_s=sc.window_s, heartbeat_s=cfg.run.heartbeat_s,
                          sustain_s=sc.sustain_s, release_margin=sc.release_margin,
                          fail_after_s=cfg.run.worker_timeout_s, solver=cfg.provisioning.solver)
        mus = list(cal["mu"].values()) or [1.0]
        prior = statistics.fmean(mus)
        for w in self.coordinator.alive_workers():
            sched.add_worker(w.worker_id, cal["prices"][w.worker_id], cal["mu"].get(w.worker_id, prior), now=now)
        provider = self._standby(sched, prior, now)
        try:
            sched.calibrate(T_train=cal["T_train"], T_bcast=cal["T_bcast"], R=cfg.learner.trajectories_per_step,
                            kappa=cfg.kappa)
        except CapacityError as e:
            log.warning("scheduler off: %s; every worker stays active", e)
            return
        decided = sched.provision(now)
        chosen = {a.worker for a in decided}
        self.coordinator.default_active = False  # later joiners idle until the scheduler wants them
        for w in self.coordinator.alive_workers():
            self.coordinator.set_active(w.worker_id, w.worker_id in chosen)
        events, write = _event_log(self.out / "scheduler.jsonl")
        write({"t": now, "event": "provisioned", "mu_target": sched.mu_target, "active": sorted(chosen),
               "standby": sched.standby()})
        self._provisioning = (LiveLoop(sched, self.coordinator, provider, period_s=cfg.run.heartbeat_s,
                                       prices=dict(sc.prices), stop_released=sc.stop_released,
                                       stop_failed_after_s=sc.stop_failed_after_s, on_event=write,
                                       remeasure=self._remeasure), provider, events)
        self._provisioning[0].apply(decided)  # starts chosen machines that are not up yet
        self._provisioning[0].start()

    def _standby(self, sched: Any, prior: float, now: float) -> Any:
        """With scheduler.standby: the machine provider, and its standby machines registered with the
        scheduler at the mean measured mu (`prior`). None otherwise."""
        from echo2sdk.runtime.providers import load_provider

        cfg, sc = self.cfg, self.cfg.scheduler
        if not sc.standby:
            return None
        options = {"connect": f"{self.coordinator.host}:{self.coordinator.port}", "token": self.coordinator.token,
                   "log_dir": str(self.out / "workers"), "threads": cfg.rollout.threads, "nice": cfg.rollout.nice}
        provider = load_provider(sc.provider, **(options if sc.provider == "local" else {}), **sc.provider_options)
        for i in range(sc.standby):
            sched.add_worker(f"standby-{i}", sc.standby_price, prior, now=now)
        return provider

    def _remeasure(self) -> dict[str, Any] | None:
        """T_train (median of the last 5 steps) and T_bcast (the last publication) from the run itself."""
        rows = self.rows[-5:]
        bcasts = [r["t_bcast_s"] for r in self.rows if r.get("t_bcast_s") is not None]
        if len(rows) < 5 or not bcasts:
            return None
        return {"T_train": statistics.median(r["t_train_s"] for r in rows), "T_bcast": bcasts[-1],
                "R": self.cfg.learner.trajectories_per_step, "kappa": self.cfg.kappa}

    # -- cleanup -----------------------------------------------------------------------------------
    def _stop_scheduler(self) -> None:
        prov = getattr(self, "_provisioning", None)
        if prov is None:
            return
        loop, provider, events = prov
        loop.stop()
        if provider is not None:
            provider.close()
        events.close()
        self._provisioning = None

    def close(self) -> None:
        self._stop_scheduler()
        if self.coordinator is not None:
            self.coordinator.stop()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()


def _delivery(cfg: Config, token: str):
    """The snapshot delivery the config asks for (paper §4.2)."""
    b = cfg.broadcast
    if b.topology == "direct":
        return DirectPush()
    from echo2sdk.runtime.chain_broadcast import ChainBroadcast

    uplink = b.uplink_mbps * 1e6 / 8 if b.shape_uplink and b.uplink_mbps else None
    return ChainBroadcast(
        token,
        topology=b.topology,
        n_chains=b.chains(),
        chunk_bytes=int(b.chunk_mib * (1 << 20)),
        host=cfg.run.host,
        uplink_bps=uplink,
        stall_timeout_s=b.stall_timeout_s,
    )


def _event_log(path: Path) -> tuple[IO[str], Any]:
    """The scheduler's event file (appended to) and a function writing one JSON line to it, flushed."""
    events = open(path, "a")

    def write(event: dict[str, Any]) -> None:
        events.write(json.dumps(event, default=str) + "\n")
        events.flush()

    return events, write


def _extra_means(records: list) -> dict[str, float]:
    """Mean of every numeric (or boolean) task-metadata field over the batch, e.g. an episodic task's
    turns, fallbacks, failed episodes or chip change; fields a record lacks are left out of its mean."""
    sums: dict[str, list[float]] = {}
    for t in records:
        for key, value in t.meta.extra.items():
            if isinstance(value, (bool, int, float)) and not key.endswith("seed"):  # ids, not measurements
                sums.setdefault(key, []).append(float(value))
    return {k: round(statistics.fmean(v), 4) for k, v in sorted(sums.items())}


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="echo2 steps", unit="step", disable=not enabled, dynamic_ncols=True)


def _log_to(path: Path) -> None:
    root = logging.getLogger("echo2sdk")
    if not any(isinstance(h, logging.FileHandler) and h.baseFilename == str(path.resolve()) for h in root.handlers):
        fh = logging.FileHandler(path)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(fh)
    root.setLevel(logging.INFO)
