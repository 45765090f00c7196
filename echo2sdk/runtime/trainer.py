"""The run recipe: setup -> run -> save -> cleanup. Ties the learning plane (Learner), the buffer and the
coordinator together, and starts local rollout-worker processes.

Algorithm 1 of the paper, learner side: wait until R admissible trajectories (v >= v_t - S) are in the
buffer, update, advance v_t, publish a snapshot every kappa updates; rollout, dissemination and
training overlap because workers keep generating under their installed version meanwhile.

The configuration stays out of the classes: the builders below (`learner_args`, `buffer_args`,
`worker_config`, `coordinator_args`, `worker_command`) turn a `Config` into the flat arguments each part
takes, and `metrics_row` assembles one line of metrics.jsonl.

Checkpoints (runtime/checkpoint.py) are written every run.save_every steps, after the last step and on
SIGTERM/SIGINT; `Trainer(cfg, resume=DIR)` continues from one. Under torchrun the learner is sharded over
the ranks (runtime/distributed.py): rank 0 runs this recipe, the other ranks follow it.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from echo2sdk.config import Config
from echo2sdk.core import capacity, lr_schedule
from echo2sdk.core.audit import BatchWithheld, SamplerAudit, WorkerStat, audit_items, replay_stats, worker_stats
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.runtime import checkpoint, distributed
from echo2sdk.runtime.bootstrap import ModelFolder
from echo2sdk.runtime.coordinator import Coordinator
from echo2sdk.runtime.credentials import check_token, given_token, new_token
from echo2sdk.runtime.worker_keys import Revocations
from echo2sdk.runtime.delivery import DirectPush
from echo2sdk.runtime.plugin_policy import allowances
from echo2sdk.runtime.providers.local import worker_command, worker_env
from echo2sdk.runtime.sinks import Sinks, load_sinks, redact, sample_rows
from echo2sdk.runtime.sinks.jsonl import reset_run_files
from echo2sdk.core.contracts import TaskAdapter
from echo2sdk.errors import CapacityError, ConfigError, Echo2Error

if TYPE_CHECKING:
    from echo2sdk.core.learner import StepStats

__all__ = ["Trainer"]

log = logging.getLogger("echo2sdk.trainer")

MAX_DROPS_IN_A_ROW = 8  # batches the learner step fails on in a row before the run ends (a bug, not data)


# -- builders: Config -> flat arguments ----------------------------------------------------------------
def learner_args(cfg: Config) -> dict[str, Any]:
    """Keyword arguments of `Learner(model_path, **learner_args(cfg))`."""
    L = cfg.learner
    return dict(
        lr=L.lr,
        beta=L.beta,
        epsilon=L.epsilon,
        epsilon_high=L.epsilon_high,
        is_cap=L.is_cap,
        importance_weight=L.importance_weight,
        loss_type=L.loss_type,
        scale_rewards=L.advantages_scaled,
        max_completion_length=cfg.rollout.max_new_tokens,
        updates_per_step=L.updates_per_step,
        lr_scheduler=L.lr_scheduler,
        warmup_steps=lr_schedule.warmup_steps(L.steps, L.warmup_steps, L.warmup_ratio),
        total_steps=L.steps,
        adv_eps=L.adv_eps,
        grad_clip=L.grad_clip,
        micro_batch=L.micro_batch,
        precision=L.precision,
        temperature=cfg.rollout.temperature,
        weight_decay=L.weight_decay,
        reference=cfg.model.reference,
        threads=L.threads,
        seed=cfg.run.seed,
        gradient_checkpointing=L.gradient_checkpointing,
        token_budget=L.token_budget or None,
    )


def buffer_args(cfg: Config) -> dict[str, Any]:
    """Keyword arguments of `StalenessBuffer(**buffer_args(cfg))`: S, the group size n, the order, the
    intake's reward bound, dynamic sampling (zero-variance groups filtered; the fallback after patience x k),
    and the per-worker bound: k x (S + 1) groups, what the learner can train on before they go stale."""
    L = cfg.learner
    k = L.trajectories_per_step // cfg.rollout.group_size  # groups per step
    return dict(staleness=L.staleness, group_size=cfg.rollout.group_size, order=L.order, reward_bound=L.reward_bound,
                filter_zero_variance=L.filter_zero_variance, fallback_after=L.filter_patience * k,
                groups_per_worker=k * (L.staleness + 1))


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
        "sampling": {"max_new_tokens": ro.max_new_tokens, "temperature": ro.temperature, "top_p": ro.top_p,
                     "top_k": ro.top_k, "min_p": ro.min_p},
        "max_prompt_length": ro.max_prompt_length,
        "max_len": cfg.learner.max_len,
    }


def coordinator_args(cfg: Config, token: str, signing_key: Any = None) -> dict[str, Any]:
    """The Coordinator's address, liveness and delivery arguments (setup adds buffer, tasks and the model's
    facts). `signing_key`: the Ed25519 private key of the chain broadcast's manifests (default: a new one)."""
    run = cfg.run
    return dict(
        max_len=cfg.learner.max_len,
        token=token,
        host=run.host,
        port=run.port,
        heartbeat_s=run.heartbeat_s,
        worker_timeout_s=run.worker_timeout_s,
        delivery=_delivery(cfg, token, signing_key),
        revoked=Revocations(run.revoked_workers, run.revoked_file),
    )


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
    workers_quarantined: int = 0,
    audit: dict[str, Any] | None = None,
    replay: dict[str, Any] | None = None,
    replay_s: float = 0.0,
    batches_dropped: int = 0,
    batches_withheld: int = 0,
    records_withheld: int = 0,
    groups_filtered: int = 0,
    groups_filtered_frac: float = 0.0,
    rollout_reward_mean: float | None = None,
    rollout_accuracy: float | None = None,
) -> dict[str, Any]:
    """One line of metrics.jsonl: the update's timings (seconds), the batch's rewards and staleness
    (Delta = v_t - v), the learner's StepStats `st`, and the pool's counters at the end of the step."""
    rewards = [t.reward for t in records]
    scored = [c for c in (t.meta.extra.get("correct") for t in records) if c is not None]
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
        "accuracy": statistics.fmean(bool(c) for c in scored) if scored else None,  # None: the task scores no "correct"
        # every group completed since the previous step, filtered or not: the policy's level, which the trained
        # batch's reward and accuracy are not under dynamic sampling (it keeps the groups with mixed rewards)
        "rollout_reward_mean": rollout_reward_mean,
        "rollout_accuracy": rollout_accuracy,
        "staleness_max": max(deltas),
        "staleness_mean": statistics.fmean(deltas),
        "trajectories": len(records),
        "tokens": st.tokens,
        "rejected": rejected,
        "evicted": evicted,
        "groups_filtered": groups_filtered,  # so far: zero-variance groups not trained on (dynamic sampling)
        "groups_filtered_frac": groups_filtered_frac,  # of the groups completed so far
        "loss": st.loss,
        "kl": st.kl,
        "clip_frac": st.clip_frac,
        "is_weight_mean": st.is_weight_mean,
        "is_truncated_frac": st.is_truncated_frac,
        "grad_norm": st.grad_norm,
        "lr": st.lr,
        "task": _extra_means(records),
        "workers_alive": workers_alive,
        "t_bcast_s": t_q,
        "t_bcast_all_s": t_all,
        "broadcast_repairs": broadcast_repairs,
        "sampler_gap": {w: round(s.gap, 6) for w, s in (audit or {}).items()},  # the worker audit (core/audit.py)
        "sampler_var": {w: round(s.var, 6) if math.isfinite(s.var) else None for w, s in (audit or {}).items()},
        # the audit's replay: a few records per worker under the version each claims (lag 0 for both statistics)
        "sampler_replay_gap": {w: round(s.gap, 6) for w, s in (replay or {}).items()},
        "sampler_replay_var": {w: round(s.var, 6) if math.isfinite(s.var) else None for w, s in (replay or {}).items()},
        "t_audit_replay_s": round(replay_s, 4),
        "records_withheld": sum(st.withheld),  # of this step's batch, by the audit's screen (not trained on)
        "workers_quarantined": workers_quarantined,
        "batches_dropped": batches_dropped,  # so far: batches the learner step raised on (Trainer._learn)
        "batches_withheld": batches_withheld,  # so far: batches the audit's screen withheld whole (records_withheld)
        "records_withheld_total": records_withheld,  # so far
    }


