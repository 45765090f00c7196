"""The run recipe: setup -> run -> save -> close (torchtune's recipe shape).

Algorithm 1 of the paper, learner side: wait until R admissible trajectories (v >= v_t - S) are in the
buffer, update, advance v_t, publish a snapshot every kappa updates; rollout, dissemination and
training overlap because workers keep generating under their installed version meanwhile.

The Trainer holds components and calls them; none of them calls back into it: `build` turns the Config
into arguments, `Batches` waits for each batch, the learner steps on it, `Publication` owns v_t and publishing,
`AuditReplay` audits the workers, `RunMetrics` keeps the rows (each component reports its own columns),
`RunSecrets` keeps the token and signing key, `Calibration` / `Provisioning` measure and provision the pool, the
`local` provider starts the run's own workers, `console` owns the terminal.

Checkpoints (checkpoint.py) are written every run.save_every steps, after the last step and on
SIGTERM/SIGINT; `Trainer(cfg, resume=DIR)` continues from one. Under torchrun the learner is sharded over
the ranks (distributed.py): rank 0 runs this recipe, the other ranks follow it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from echo2sdk.config import Config
from echo2sdk.core.audit import BatchWithheld
from echo2sdk.core.bill import bill
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.contracts import TaskAdapter
from echo2sdk.core.verdict import sizing_filter_rate
from echo2sdk.errors import ConfigError, Echo2Error
from echo2sdk.runtime.broadcast.bootstrap import ModelFolder
from echo2sdk.runtime.coordinator import Coordinator
from echo2sdk.runtime.files import write_json_atomic
from echo2sdk.runtime.learner import build, checkpoint, console, distributed
from echo2sdk.runtime.learner.batches import Batch, Batches, DataLimits, Stopped
from echo2sdk.runtime.learner.calibration import Calibration, Provisioning, decide
from echo2sdk.runtime.learner.metrics import RunMetrics, shown_level, summary
from echo2sdk.runtime.learner.health import Health
from echo2sdk.runtime.learner.publication import Publication
from echo2sdk.runtime.learner.replay import AuditReplay
from echo2sdk.runtime.learner.run_secrets import RunSecrets
from echo2sdk.runtime.learner.tasks import CountedTasks
from echo2sdk.runtime.providers.local import LocalProvider
from echo2sdk.runtime.sinks import load_sinks, redact
from echo2sdk.runtime.sinks.jsonl import reset_run_files

if TYPE_CHECKING:
    from echo2sdk.core.learner import StepStats

__all__ = ["Trainer"]

log = logging.getLogger("echo2sdk.learner")

LOCAL_GRACE_S = 10.0  # how long the run's own workers get to leave after the coordinator's shutdown


class Trainer:
    """The recipe: `setup` (learner, buffer, coordinator, local workers), `run` (learner.steps updates with a
    checkpoint every run.save_every, then `save` and summary.json), `close` (cleanup). `calibrate` is the
    optional warm-up between setup and run. `resume`: a run folder or a checkpoint folder to continue from."""

    def __init__(self, cfg: Config, adapter: TaskAdapter | None = None, resume: str | os.PathLike[str] | None = None):
        self.cfg, self.out, self._adapter, self.resume = cfg, Path(cfg.run.out), adapter, resume
        self.topo = distributed.from_env()
        if self.topo.world > 1 and cfg.scheduler.enabled:
            raise ConfigError("scheduler.enabled: warm-up calibration runs on one learner process; "
                              "start without --nproc-per-node, or set scheduler.enabled = false")
        # run.token, run.token_file or $ECHO2_TOKEN, checked now (>= 128 bits), before anything is loaded
        self.secrets = RunSecrets(build.run_token(cfg) if self.topo.leader else None)
        self.step = 0  # updates done (the metrics' step), across resumes
        # what setup() makes: the policy's folder, the learner and its calls that are collectives under torchrun;
        # on rank 0 the buffer, the coordinator and the recipe's components over them (_setup_leader)
        self.model_path = ""
        self.learner: Any = None
        self.ops: distributed.Lockstep | None = None
        self.buffer: StalenessBuffer | None = None
        self.coordinator: Coordinator | None = None
        self.publication: Publication | None = None
        self.replay: AuditReplay | None = None
        self.local: LocalProvider | None = None
        self.batches: Batches | None = None
        self.provisioning: Provisioning | None = None
        self._run_log: Any = None  # the handler writing run.log, removed at close
        self.metrics = RunMetrics(self.out, None, cfg.learner.trajectories_per_step, cfg.kappa, cfg.rollout.group_size,
                                  cfg.scheduler.max_filter_rate)
        self.health = Health()  # warnings from each metrics row (no reward signal, adapter failures)
        self.last_checkpoint: dict[str, Any] | None = None
        self.last_writes = checkpoint.LastWrites(self.out)  # the last checkpoint and the final policy
        self.status: Any = None  # the live status page (run.status_port), a StatusServer once started
        self._stop = threading.Event()  # set by the first SIGTERM/SIGINT
        self._stop_signal: int | None = None
        self._rows_at_setup = 0  # rows restored by a resume (calibrate runs before this process trains)
        self._held = contextlib.ExitStack()  # process-wide settings undone by close()
        self._ready = self._stopped_followers = self._leader_clean = False

    # -- what tests, benches and the status page read ------------------------------------------------
    @property
    def version(self) -> int:
        """v_t (Publication owns it)."""
        return self.publication.version if self.publication is not None else 0

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.metrics.rows

    @property
    def procs(self) -> list:
        """The run's own local worker processes, in start order."""
        return list(self.local.procs.values()) if self.local is not None else []

    @property
    def audit(self) -> Any:
        """The worker audit (core/audit.py SamplerAudit); None when learner.lie_threshold is 0."""
        return self.replay.audit

    @property
    def last_batch(self) -> list:
        return self.batches.last

    # -- setup -------------------------------------------------------------------------------------
    def setup(self) -> None:
        if self._ready:
            return
        from echo2sdk.core.learner import Learner
        from echo2sdk.weights import resolve_model

        cfg = self.cfg
        distributed.init(self.topo)
        ckpt = checkpoint.to_resume(self.out, self.resume, self.topo.leader)
        if self.topo.leader:
            self.out.mkdir(parents=True, exist_ok=True)
            self._run_log = console.log_to(self.out / "run.log")
            if ckpt is None:  # a fresh run starts metrics.jsonl (and the jsonl sink's other files) empty
                reset_run_files(self.out)
            # opened before the model loads so that config.json exists if anything fails
            self.metrics.sinks = load_sinks(cfg.run.log_to, self.out, cfg.model_dump(mode="json"))
        self._held.enter_context(console.library_bars_off())  # the console keeps one bar, echo2's
        with console.one_line(cfg.model.policy, show=self.topo.leader and cfg.run.progress):  # not three bars
            self.model_path = resolve_model(cfg.model.policy)
        self.learner = Learner(self.model_path, **build.learner_args(cfg),
                               weights_from=str(ckpt.path) if ckpt else None, distributed=self.topo.world > 1)
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
        resuming), the components, the resumed publication, the status page, the local workers."""
        from echo2sdk.plugins import load_adapter

        cfg, L = self.cfg, self.cfg.learner
        adapter = self._adapter or load_adapter(cfg.task.adapter, cfg.task.options)
        self.buffer = StalenessBuffer(**build.buffer_args(cfg))
        kept = ckpt.secrets() if ckpt is not None else {}
        tasks = CountedTasks(adapter.tasks(cfg.run.seed), skip=ckpt.state.get("tasks_issued", 0) if ckpt else 0)
        self.coordinator = self._coordinator(kept, tasks)
        if ckpt is not None:  # the prompt filter's history and counts (learner.prompt_skip)
            self.coordinator.handout.load_state_dict(ckpt.state.get("handout") or {})
        host, port = self.coordinator.start()
        log.info("coordinator on %s:%d (R=%d, S=%d, kappa=%d); learner %s (precision=%s) on %d rank(s)", host, port,
                 L.trajectories_per_step, L.staleness, cfg.kappa, "bf16 autocast" if self.learner.autocast else "fp32",
                 L.precision, self.topo.world)
        self._components(host, port)
        if ckpt is not None:
            self._resume_publication(ckpt)
        elif self.replay.replaying:  # version 0: the weights workers start from
            self.replay.keep(0, self.ops.snapshot_state(L.snapshot_dtype), self.buffer.floor)
        self._start_status()
        logs = self.out / "workers"
        logs.mkdir(exist_ok=True)
        for i in range(cfg.rollout.workers):
            if ckpt is None:
                (logs / f"local-{i}.log").write_text("")
            # appended to: a worker orphaned by a killed learner may still write here while its successor does
            self.local.start(f"local-{i}")

    def _coordinator(self, kept: dict[str, bytes], tasks: CountedTasks) -> Coordinator:
        """The coordinator with the run's token (given, kept by the checkpoint, or drawn) and signing key."""
        cfg = self.cfg
        token = self.secrets.token(kept)
        signing_key = self.secrets.load_signing_key(kept, cfg.broadcast.topology)
        return Coordinator(
            buffer=self.buffer,
            tasks=tasks,
            worker_config=build.worker_config(cfg, self.model_path),
            base=ModelFolder(self.model_path, cfg.learner.snapshot_dtype),  # for workers started with --bootstrap
            vocab_size=self.learner.vocab_size,
            prompt_filter=build.prompt_filter(cfg),
            **build.coordinator_args(cfg, token, signing_key),
            **build.coordinator_tls(cfg, kept),
        )

    def _components(self, host: str, port: int) -> None:
        """The recipe's components over the buffer, the coordinator and the learner (rank 0)."""
        cfg, L, ro = self.cfg, self.cfg.learner, self.cfg.rollout
        self.publication = Publication(self.coordinator, self.buffer, self.ops, self.out, kappa=cfg.kappa,
                                       dtype=L.snapshot_dtype,
                                       anchor_every=cfg.broadcast.anchor_every if cfg.broadcast.delta else None)
        self.replay = AuditReplay(self.coordinator, self.ops, lie_threshold=L.lie_threshold,
                                  lie_var_threshold=L.lie_var_threshold, replay_n=L.audit_replay)
        self.local = LocalProvider(f"{host}:{port}", self.coordinator.token, log_dir=self.out / "workers",
                                   threads=ro.threads, nice=ro.nice, allow=build.worker_allowances(cfg, self.coordinator),
                                   plaintext=not cfg.run.tls, grace_s=LOCAL_GRACE_S, run_dir=self.out)
        limits = DataLimits(L.data_timeout_s, cfg.run.heartbeat_s, L.filter_patience, self.out / "workers",
                            max_wait_s=L.max_wait_s, min_groups=L.min_groups, partial_lr=L.partial_lr)
        self.batches = Batches(self.buffer, self.coordinator, self.local, limits, self._stop)
        self.provisioning = Provisioning(cfg, self.coordinator, self.metrics, self.out)

    def _start_status(self) -> None:
        """With run.status_port: the live status page, its URL and token printed on the console (not logged)."""
        run = self.cfg.run
        if run.status_port is None:
            return
        from echo2sdk.runtime.learner.status import RunView, StatusServer, page_state

        view = RunView(self.out.name, self.cfg, self.coordinator, self.buffer, self.metrics, self.publication)
        self.status = StatusServer(lambda: page_state(view), host=run.status_host, port=run.status_port)
        url = self.status.start()
        log.info("status page on %s (its token was printed on the console)", url)
        print(f"echo2: status page {url}?token={self.status.token}", file=sys.stderr, flush=True)

    def _resume_publication(self, ckpt: checkpoint.Checkpoint) -> None:
        """Continue the version sequence above everything ever published, cut metrics.jsonl back to the
        checkpoint's step and publish the resumed weights before any worker joins."""
        # the mark of the folder the checkpoint came from too: resuming into another --out must not reuse numbers
        published = max(checkpoint.published_mark(self.out), checkpoint.published_mark(checkpoint.run_folder(ckpt.path)),
                         ckpt.state.get("published", 0))
        self.publication.start_at(checkpoint.resume_version(ckpt.version, published))
        self.metrics.restore(ckpt.state.get("metrics_bytes", 0))
        self._keep(self.publication.publish_now())
        log.info("resumed from %s: step %d, version %d (checkpoint v%d, published up to v%d); buffer starts empty",
                 ckpt.path, self.step, self.version, ckpt.version, published)

    def _keep(self, state: dict[str, Any] | None) -> None:
        """A state just published: kept for the audit's replay while records may claim its version."""
        if state is not None:
            self.replay.keep(self.version, state, self.buffer.floor)

    # -- run ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """setup, the remaining of learner.steps updates (one metrics.jsonl row each; a checkpoint every
        run.save_every and after the last), save, summary.json; returns the summary. SIGTERM/SIGINT end the
        run after the current update with a checkpoint ("stopped" in the summary). Under torchrun the ranks
        other than 0 follow rank 0's learner calls and return {}."""
        self.setup()
        if not self.topo.leader:
            with console.signals(lambda signum: None):  # rank 0 decides when to stop; torchrun forwards signals to all
                self._leader_clean = distributed.follow(self.learner).clean
            return {}
        steps = self.cfg.learner.steps
        t_start = time.perf_counter() - (self.rows[-1]["time_s"] if self.rows else 0.0)  # time_s goes on across resumes
        with (
            console.progress(steps, self.cfg.run.progress, initial=self.step) as bar,
            console.log_above(bar),
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo2-publish") as publisher,
            console.signals(self._on_signal),
        ):
            try:
                for step in range(self.step + 1, steps + 1):
                    self._show(self.train_step(step, publisher, t_start), bar)
                    self.step = step
                    if self._stop_signal is None and self._checkpoint_due(step):
                        self.save_checkpoint()
                    if self._stop_signal is not None:
                        break
            except Stopped:
                pass
            self.last_writes.attempt("the last checkpoint", self.save_checkpoint)  # or where a signal stopped the run
        self._log_run_end()
        if self._stop_signal is None:
            self.last_writes.attempt(self.last_writes.FINAL_POLICY, self.save)
        out = self.summary(time.perf_counter() - t_start)
        write_json_atomic(self.out / "summary.json", out, indent=2)  # a full disk leaves no torn summary
        return out

    def _on_signal(self, signum: int) -> None:
        self._stop_signal = signum
        self._stop.set()
        log.warning("%s: stopping after the current update with a checkpoint (send it again to stop at once)",
                    signal.Signals(signum).name)

    def _checkpoint_due(self, step: int) -> bool:
        every = self.cfg.run.save_every
        return every > 0 and step % every == 0 and step < self.cfg.learner.steps

    def train_step(self, step: int, publisher: Executor, t_start: float) -> dict[str, Any]:
        """One update of Algorithm 1: the next batch of k = R/n admissible groups and the learner's step on it
        (`_learn`), the batch's audit, v_t advanced, a snapshot published every kappa updates. Returns the step's
        metrics row: each component's columns (recorded through the sinks)."""
        batch, st = self._learn(self._groups_per_step())
        audit = self.replay.audit_batch(batch.v_t, batch.records, st.audit_sums, st.withheld)
        self.publication.advance()
        self._keep(self.publication.publish_if_due(publisher))
        now = time.perf_counter()
        self.metrics.log_batch(step, batch.records, batch.deltas, self.cfg.run.log_samples_every,
                               self.cfg.run.log_samples)
        row = self.metrics.record(
            {"step": step, "version": self.version, "time_s": round(now - t_start, 3)}, batch.metrics(now),
            st.metrics(), self.publication.metrics(), self.replay.metrics(audit), self.batches.metrics(),
            self.coordinator.handout.metrics(),
            self.metrics.since_last(self.buffer.stats(), self.coordinator.stats(), batch.records,
                                    self.buffer.task_names))
        self.health.check(row)  # no reward signal, adapter failures: warnings on the console and in run.log
        return row

    def _learn(self, k: int) -> tuple[Batch, StepStats]:
        """The update: the next batch (k groups with v >= v_t - S, waited for and sampled), the audit's screen of it
        and the learner's step on it. A batch the screen withheld whole is audited and counted (batches_withheld),
        one the step raised on is dropped and counted (batches_dropped); the next batch is then waited for."""
        while True:
            batch = self.batches.next(k, self.version)
            try:
                st = self.ops.step(batch.groups, self.replay.screen(batch.v_t, batch.groups), batch.lr_scale)
            except BatchWithheld as e:
                self.replay.withheld_batch(batch.v_t, batch.records, e.audit_sums, e.withheld)
            except (ValueError, RuntimeError) as e:
                self.batches.drop(batch, e)
            else:
                self.batches.trained(batch)
                return batch, st

    @staticmethod
    def _show(row: dict[str, Any], bar: Any) -> None:
        bar.update(1)
        reward, acc = shown_level(row)
        postfix = {"reward": f"{reward:.3f}", **({"acc": f"{acc:.2f}"} if acc is not None else {})}
        bar.set_postfix(**postfix, wait=f"{row['learner_wait_s']:.1f}s")

    def _log_run_end(self) -> None:
        """What is known only at the end: T_bcast of every published version, and the staleness of everything
        the learner sampled (the buffer's histogram)."""
        self.metrics.sinks.log_table(self.step, "t_bcast", self.publication.bcast_table())
        self.metrics.sinks.log_histogram(self.step, "staleness_total", self.buffer.stats()["staleness_hist"])

    def _groups_per_step(self) -> int:
        return self.cfg.learner.trajectories_per_step // self.cfg.rollout.group_size  # k = R / n

    # -- save / summarize --------------------------------------------------------------------------
    def save(self) -> None:
        """The final policy as a plain Hugging Face folder, DIR/checkpoint."""
        state = self.ops.model_state() if self.topo.world > 1 else None
        self.learner.save(str(self.out / "checkpoint"), tokenizer_from=self.model_path, state=state)

    def save_checkpoint(self) -> Path:
        """Write DIR/checkpoints/step-N (checkpoint.py): the policy, the optimizer state, RNG states,
        step and version, the version high-water mark, the tasks handed out, the length of metrics.jsonl and
        the run's secrets (the manifest signing key, the coordinator's certificate, a drawn token)."""
        t0 = time.perf_counter()
        model = self.ops.model_state() if self.topo.world > 1 else None
        optimizer = self.ops.optimizer_state()
        handout = self.coordinator.handout.state_dict()  # the stream's position and the filter, at one moment
        state = {
            "version": self.version,
            "published": max(self.publication.published, default=0),
            "tasks_issued": handout["tasks_issued"],
            "metrics_bytes": self.metrics.bytes,
            "steps_planned": self.cfg.learner.steps,
            "world_size": self.topo.world,
            "lr_schedule": self.learner.schedule_state(),
            "handout": {k: v for k, v in handout.items() if k != "tasks_issued"},
        }
        path = checkpoint.save(
            self.out / "checkpoints", self.step, keep=self.cfg.run.keep_checkpoints, optimizer=optimizer, state=state,
            write_model=lambda d: self.learner.save(str(d), tokenizer_from=self.model_path, state=model),
            secrets=self.secrets.to_keep(self.coordinator),
        )
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        self.last_checkpoint = {"path": str(path), "step": self.step, "bytes": size, "save_s": time.perf_counter() - t0}
        log.info("checkpoint %s: %.1f MB in %.2f s", path, size / 1e6, self.last_checkpoint["save_s"])
        return path

    def summary(self, wall_s: float) -> dict[str, Any]:
        """summary.json (metrics.summary): the run's measured capacity numbers, then each component's part."""
        cfg, coord, stopped = self.cfg, self.coordinator, self._stop_signal
        workers = coord.worker_table()
        out = summary(
            self.rows, wall_s, S=cfg.learner.staleness, kappa=cfg.kappa, R=cfg.learner.trajectories_per_step,
            group_size=cfg.rollout.group_size,
            mu_pool=sum(r for w in coord.workers.values() if (r := w.rollouts_per_s) > 0),
            buffer=self.buffer.stats(), coordinator=coord.stats(), workers=workers,
            # what the run leaves to load: DIR/checkpoint, or the last checkpoint where a signal stopped the run
            checkpoint=self.last_writes.final_policy() if stopped is None else (self.last_checkpoint or {}).get("path"),
            last_checkpoint=self.last_checkpoint,
            save_errors=self.last_writes.listed(),  # the run's last writes that failed
            stopped=signal.Signals(stopped).name if stopped is not None else None,
            learner_ranks=self.topo.world,
            quarantined=dict(coord.quarantined),  # worker id -> why (core/audit.py)
            **self.batches.summary(), **self.replay.summary(),
            prompt_filter=coord.handout.stats(),
            bill=bill(self.rows, workers, cfg.scheduler.prices, wall_s),  # rollouts, machine-time, $ per point gained
            warnings=list(self.health.warnings),  # what runtime/learner/health.py warned about during the run
            config=redact(cfg.model_dump()),  # run.token never lands in a file the run writes
        )
        if cfg.broadcast.delta:
            out["deltas"] = self.publication.delta_summary(coord.publications.sent)
        if cfg.broadcast.store:  # writes made and failed, workers told to read it, workers that could not
            out["store"] = {"url": coord.publications.store.url, **coord.publications.store_counts}
        return out

    # -- cost-aware provisioning (paper §4.3): warm-up calibration and the live scheduler loop --------
    def calibrate(self, steps: int = 5, join_timeout_s: float = 120.0) -> dict[str, Any]:
        """Warm-up measurements (calibration.Calibration: T_train of `steps` offline steps, T_bcast of one real
        publication, mu per worker) and the provisioning decision. With scheduler.enabled the numbers go to a
        Scheduler: the cheapest workers reaching mu_target (provisioning.solver) stay active, the others are
        deactivated (registered, idle), and a LiveLoop keeps mu_pool near the target during run(). Writes
        DIR/calibration.json; returns the numbers and the decision text."""
        self.setup()
        if len(self.rows) > self._rows_at_setup:
            raise Echo2Error(f"calibrate() runs before training (learner at version {self.version})")
        cfg, L, sc = self.cfg, self.cfg.learner, self.cfg.scheduler
        initial = self.provisioning.launch_initial()  # a fleet with no local workers calibrates on these
        cal = Calibration(self.coordinator, self.batches, self.learner, self.publication,
                          workers=cfg.rollout.workers + len(initial), logs=self.out / "workers")
        measured, state = cal.measure(self._groups_per_step(), steps, join_timeout_s)
        self._keep(state)
        measured["filter_rate"] = sizing_filter_rate(measured["filter_rate"], sc.max_filter_rate)
        out = decide(measured, cal.prices(sc.prices), R=L.trajectories_per_step, S=L.staleness, kappa=cfg.kappa,
                     gamma=sc.gamma, solver=cfg.provisioning.solver)
        log.info("warm-up calibration:\n%s", out["decision"])
        if sc.enabled:
            self.provisioning.start(out)
        (self.out / "calibration.json").write_text(json.dumps(out, indent=2, default=str))
        return out

    # -- cleanup -----------------------------------------------------------------------------------
    def close(self, clean: bool = False) -> None:
        """Stop everything the run started. `clean`: the run finished without an error (the torchrun ranks
        then leave the process group together)."""
        if self.provisioning is not None:
            self.provisioning.stop()
        if self.status is not None:
            self.status.stop()
            self.status = None
        if self.metrics.sinks is not None:
            sinks, self.metrics.sinks = self.metrics.sinks, None
            sinks.close()
        self._held.close()
        if self.ops is not None and self.topo.leader and not self._stopped_followers:
            self._stopped_followers = True
            self.ops.stop(clean)  # the other ranks leave distributed.follow
        if self.coordinator is not None:
            self.coordinator.stop()
        if self.local is not None:
            self.local.close()  # they leave on the coordinator's shutdown; the rest are terminated
        console.stop_logging_to(self._run_log)  # a later run in this process logs elsewhere
        self._run_log = None
        if self.topo.world > 1:  # a follower meets the others at the barrier only if rank 0 finished cleanly too
            distributed.shutdown(clean and (self.topo.leader or self._leader_clean))
