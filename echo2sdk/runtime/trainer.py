"""The run recipe: setup -> run -> save -> cleanup. Ties the learning plane (Learner), the buffer and the
coordinator together, and starts local rollout-worker processes.

Algorithm 1 of the paper, learner side: wait until R admissible trajectories (v >= v_t - S) are in the
buffer, update, advance v_t, publish a snapshot every kappa updates; rollout, dissemination and
training overlap because workers keep generating under their installed version meanwhile.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from echo2sdk.config import Config
from echo2sdk.core import capacity
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.runtime.coordinator import Coordinator
from echo2sdk.runtime.delivery import DirectPush
from echo2sdk.core.contracts import TaskAdapter
from echo2sdk.errors import CapacityError, Echo2Error

__all__ = ["Trainer"]

log = logging.getLogger("echo2sdk.trainer")


class Trainer:
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
        self._ready = False

    # -- setup -------------------------------------------------------------------------------------
    def setup(self) -> None:
        if self._ready:
            return
        from echo2sdk.core.learner import Learner
        from echo2sdk.weights import resolve_model
        from echo2sdk.plugins import load_adapter

        cfg, L, ro = self.cfg, self.cfg.learner, self.cfg.rollout
        self.out.mkdir(parents=True, exist_ok=True)
        _log_to(self.out / "run.log")
        self.model_path = resolve_model(cfg.model.policy)
        adapter = self._adapter or load_adapter(cfg.task.adapter, cfg.task.options)
        self.learner = Learner(
            self.model_path,
            lr=L.lr,
            beta=L.beta,
            clip_eps=L.clip_eps,
            is_cap=L.is_cap,
            adv_eps=L.adv_eps,
            grad_clip=L.grad_clip,
            micro_batch=L.micro_batch,
            precision=L.precision,
            temperature=ro.temperature,
            weight_decay=L.weight_decay,
            reference=cfg.model.reference,
            threads=L.threads,
            seed=cfg.run.seed,
        )
        self.buffer = StalenessBuffer(staleness=L.staleness, group_size=ro.group_size, order=L.order)
        worker_config = {
            "model": cfg.model.policy,
            "model_path": self.model_path,
            "adapter": cfg.task.adapter,
            "adapter_options": cfg.task.options,
            "backend": ro.backend,
            "backend_options": ro.backend_options,
            "group_size": ro.group_size,
            "tasks_per_request": ro.tasks_per_request,
            "sampling": {"max_new_tokens": ro.max_new_tokens, "temperature": ro.temperature, "top_p": ro.top_p},
            "max_len": L.max_len,
        }
        token = cfg.run.token or os.environ.get("ECHO2_TOKEN") or secrets.token_urlsafe(24)
        self.coordinator = Coordinator(
            buffer=self.buffer,
            tasks=adapter.tasks(cfg.run.seed),
            worker_config=worker_config,
            vocab_size=self.learner.vocab_size,
            max_len=L.max_len,
            token=token,
            host=cfg.run.host,
            port=cfg.run.port,
            heartbeat_s=cfg.run.heartbeat_s,
            worker_timeout_s=cfg.run.worker_timeout_s,
            delivery=_delivery(cfg, token),
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
        env = dict(os.environ, ECHO2_TOKEN=self.coordinator.token)  # not on the command line (ps shows argv)
        env.update(OMP_NUM_THREADS=str(ro.threads), MKL_NUM_THREADS=str(ro.threads), TOKENIZERS_PARALLELISM="false")
        for i in range(ro.workers):
            cmd = [sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"{host}:{port}", "--id", f"local-{i}"]
            cmd += ["--nice", str(ro.nice)]
            with open(logs / f"local-{i}.log", "w") as fh:
                self.procs.append(subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT))

    # -- run ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.setup()
        cfg, L = self.cfg, self.cfg.learner
        R, n, kappa, S = L.trajectories_per_step, self.cfg.rollout.group_size, cfg.kappa, L.staleness
        k = R // n
        metrics = open(self.out / "metrics.jsonl", "w")
        bar = _progress(L.steps, cfg.run.progress)
        t_start = time.perf_counter()
        published: list[int] = []
        publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo2-publish")
        try:
            for step in range(1, L.steps + 1):
                t_wait = self._wait_for_groups(k)
                t0 = time.perf_counter()
                groups = self.last_batch = self.buffer.sample(k)
                records = [t for g in groups for t in g]
                deltas = [self.version - t.version for t in records]  # Delta = v_t - v, <= S by admission
                st = self.learner.step(groups)
                self.version += 1
                self.buffer.set_version(self.version)
                t_pub = 0.0
                if self.version % kappa == 0:  # publish every kappa updates
                    tp = time.perf_counter()
                    state = self.learner.snapshot_state(L.snapshot_dtype)  # copy now; serialize off-thread
                    publisher.submit(self._publish, self.version, state)
                    published.append(self.version)
                    t_pub = time.perf_counter() - tp
                rewards = [t.reward for t in records]
                correct = [t.meta.extra.get("correct") for t in records]
                t_q, t_all = self._last_bcast(published)
                row = {
                    "step": step,
                    "version": self.version,
                    "time_s": round(time.perf_counter() - t_start, 3),
                    "t_train_s": round(st.t_train_s, 4),
                    "t_forward_s": round(st.t_forward_s, 4),
                    "t_backward_s": round(st.t_backward_s, 4),
                    "t_optim_s": round(st.t_optim_s, 4),
                    "t_publish_s": round(t_pub, 4),
                    "t_step_wall_s": round(time.perf_counter() - t0 + t_wait, 4),
                    "learner_wait_s": round(t_wait, 4),
                    "reward_mean": statistics.fmean(rewards),
                    "reward_std": statistics.pstdev(rewards),
                    "accuracy": statistics.fmean(bool(c) for c in correct) if correct else None,
                    "staleness_max": max(deltas),
                    "staleness_mean": statistics.fmean(deltas),
                    "trajectories": len(records),
                    "tokens": st.tokens,
                    "rejected": sum(self.coordinator.rejected.values()),
                    "evicted": self.buffer.stats()["evicted"],
                    "loss": st.loss,
                    "kl": st.kl,
                    "clip_frac": st.clip_frac,
                    "is_weight_mean": st.is_weight_mean,
                    "is_truncated_frac": st.is_truncated_frac,
                    "grad_norm": st.grad_norm,
                    "task": _extra_means(records),
                    "workers_alive": len(self.coordinator.alive_workers()),
                    "t_bcast_s": t_q,
                    "t_bcast_all_s": t_all,
                    "broadcast_repairs": len(self.coordinator.broadcast_repairs),
                }
                self.rows.append(row)
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward_mean']:.3f}", acc=f"{row['accuracy'] or 0:.2f}", wait=f"{t_wait:.1f}s")
        finally:
            publisher.shutdown(wait=True)
            bar.close()
            metrics.close()
        self.save()
        summary = self.summary(time.perf_counter() - t_start)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

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

    def _last_bcast(self, published: list[int]) -> tuple[float | None, float | None]:
        for v in reversed(published):
            t_q, t_all = self.coordinator.t_bcast(v)
            if t_q is not None:
                return t_q, t_all
        return None, None

    # -- save / summarize / cleanup ----------------------------------------------------------------
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
        import copy

        from echo2sdk.plan import CatalogEntry, format_plan, make_plan

        self.setup()
        cfg, L, sc = self.cfg, self.cfg.learner, self.cfg.scheduler
        R, kappa = L.trajectories_per_step, cfg.kappa
        if self.version != 0:
            raise Echo2Error(f"calibrate() runs before training (learner at version {self.version})")
        k = R // cfg.rollout.group_size
        self._wait_for_groups(k)
        groups = self.buffer.sample(k)
        deadline = time.monotonic() + join_timeout_s
        while time.monotonic() < deadline:  # every joined worker has measured itself once
            alive = self.coordinator.alive_workers()
            if alive and all(w.rollouts_per_s > 0 for w in alive) and len(alive) >= cfg.rollout.workers:
                break
            time.sleep(0.2)
        own = {w.worker_id: w.rollouts_per_s for w in self.coordinator.alive_workers() if w.rollouts_per_s > 0}
        t_a, got_a = time.monotonic(), {w.worker_id: w.trajectories for w in self.coordinator.alive_workers()}
        opt = self.learner.opt
        saved = copy.deepcopy(opt.state_dict())
        for g in opt.param_groups:
            g["lr"] = 0.0
        try:
            times = [self.learner.step(groups).t_train_s for _ in range(steps)]
        finally:
            opt.load_state_dict(saved)  # learning rates and moments as they were
        t_train = statistics.median(times)
        self.version = 1  # the unchanged policy, published once to time the real path
        self.buffer.set_version(self.version)
        self._publish(self.version, self.learner.snapshot_state(L.snapshot_dtype))
        t_bcast = None
        deadline = time.monotonic() + join_timeout_s
        while t_bcast is None and time.monotonic() < deadline:
            time.sleep(0.1)
            t_bcast = self.coordinator.t_bcast(self.version)[0]
        if t_bcast is None:
            raise Echo2Error(f"T_bcast calibration: snapshot v1 not installed within {join_timeout_s:g} s")
        # mu_i end to end, while the learner trained and published (accepted trajectories per second);
        # a worker that delivered nothing in that span keeps its own generation-rate estimate
        span = time.monotonic() - t_a
        mu = {}
        for w in self.coordinator.alive_workers():
            delivered = w.trajectories - got_a.get(w.worker_id, w.trajectories)
            rate = delivered / span if delivered > 0 else own.get(w.worker_id, 0.0)
            if rate > 0:
                mu[w.worker_id] = rate
        if not mu:
            raise Echo2Error(f"calibration: no worker delivered trajectories in {span:.0f} s; see {self.out / 'workers'}")
        prices = {w.worker_id: sc.prices.get(w.worker_id, w.price_per_hour) for w in self.coordinator.alive_workers()}
        catalog = [CatalogEntry(wid, prices[wid], m) for wid, m in sorted(mu.items())]
        plan = make_plan(catalog, T_train=t_train, R=R, S=L.staleness, kappa=kappa, gamma=sc.gamma, T_bcast=t_bcast)
        text = format_plan(plan)
        out = {"T_train": t_train, "T_train_steps": times, "T_bcast": t_bcast, "mu": mu, "prices": prices,
               "plan": plan.to_dict(), "decision": text}
        log.info("warm-up calibration:\n%s", text)
        if sc.enabled:
            self._start_scheduler(out)
        (self.out / "calibration.json").write_text(json.dumps(out, indent=2, default=str))
        return out

    def _start_scheduler(self, cal: dict[str, Any]) -> None:
        from echo2sdk.core.scheduler import Scheduler
        from echo2sdk.runtime.live_loop import LiveLoop
        from echo2sdk.runtime.providers import load_provider

        cfg, sc = self.cfg, self.cfg.scheduler
        now = time.monotonic()
        sched = Scheduler(gamma=sc.gamma, window_s=sc.window_s, heartbeat_s=cfg.run.heartbeat_s,
                          sustain_s=sc.sustain_s, release_margin=sc.release_margin,
                          fail_after_s=cfg.run.worker_timeout_s)
        mus = list(cal["mu"].values()) or [1.0]
        prior = statistics.fmean(mus)
        for w in self.coordinator.alive_workers():
            sched.add_worker(w.worker_id, cal["prices"][w.worker_id], cal["mu"].get(w.worker_id, prior), now=now)
        provider = None
        if sc.standby:
            options = {"connect": f"{self.coordinator.host}:{self.coordinator.port}", "token": self.coordinator.token,
                       "log_dir": str(self.out / "workers"), "threads": cfg.rollout.threads, "nice": cfg.rollout.nice}
            provider = load_provider(sc.provider, **(options if sc.provider == "local" else {}), **sc.provider_options)
            for i in range(sc.standby):
                sched.add_worker(f"standby-{i}", sc.standby_price, prior, now=now)
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
        events = open(self.out / "scheduler.jsonl", "a")

        def write(event: dict[str, Any]) -> None:
            events.write(json.dumps(event, default=str) + "\n")
            events.flush()

        write({"t": now, "event": "provisioned", "mu_target": sched.mu_target, "active": sorted(chosen),
               "standby": sched.standby()})
        self._provisioning = (LiveLoop(sched, self.coordinator, provider, period_s=cfg.run.heartbeat_s,
                                       prices=dict(sc.prices), stop_released=sc.stop_released,
                                       stop_failed_after_s=sc.stop_failed_after_s, on_event=write,
                                       remeasure=self._remeasure), provider, events)
        self._provisioning[0].apply(decided)  # starts chosen machines that are not up yet
        self._provisioning[0].start()

    def _remeasure(self) -> dict[str, Any] | None:
        """T_train (median of the last 5 steps) and T_bcast (the last publication) from the run itself."""
        rows = self.rows[-5:]
        bcasts = [r["t_bcast_s"] for r in self.rows if r.get("t_bcast_s") is not None]
        if len(rows) < 5 or not bcasts:
            return None
        return {"T_train": statistics.median(r["t_train_s"] for r in rows), "T_bcast": bcasts[-1],
                "R": self.cfg.learner.trajectories_per_step, "kappa": self.cfg.kappa}

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