def rollout_means(before: tuple, now: tuple) -> dict[str, float | None]:
    """rollout_reward_mean and rollout_accuracy of the groups completed between two readings of the buffer's
    (completed_records, completed_reward_sum, completed_scored, completed_correct); None where none (or no
    scored record) completed."""
    (n0, reward0, scored0, correct0), (n, reward, scored, correct) = before, now
    return {
        "rollout_reward_mean": (reward - reward0) / (n - n0) if n > n0 else None,
        "rollout_accuracy": (correct - correct0) / (scored - scored0) if scored > scored0 else None,
    }


def shown_level(row: dict[str, Any]) -> tuple[float, float | None]:
    """A metrics row's reward and accuracy as the progress bar and the status page show them: the workers' (every
    group completed since the previous step) where the step has them, else the trained batch's (also for rows
    written before the rollout_* keys existed)."""
    reward, acc = row.get("rollout_reward_mean"), row.get("rollout_accuracy")
    return (row["reward_mean"] if reward is None else reward, row["accuracy"] if acc is None else acc)


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


class _Stopped(Exception):
    """SIGTERM or SIGINT arrived while the learner waited for data."""


class _Counted(Iterator):
    """The task stream, counting what it hands out (a resumed run skips what was handed out before)."""

    def __init__(self, tasks: Iterable, skip: int = 0):
        self._it = iter(tasks)
        collections.deque(itertools.islice(self._it, skip), maxlen=0)
        self.issued = skip

    def __next__(self):
        item = next(self._it)
        self.issued += 1
        return item


class Trainer:
    """The recipe: `setup` (learner, buffer, coordinator, local workers), `run` (learner.steps updates with a
    checkpoint every run.save_every, then `save` and summary.json), `close` (cleanup). `calibrate` is the
    optional warm-up between setup and run. `resume`: a run folder or a checkpoint folder to continue from."""

    def __init__(self, cfg: Config, adapter: TaskAdapter | None = None, resume: str | os.PathLike[str] | None = None):
        self.cfg = cfg
        self.out = Path(cfg.run.out)
        self._adapter = adapter
        self.resume = resume
        self.topo = distributed.from_env()
        if self.topo.world > 1 and cfg.scheduler.enabled:
            raise ConfigError("scheduler.enabled: warm-up calibration runs on one learner process; "
                              "start without --nproc-per-node, or set scheduler.enabled = false")
        self.procs: list[subprocess.Popen] = []
        self.coordinator: Coordinator | None = None
        self.learner = None
        self.ops: distributed.Lockstep | None = None  # the learner calls that are collectives under torchrun
        self.step = 0  # updates done (the metrics' step), across resumes
        self.version = 0  # v_t
        self.rows: list[dict[str, Any]] = []
        self.last_batch: list = []
        self.last_checkpoint: dict[str, Any] | None = None
        self._published: list[int] = []  # versions published, oldest first
        self._metrics_bytes = 0  # length of metrics.jsonl after the last row (a checkpoint records it)
        self._stop_signal: int | None = None
        self._signing_key: Any = None
        self._drawn_token = False
        # run.token, run.token_file or $ECHO2_TOKEN, checked now (>= 128 bits), before anything is loaded
        self._given_token = _given_token(cfg) if self.topo.leader else None
        self._tasks: _Counted | None = None
        self._rows_at_setup = 0  # rows restored by a resume (calibrate runs before this process trains)
        self.sinks: Sinks | None = None  # run.log_to, opened in setup (rank 0)
        lt = cfg.learner
        # the worker audit (core/audit.py); None when learner.lie_threshold is 0
        self.audit = SamplerAudit(lt.lie_threshold, lt.lie_var_threshold) if lt.lie_threshold else None
        self.batches_withheld = 0  # batches the audit's screen withheld whole (not counted as dropped)
        self._completed_seen = (0, 0.0, 0, 0)  # the buffer's completed_* counters at the previous step
        # the audit's replay: the published snapshots of the admissible window, by version (learner.audit_replay)
        self._replay_states: dict[int, dict[str, Any]] = {}
        self._replay_rng = random.SystemRandom()  # a worker cannot predict which of its records are replayed
        self._replay_off = False  # set when a replay failed
        self._replay: dict[str, WorkerStat] = {}  # the stepped batch's replay_stats
        self._replay_s = 0.0  # the stepped batch's replay time
        self.withheld_by_worker: collections.Counter[str] = collections.Counter()  # records withheld, by worker
        self.status: Any = None  # the live status page (run.status_port), a StatusServer once started
        self.batches_dropped = 0  # batches the learner step raised on (dropped, training went on)
        self.dropped_by_worker: collections.Counter[str] = collections.Counter()  # their records, by worker
        self._held = contextlib.ExitStack()  # process-wide settings undone by close()
        self._ready = self._stopped_followers = self._leader_clean = False

    # -- setup -------------------------------------------------------------------------------------
    def setup(self) -> None:
        if self._ready:
            return
        from echo2sdk.core.learner import Learner
        from echo2sdk.weights import resolve_model

        cfg = self.cfg
        distributed.init(self.topo)
        ckpt = self._checkpoint_to_resume()
        if self.topo.leader:
            self.out.mkdir(parents=True, exist_ok=True)
            _log_to(self.out / "run.log")
            self._open_sinks(fresh=ckpt is None)
        self._held.enter_context(_library_bars_off())  # the console keeps one bar, echo2's
        with _one_line(cfg.model.policy, show=self.topo.leader and cfg.run.progress):  # not three bars
            self.model_path = resolve_model(cfg.model.policy)
        self.learner = Learner(self.model_path, **learner_args(cfg), weights_from=str(ckpt.path) if ckpt else None,
                               distributed=self.topo.world > 1)
        self.ops = distributed.Lockstep(self.learner, self.topo.world)
        if ckpt is not None:
            self.learner.load_optimizer_state(ckpt.optimizer())
            self.learner.load_schedule_state(ckpt.state.get("lr_schedule") or {"steps_done": ckpt.step})
            ckpt.restore_rng()
            self.step = ckpt.step
        if self.topo.leader:
            self._setup_leader(ckpt)
        self._rows_at_setup = len(self.rows)
        self._ready = True

    def _setup_leader(self, ckpt: checkpoint.Checkpoint | None) -> None:
        """Rank 0: the buffer, the coordinator (with the checkpoint's signing key, certificate and token when
        resuming), the resumed publication, the local workers."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        from echo2sdk.plugins import load_adapter

        cfg, L = self.cfg, self.cfg.learner
        adapter = self._adapter or load_adapter(cfg.task.adapter, cfg.task.options)
        self.buffer = StalenessBuffer(**buffer_args(cfg))
        kept = ckpt.secrets() if ckpt is not None else {}
        given = self._given_token
        token = given or kept.get("token", b"").decode() or new_token()
        self._drawn_token = not given
        if cfg.broadcast.topology != "direct":
            raw = kept.get("signing.key")
            self._signing_key = Ed25519PrivateKey.from_private_bytes(raw) if raw else Ed25519PrivateKey.generate()
        self._tasks = _Counted(adapter.tasks(cfg.run.seed), skip=ckpt.state.get("tasks_issued", 0) if ckpt else 0)
        self.coordinator = Coordinator(
            buffer=self.buffer,
            tasks=self._tasks,
            worker_config=worker_config(cfg, self.model_path),
            base=ModelFolder(self.model_path, L.snapshot_dtype),  # for workers started with --bootstrap
            vocab_size=self.learner.vocab_size,
            **coordinator_args(cfg, token, self._signing_key),
            **_coordinator_tls(cfg, kept),
        )
        host, port = self.coordinator.start()
        log.info("coordinator on %s:%d (R=%d, S=%d, kappa=%d); learner %s (precision=%s) on %d rank(s)", host, port,
                 L.trajectories_per_step, L.staleness, cfg.kappa, "bf16 autocast" if self.learner.autocast else "fp32",
                 L.precision, self.topo.world)
        if ckpt is not None:
            self._resume_publication(ckpt)
        elif self._replaying():  # version 0: the weights workers start from
            self._keep_for_replay(0, self.ops.snapshot_state(self.cfg.learner.snapshot_dtype))
        self._start_status()
        self._start_local_workers(host, port, append=ckpt is not None)

    def _start_status(self) -> None:
        """With run.status_port: the live status page, its URL and token printed on the console (not logged)."""
        run = self.cfg.run
        if run.status_port is None:
            return
        from echo2sdk.runtime.status import StatusServer, status_snapshot

        self.status = StatusServer(lambda: status_snapshot(self), host=run.status_host, port=run.status_port)
        url = self.status.start()
        log.info("status page on %s (its token was printed on the console)", url)
        print(f"echo2: status page {url}?token={self.status.token}", file=sys.stderr, flush=True)

    def _checkpoint_to_resume(self) -> checkpoint.Checkpoint | None:
        """The checkpoint `resume` names; None for a fresh run. A fresh run refuses a folder whose newest
        checkpoint is of an unfinished run (resume it, or delete it), and clears a finished run's."""
        root = self.out / "checkpoints"
        if self.resume is not None:
            return checkpoint.load(self.resume)
        last = checkpoint.latest(root) if self.topo.leader else None
        if last is not None and last.step < last.state.get("steps_planned", 0):
            raise Echo2Error(
                f"{self.out} holds an unfinished run (checkpoint at step {last.step} of {last.state['steps_planned']}): "
                f"continue it with  echo2 run CONFIG --resume {self.out}  or delete {root} to start over"
            )
        if last is not None:
            import shutil

            log.info("a fresh run in %s: removing the finished run's checkpoints", self.out)
            shutil.rmtree(root)
            (self.out / "published.json").unlink(missing_ok=True)
        return None

    def _resume_publication(self, ckpt: checkpoint.Checkpoint) -> None:
        """Continue the version sequence above everything ever published, cut metrics.jsonl back to the
        checkpoint's step and publish the resumed weights before any worker joins."""
        # the mark of the folder the checkpoint came from too: resuming into another --out must not reuse numbers
        published = max(checkpoint.published_mark(self.out), checkpoint.published_mark(checkpoint.run_folder(ckpt.path)),
                         ckpt.state.get("published", 0))
        self.version = checkpoint.resume_version(ckpt.version, published)
        self.buffer.set_version(self.version)
        self.rows = self._restore_metrics(ckpt.state.get("metrics_bytes", 0))
        state = self.ops.snapshot_state(self.cfg.learner.snapshot_dtype)
        checkpoint.record_published(self.out, self.version)
        self._publish(self.version, state)
        self._note_published(self.version, state)
        log.info("resumed from %s: step %d, version %d (checkpoint v%d, published up to v%d); buffer starts empty",
                 ckpt.path, self.step, self.version, ckpt.version, published)

    def _restore_metrics(self, length: int) -> list[dict[str, Any]]:
        """metrics.jsonl as it was at the checkpoint: rows written after it (updates the crash lost) move to
        metrics.discarded.jsonl; returns the kept rows."""
        path = self.out / "metrics.jsonl"
        data = path.read_bytes() if path.exists() else b""
        kept, lost = data[:length], data[length:]
        if lost:
            with open(self.out / "metrics.discarded.jsonl", "ab") as fh:
                fh.write(lost)
            os.truncate(path, len(kept))
            log.info("metrics.jsonl: %d row(s) after the checkpoint moved to metrics.discarded.jsonl",
                     len(lost.splitlines()))
        self._metrics_bytes = len(kept)
        return [json.loads(line) for line in kept.splitlines() if line.strip()]

    def _start_local_workers(self, host: str, port: int, append: bool = False) -> None:
        ro = self.cfg.rollout
        logs = self.out / "workers"
        logs.mkdir(exist_ok=True)
        env = worker_env(self.coordinator.token, ro.threads)
        for i in range(ro.workers):
            if not append:
                (logs / f"local-{i}.log").write_text("")
            # O_APPEND: a worker orphaned by a killed learner may still write here while its successor does
            with open(logs / f"local-{i}.log", "a") as fh:
                cmd = worker_command(host, port, f"local-{i}", ro.nice, allowances(self.coordinator.worker_config),
                                     plaintext=not self.cfg.run.tls)
                self.procs.append(subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT))

    # -- run ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """setup, the remaining of learner.steps updates (one metrics.jsonl row each; a checkpoint every
        run.save_every and after the last), save, summary.json; returns the summary. SIGTERM/SIGINT end the
        run after the current update with a checkpoint ("stopped" in the summary). Under torchrun the ranks
        other than 0 follow rank 0's learner calls and return {}."""
        self.setup()
        if not self.topo.leader:
            with _signals(lambda signum: None):  # rank 0 decides when to stop; torchrun forwards signals to all
                self._leader_clean = distributed.follow(self.learner).clean
            return {}
        steps = self.cfg.learner.steps
        t_start = time.perf_counter() - (self.rows[-1]["time_s"] if self.rows else 0.0)  # time_s goes on across resumes
        with (
            _progress(steps, self.cfg.run.progress, initial=self.step) as bar,
            _log_above(bar),
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo2-publish") as publisher,
            _signals(self._on_signal),
        ):
            try:
                for step in range(self.step + 1, steps + 1):
                    self._record(self.train_step(step, publisher, t_start), bar)
                    self.step = step
                    if self._stop_signal is None and self._checkpoint_due(step):
                        self.save_checkpoint()
                    if self._stop_signal is not None:
                        break
            except _Stopped:
                pass
            self.save_checkpoint()  # the last step's, or where a signal stopped the run (kept if it exists)
        self._log_run_end()
        if self._stop_signal is None:
            self.save()
        summary = self.summary(time.perf_counter() - t_start)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _on_signal(self, signum: int) -> None:
        self._stop_signal = signum
        log.warning("%s: stopping after the current update with a checkpoint (send it again to stop at once)",
                    signal.Signals(signum).name)

    def _checkpoint_due(self, step: int) -> bool:
        every = self.cfg.run.save_every
        return every > 0 and step % every == 0 and step < self.cfg.learner.steps

    def train_step(self, step: int, publisher: Executor, t_start: float) -> dict[str, Any]:
        """One update: wait for k = R/n admissible groups, step the learner, advance v_t, publish every
        kappa updates. Returns the step's metrics row."""
        k = self._groups_per_step()
        t_wait, t0, groups, st = self._learn(k)
        records = [t for g in groups for t in g]
        deltas = [self.version - t.version for t in records]  # Delta = v_t - v, <= S by admission
        audit = self._audit_batch(records, st.audit_sums, st.withheld)
        self.version += 1
        self.buffer.set_version(self.version)
        t_pub = self._publish_if_due(publisher)
        t_bcast = self._last_bcast()
        now = time.perf_counter()
        self._log_batch(step, records, deltas)
        return metrics_row(step, self.version, records, deltas, st, time_s=now - t_start, wall_s=now - t0 + t_wait,
                           wait_s=t_wait, publish_s=t_pub, t_bcast=t_bcast, audit=audit, replay=self._replay,
                           replay_s=self._replay_s, **self._pool_counters())

    def _learn(self, k: int) -> tuple[float, float, list, StepStats]:
        """Wait for k groups, sample them and step the learner on them. A batch the step raises on (ValueError
        or RuntimeError from its data; NonFiniteUpdate: nothing was applied) is dropped, counted and logged with
        the workers of its records, and the next k groups are waited for; MAX_DROPS_IN_A_ROW drops in a row end
        the run. A batch the audit's screen withheld whole is audited, counted (batches_withheld) and replaced
        the same way, without counting as a drop. Returns (time waited, when the stepped batch was taken, the
        batch, the step's stats)."""
        t_wait, drops = 0.0, 0
        while True:
            t_wait += self._wait_for_groups(k)
            t0 = time.perf_counter()
            groups = self.last_batch = self.buffer.sample(k)
            try:
                screen = self.audit.screen(self.version, self._replay_batch(groups)) if self.audit else None
                return t_wait, t0, groups, self.ops.step(groups, screen)
            except BatchWithheld as e:
                self.batches_withheld += 1
                self._audit_batch([t for g in groups for t in g], e.audit_sums, e.withheld)
            except (ValueError, RuntimeError) as e:
                drops += 1
                self._drop_batch(groups, e)
                if drops >= MAX_DROPS_IN_A_ROW:
                    raise Echo2Error(f"the learner step failed on {drops} batches in a row; the last: {e}") from e

    def _drop_batch(self, groups: list, error: Exception) -> None:
        workers = collections.Counter(t.meta.worker for g in groups for t in g)
        self.batches_dropped += 1
        self.dropped_by_worker.update(workers)
        log.warning("learner step at v%d failed (%s: %s): batch of %d records dropped (records by worker: %s)",
                    self.version, type(error).__name__, error, sum(workers.values()), dict(workers))

    def _replaying(self) -> bool:
        return self.audit is not None and self.cfg.learner.audit_replay > 0

    def _note_published(self, version: int, state: dict[str, Any]) -> None:
        """A version just published: listed (T_bcast at the run's end) and kept for the audit's replay."""
        self._published.append(version)
        self._keep_for_replay(version, state)

    def _keep_for_replay(self, version: int, state: dict[str, Any]) -> None:
        """Keep a published snapshot (the state being serialized, not a copy) while a record may claim it:
        versions below v_t - S are no longer admitted (the buffer drops them)."""
        if not self._replaying():
            return
        self._replay_states[version] = state
        for v in [v for v in self._replay_states if v < self.version - self.cfg.learner.staleness]:
            del self._replay_states[v]

    def _replay_batch(self, groups: list) -> dict[str, WorkerStat]:
        """The audit's replay (core/audit.py): for each worker in the batch, up to learner.audit_replay of its
        records generated under an older version than v_t (at v_t the step's pi_old is already the claimed
        version's) and carrying a loss token, drawn at random (the worker cannot choose them), recomputed under
        the snapshot of the version each claims. Returns replay_stats. A replay that fails (out of memory, say)
        is logged and switched off for the rest of the run: the audit must not cost the learner its batches."""
        self._replay, self._replay_s = {}, 0.0
        if not self._replaying() or self._replay_off:
            return {}
        t0 = time.perf_counter()
        lagged: dict[str, list] = {}
        for t in (t for g in groups for t in g):
            if not t.meta.off_policy and t.meta.trains and t.version < self.version and t.version in self._replay_states:
                lagged.setdefault(t.meta.worker, []).append(t)
        n = self.cfg.learner.audit_replay
        picked = [t for w in sorted(lagged) for t in self._replay_rng.sample(lagged[w], min(n, len(lagged[w])))]
        if picked:
            try:
                sums = self.ops.replay_sums(picked, self._replay_states)
            except (RuntimeError, ValueError, MemoryError) as e:
                self._replay_off = True
                log.error("the audit's replay failed at v%d (%s: %s): replay off for the rest of the run "
                          "(learner.audit_replay); the screen on pi_old goes on", self.version, type(e).__name__, e)
                return {}
            self._replay = replay_stats((t.meta.worker, s) for t, s in zip(picked, sums))
        self._replay_s = time.perf_counter() - t0
        return self._replay

    def _audit_batch(self, records: list, sums: list, withheld: list[bool]) -> dict[str, Any]:
        """The worker audit (core/audit.py) of one stepped or withheld batch: counts the records the screen
        withheld; a worker over learner.lie_threshold / lie_var_threshold in 2 consecutive steps is
        quarantined. Returns the statistics per worker (WorkerStat)."""
        items = audit_items(records, sums, self.version)
        gone = [t.meta.worker for t, w in zip(records, withheld) if w]
        if gone:
            self.withheld_by_worker.update(gone)
            log.warning("audit at v%d: %d records withheld from the update (by worker: %s)", self.version,
                        len(gone), dict(collections.Counter(gone)))
        if self.audit is None:
            return worker_stats(items)
        for wid in self.audit.observe(items, self._replay):
            self.coordinator.quarantine(wid, self.audit.flagged[wid])
        return self.audit.history[-1]

    def _log_batch(self, step: int, records: list, deltas: list[int]) -> None:
        """The batch's staleness histogram every step, a table of its completions every run.log_samples_every."""
        self.sinks.log_histogram(step, "staleness", collections.Counter(deltas))
        every = self.cfg.run.log_samples_every
        if every and step % every == 0:
            self.sinks.log_table(step, "samples", sample_rows(records, self.cfg.run.log_samples))

    def _log_run_end(self) -> None:
        """What is known only at the end: T_bcast of every published version, and the staleness of everything
        the learner sampled (the buffer's histogram)."""
        bcast = [{"version": v, "t_bcast_s": q, "t_bcast_all_s": a}
                 for v in self._published for q, a in [self.coordinator.t_bcast(v)]]
        self.sinks.log_table(self.step, "t_bcast", bcast)
        self.sinks.log_histogram(self.step, "staleness_total", self.buffer.stats()["staleness_hist"])

    def _groups_per_step(self) -> int:
        return self.cfg.learner.trajectories_per_step // self.cfg.rollout.group_size  # k = R / n

    def _publish_if_due(self, publisher: Executor) -> float:
        """Every kappa updates: copy the weights now, serialize and send them on the publisher thread.
        Returns the learner's share of the publication (t_publish_s); 0.0 between publications."""
        if self.version % self.cfg.kappa:
            return 0.0
        t0 = time.perf_counter()
        state = self.ops.snapshot_state(self.cfg.learner.snapshot_dtype)  # copy now; serialize off-thread
        checkpoint.record_published(self.out, self.version)  # before the version leaves the learner
        publisher.submit(self._publish, self.version, state)
        self._note_published(self.version, state)
        return time.perf_counter() - t0

    def _pool_counters(self) -> dict[str, int | float | None]:
        buf = self.buffer.stats()
        done = tuple(buf[k] for k in ("completed_records", "completed_reward_sum", "completed_scored", "completed_correct"))
        before, self._completed_seen = self._completed_seen, done
        return {
            **rollout_means(before, done),
            "rejected": sum(self.coordinator.rejected.values()),
            "evicted": buf["evicted"],
            "groups_filtered": buf["filtered_groups"],
            "groups_filtered_frac": round(buf["filtered_groups"] / max(buf["completed_groups"], 1), 4),
            "workers_alive": len(self.coordinator.alive_workers()),
            "broadcast_repairs": self.coordinator.repairs_reported,
            "workers_quarantined": self.coordinator.quarantines,
            "batches_dropped": self.batches_dropped,
            "batches_withheld": self.batches_withheld,
            "records_withheld": sum(self.withheld_by_worker.values()),
        }

    def _record(self, row: dict[str, Any], bar: Any) -> None:
        self.rows.append(row)
        self.sinks.log(row["step"], row)
        self._metrics_bytes = self.sinks["jsonl"].tell()
        bar.update(1)
        reward, acc = shown_level(row)
        postfix = {"reward": f"{reward:.3f}", **({"acc": f"{acc:.2f}"} if acc is not None else {})}
        bar.set_postfix(**postfix, wait=f"{row['learner_wait_s']:.1f}s")

    def _publish(self, version: int, state: dict) -> None:
        """Runs on the publisher thread: the state is already a private, cast copy."""
        from echo2sdk.core.snapshot import serialize_state

        try:
            self.coordinator.publish(version, serialize_state(state))
        except Exception:  # noqa: BLE001 - a failed publication must be visible, not lost in a Future
            log.exception("publishing snapshot v%d failed; workers keep their current version", version)

    def _wait_for_groups(self, k: int) -> float:
        """Block until k complete admissible groups are buffered (or the zero-variance fallback fills the batch:
        core/buffer.py); the time spent is learner_wait_s. Every 30 s of waiting while groups are being filtered
        for zero reward variance, a warning says so."""
        t0 = time.perf_counter()
        last_progress = last_note = t0
        have, filtered = self.buffer.ready_groups(), self.buffer.stats()["filtered_groups"]
        while not self.buffer.wait_for(k, timeout=1.0):
            if self._stop_signal is not None:
                raise _Stopped()
            now = time.perf_counter()
            if now - last_note >= 30.0:
                last_note = now
                self._note_filtered(k, now - t0, filtered)
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
                    f"exited local workers: {dead}; zero-variance groups filtered while waiting: "
                    f"{self.buffer.stats()['filtered_groups'] - filtered}; see {self.out / 'workers'}"
                )
        if self.buffer.ready_groups() < k:
            log.info("step fills its batch with %d zero-variance group(s): learner.filter_patience=%d x %d groups "
                     "were filtered while it waited", k - self.buffer.ready_groups(), self.cfg.learner.filter_patience, k)
        return time.perf_counter() - t0

    def _note_filtered(self, k: int, waited: float, filtered_before: int) -> None:
        """The warning of a step kept waiting by dynamic sampling (nothing when no group was filtered)."""
        stats = self.buffer.stats()
        n = stats["filtered_groups"] - filtered_before
        if n:
            log.warning("waiting %.0f s for %d informative groups (%d ready): %d group(s) filtered meanwhile for zero "
                        "reward variance (every member the same reward; groups_filtered=%d in all); "
                        "learner.filter_patience=%d, learner.filter_zero_variance=false trains on them",
                        waited, k, stats["ready_groups"], n, stats["filtered_groups"], self.cfg.learner.filter_patience)

    def _last_bcast(self) -> tuple[float | None, float | None]:
        """T_bcast (quantile, all workers) of the newest publication that has one."""
        for v in reversed(self._published):
            t_q, t_all = self.coordinator.t_bcast(v)
            if t_q is not None:
                return t_q, t_all
        return None, None

    # -- save / summarize --------------------------------------------------------------------------
    def save(self) -> None:
        """The final policy as a plain Hugging Face folder, DIR/checkpoint."""
        state = self.ops.model_state() if self.topo.world > 1 else None
        self.learner.save(str(self.out / "checkpoint"), tokenizer_from=self.model_path, state=state)

    def save_checkpoint(self) -> Path:
        """Write DIR/checkpoints/step-N (runtime/checkpoint.py): the policy, the optimizer state, RNG states,
        step and version, the version high-water mark, the tasks handed out, the length of metrics.jsonl and
        the run's secrets (the manifest signing key, the coordinator's certificate, a drawn token)."""
        t0 = time.perf_counter()
        model = self.ops.model_state() if self.topo.world > 1 else None
        optimizer = self.ops.optimizer_state()
        state = {
            "version": self.version,
            "published": max(self._published, default=0),
            "tasks_issued": self._tasks.issued if self._tasks is not None else 0,
            "metrics_bytes": self._metrics_bytes,
            "steps_planned": self.cfg.learner.steps,
            "world_size": self.topo.world,
            "lr_schedule": self.learner.schedule_state(),
        }
        path = checkpoint.save(
            self.out / "checkpoints", self.step, keep=self.cfg.run.keep_checkpoints, optimizer=optimizer, state=state,
            write_model=lambda d: self.learner.save(str(d), tokenizer_from=self.model_path, state=model),
            secrets=self._secrets(),
        )
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        self.last_checkpoint = {"path": str(path), "step": self.step, "bytes": size, "save_s": time.perf_counter() - t0}
        log.info("checkpoint %s: %.1f MB in %.2f s", path, size / 1e6, self.last_checkpoint["save_s"])
        return path

    def _secrets(self) -> dict[str, bytes]:
        out = {}
        if self._signing_key is not None:
            out["signing.key"] = self._signing_key.private_bytes_raw()
        identity = getattr(self.coordinator, "identity", None)
        if identity is not None:
            out["tls-cert.pem"], out["tls-key.pem"] = identity.cert_pem, identity.key_pem
        if self._drawn_token and self.coordinator is not None:
            out["token"] = self.coordinator.token.encode()
        return out

    def summary(self, wall_s: float) -> dict[str, Any]:
        rows, cfg = self.rows, self.cfg
        head, tail = rows[:5], rows[-5:]
        def mean(rs: list[dict[str, Any]], key: str) -> float | None:
            values = [r[key] for r in rs if r.get(key) is not None]
            return statistics.fmean(values) if values else None

        t_train = statistics.median(r["t_train_s"] for r in rows) if rows else 0.0  # rows: none if stopped at once
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
            "rollout_reward_first5": mean(head, "rollout_reward_mean"),  # every completed group, filtered or not
            "rollout_reward_last5": mean(tail, "rollout_reward_mean"),
            "rollout_accuracy_first5": mean(head, "rollout_accuracy"),
            "rollout_accuracy_last5": mean(tail, "rollout_accuracy"),
            "staleness_max": max((r["staleness_max"] for r in rows), default=0),
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
            "checkpoint": str(self.out / "checkpoint") if self._stop_signal is None else self.last_checkpoint["path"],
            "last_checkpoint": self.last_checkpoint,
            "stopped": signal.Signals(self._stop_signal).name if self._stop_signal is not None else None,
            "learner_ranks": self.topo.world,
            "quarantined": dict(self.coordinator.quarantined),  # worker id -> why (core/audit.py)
            "batches_dropped": self.batches_dropped,  # the learner step raised on them; training went on
            "batches_dropped_records_by_worker": dict(self.dropped_by_worker),
            "batches_withheld": self.batches_withheld,  # the audit's screen withheld every record (not trained on)
            "records_withheld_by_worker": dict(self.withheld_by_worker),  # by the audit's screen (core/audit.py)
            "config": redact(cfg.model_dump()),  # run.token never lands in a file the run writes
        }

    # -- cost-aware provisioning (paper §4.3): warm-up calibration and the live scheduler loop --------
    def calibrate(self, steps: int = 5, join_timeout_s: float = 120.0) -> dict[str, Any]:
        """Warm-up measurements (paper §4.3, §5.1) and the provisioning decision.

        - the calibration batch: the first R trajectories the pool delivers (consumed here);
        - mu_i: each worker's end-to-end throughput (trajectories accepted per second) while the learner
          runs the offline steps and the publication below (its own generation rate if it delivered none);
        - T_train: median of `steps` offline learner steps on that batch: real forward, backward and
          optimizer steps at learning rate 0, the optimizer state restored after, so the policy is unchanged;
        - T_bcast: one real publication of the unchanged policy as the next version (1; after a resume, one
          above the resumed version: a new number for the same weights),
          timed to its installation on q = 1/gamma of the workers.

        With scheduler.enabled the numbers go to a Scheduler: the cheapest workers reaching mu_target
        (provisioning.solver) stay active, the others are deactivated (registered, idle), and a LiveLoop keeps mu_pool near the
        target during run(). Writes DIR/calibration.json; returns the numbers and the decision text."""
        self.setup()
        if len(self.rows) > self._rows_at_setup:
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
        """T_train samples: `steps` real learner steps at learning rate 0, the optimizer state and the schedule
        restored after (Learner.offline)."""
        with self.learner.offline():
            return [self.learner.step(groups).t_train_s for _ in range(steps)]

    def _time_publication(self, timeout_s: float) -> float:
        """T_bcast: publish the unchanged policy as the next version and wait for its installation time."""
        self.version += 1  # the unchanged policy, published once to time the real path
        self.buffer.set_version(self.version)
        checkpoint.record_published(self.out, self.version)
        state = self.ops.snapshot_state(self.cfg.learner.snapshot_dtype)
        self._publish(self.version, state)
        self._note_published(self.version, state)
        t_bcast = None
        deadline = time.monotonic() + timeout_s
        while t_bcast is None and time.monotonic() < deadline:
            time.sleep(0.1)
            t_bcast = self.coordinator.t_bcast(self.version)[0]
        if t_bcast is None:
            raise Echo2Error(f"T_bcast calibration: snapshot v{self.version} not installed within {timeout_s:g} s")
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
                   "log_dir": str(self.out / "workers"), "threads": cfg.rollout.threads, "nice": cfg.rollout.nice,
                   "allow": allowances(self.coordinator.worker_config), "plaintext": not cfg.run.tls}
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

    def _open_sinks(self, fresh: bool) -> None:
        """The sinks of run.log_to, opened before the model loads so that config.json exists if anything fails.
        A fresh run starts metrics.jsonl (and the jsonl sink's other files) empty; a resumed one appends."""
        if fresh:
            reset_run_files(self.out)
        self.sinks = load_sinks(self.cfg.run.log_to, self.out, self.cfg.model_dump(mode="json"))

    def close(self, clean: bool = False) -> None:
        """Stop everything the run started. `clean`: the run finished without an error (the torchrun ranks
        then leave the process group together)."""
        self._stop_scheduler()
        if self.status is not None:
            self.status.stop()
            self.status = None
        if self.sinks is not None:
            sinks, self.sinks = self.sinks, None
            sinks.close()
        self._held.close()
        if self.ops is not None and self.topo.leader and not self._stopped_followers:
            self._stopped_followers = True
            self.ops.stop(clean)  # the other ranks leave distributed.follow
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
        if self.topo.world > 1:  # a follower meets the others at the barrier only if rank 0 finished cleanly too
            distributed.shutdown(clean and (self.topo.leader or self._leader_clean))


def _given_token(cfg: Config) -> str | None:
    """The token the user gave the run (run.token, run.token_file, $ECHO2_TOKEN), at least 128 bits; None: none."""
    given = given_token(cfg.run.token, cfg.run.token_file)
    return check_token(*given) if given else None


def _delivery(cfg: Config, token: str, signing_key: Any = None):
    """The snapshot delivery the config asks for (paper §4.2)."""
    b = cfg.broadcast
    if b.topology == "direct":
        return DirectPush()
    from echo2sdk.core.broadcast.manifest import Signer
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
        min_relay_bps=b.min_relay_mbps * 1e6 / 8,
        signer=Signer(signing_key) if signing_key is not None else None,
        tls=cfg.run.tls,  # the learner's relay port: TLS, or plaintext with run.tls = false
        relay_key_lookahead=cfg.kappa,  # the next publication's relay key goes out with each plan
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


@contextlib.contextmanager
def _log_above(bar: Any) -> Iterator[None]:
    """While the bar runs, console log lines go through tqdm.write (printed above the bar, which stays whole)
    at the console handler's level (WARNING under `echo2 run`): INFO goes to DIR/run.log only."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    root = logging.getLogger()
    console = [h for h in root.handlers if type(h) is logging.StreamHandler and h.stream in (sys.stdout, sys.stderr)]
    if bar.disable or not console:
        yield
        return
    before = set(root.handlers)
    with logging_redirect_tqdm(loggers=[root]):
        for h in set(root.handlers) - before:
            h.setLevel(max(c.level for c in console))  # logging_redirect_tqdm does not copy the level
        yield


@contextlib.contextmanager
def _one_line(model: str, show: bool) -> Iterator[None]:
    """Resolve `model` with stderr held back: when that took a while (a first use converts or fetches it), one
    line says so (if `show`) instead of the converter's progress bars; on an error all that was held is shown."""
    import io

    held, t0 = io.StringIO(), time.perf_counter()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise
    took = time.perf_counter() - t0
    if took > 2.0:
        log.info("model %r prepared in %.1f s (converted or fetched once into the model cache)", model, took)
        if show:
            print(f"echo2: model {model!r} prepared once in {took:.0f} s; later runs load it from the cache",
                  file=sys.stderr)


@contextlib.contextmanager
def _library_bars_off() -> Iterator[None]:
    """transformers' progress bars ("Loading weights", "Writing model shards") off: the learner process's
    console shows echo2's bar only."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _progress(total: int, enabled: bool, initial: int = 0):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="echo2 steps", unit="step", disable=not enabled, dynamic_ncols=True)


@contextlib.contextmanager
def _signals(on_signal: Any) -> Iterator[None]:
    """Route the first SIGTERM/SIGINT to `on_signal(signum)`; the handlers in place before come back at once,
    so a second signal acts as it would have. Only the main thread can set handlers; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: Any) -> None:
        for s, h in before.items():
            signal.signal(s, h)
        on_signal(signum)

    for s in before:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _coordinator_tls(cfg: Config, kept: dict[str, bytes]) -> dict[str, Any]:
    """The Coordinator's `tls` argument: False with run.tls = false; the certificate of run.tls_dir; else the one
    a checkpoint kept (workers that pinned it re-join the resumed run); empty: one made for this run."""
    from echo2sdk.runtime.tls import Identity

    if not cfg.run.tls:
        return {"tls": False}
    if cfg.run.tls_dir:
        return {"tls": Identity.load(cfg.run.tls_dir)}
    if "tls-key.pem" not in kept or "tls-cert.pem" not in kept:
        return {}
    return {"tls": Identity(kept["tls-cert.pem"], kept["tls-key.pem"])}


def _log_to(path: Path) -> None:
    root = logging.getLogger("echo2sdk")
    if not any(isinstance(h, logging.FileHandler) and h.baseFilename == str(path.resolve()) for h in root.handlers):
        fh = logging.FileHandler(path)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(fh)
    root.setLevel(logging.INFO)
