"""echo2 against TRL's GRPOTrainer: wall time to reach a correctness level, on this machine, in one run.

Both train the same model from the same weights on the same task, one after the other, each in a fresh
process: first echo2's main job (examples/math_smollm2.toml: the learner and its 2 local rollout worker
processes, through echo2sdk's Trainer), then TRL's GRPOTrainer (generation in-process with transformers'
`generate`). TRL's GRPOConfig is derived from the same echo2 Config (the table `trl_config` fills), so a
`--set` override changes both sides:

    echo2 config                        TRL GRPOConfig
    model.policy (resolved folder)      the same folder, loaded as AutoModelForCausalLM (float32)
    task (math adapter, run.seed)       prompts: the adapter's task stream with the same seed, in order
                                        (shuffle_dataset=False), as chat messages (the same chat template);
                                        reward: the adapter's score on the completion text
    learner.trajectories_per_step  R    generation batch: per_device_train_batch_size x gradient_accumulation_steps
    learner.micro_batch                 per_device_train_batch_size (R / micro_batch accumulation steps)
    rollout.group_size             n    num_generations
    rollout.max_new_tokens              max_completion_length
    rollout.temperature / top_p / top_k / min_p   temperature / top_p / top_k / min_p
    learner.lr, weight_decay, grad_clip learning_rate, weight_decay, max_grad_norm (AdamW, torch's defaults)
    learner.lr_scheduler, warm-up       lr_scheduler_type, warmup_steps (x updates_per_step)
    learner.beta, epsilon, epsilon_high, loss_type   beta, epsilon, epsilon_high, loss_type
    learner.scale_rewards               scale_rewards "group" | "none"
    learner.updates_per_step            num_iterations (one echo2 step = one generation round = that many
                                        optimizer steps; max_steps = steps x num_iterations)
    learner.precision (auto)            bf16 (autocast) exactly when echo2's learner autocasts
    learner.gradient_checkpointing      gradient_checkpointing (TRL's default is true; echo2's false)
    learner.threads                     torch.set_num_threads in the TRL process (both: --threads, default all cores)
    run.seed                            seed

The echo2 side runs as the main job does, with dynamic sampling (learner.filter_zero_variance = true: a group
whose members all got the same reward is not trained on) and learner.max_wait_s (--max-wait-s, default 3 s: a
step that has waited that long trains on the informative groups it has). Its accuracy of a step is then
`rollout_accuracy`: the fraction of every completion the workers delivered since the previous step that the
math adapter scores correct, filtered groups included; TRL's is that of the step's generation batch (TRL
trains on every group). Both count what the policy generated, not what was trained on. A step at which no
group completed has no accuracy and is left out of both curves and windows. --filter off is the earlier
comparison: learner.filter_zero_variance = false, no max_wait_s, and the accuracy of the R completions each
side trains on.

Correctness level: TRL's mean accuracy over its last 5 steps (fewer when --steps < 5). Each side's time to
reach it: the wall time (from the start of its process's work, imports excluded, model loading and worker
start-up included) at the end of the first step whose trailing 5-step mean accuracy reaches the level.
ratio = echo2's time / TRL's time; the goal is ratio <= 0.5 (issue 35). Also printed: each side's trailing
5-step mean accuracy at TRL's total wall time (over the last 5 steps that ended by then), and each side's accuracy
pooled over its newest 5 x R completions by then (whole steps: a 5-step window holds 80 of TRL's completions and
as few as 20 of echo2's, so the pooled figure compares equal samples). echo2's steps are
cheaper than TRL's (partial batches after max_wait_s, generation overlapped), so --echo2-steps lets it run
about as long as TRL does; TRL runs --steps steps either way.

Prints JSON lines: the parameters (both sides' settings and what differs), one line per side with its
per-step wall time, accuracy and reward, and the comparison; draws accuracy vs wall time and vs step for
both in one PNG (--png).

    # the comparison in docs/recipes.md (SmolLM2-135M, math level 2, 25 steps each, two seeds, nothing else
    # running on the machine): ~15-20 min a seed on 2 cores
    .venv/bin/python bench/vs_trl.py --steps 25 --echo2-steps 60 --set task.options.difficulty=2 --set run.seed=0 \\
        --png runs/vs_trl/l2_s0.png
    # the smoke path (tests/test_benchmarks.py):
    .venv/bin/python bench/vs_trl.py --model tiny-random --steps 2 --set rollout.max_new_tokens=8

TRL is the optional extra `bench` (pip install -e ".[bench]"); without it the bench says so and exits with status 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = ROOT / "examples" / "math_smollm2.toml"
WINDOW = 5  # steps averaged for the level and for reaching it


DIFFERS = [
    "echo2's accuracy of a step is that of the R completions it trains on, generated by policies up to S-1 "
    "versions old; TRL's is that of the completions generated by the current policy",
    "advantage std: echo2 the population std of a group, TRL the sample std (n - 1)",
    "both sides run on the same cores; the echo2 learner and TRL use --threads torch threads each",
]


def differs(cfg) -> list[str]:
    """What the two sides do differently, for the parameters line."""
    r = cfg.rollout
    priority = "under SCHED_IDLE" if r.nice == "idle" else f"nice {r.nice}"
    return [
        f"echo2 generates on separate rollout worker processes ({r.workers}, {r.threads} torch thread(s) each, "
        f"{priority}: rollout.nice) asynchronously (staleness S from the config, truncated importance weights); TRL "
        "generates in-process, synchronously, with the training model between its updates",
        *DIFFERS,
    ]


# -- the shared configuration ------------------------------------------------------------------------
def side_settings(filter_: str, max_wait_s: float) -> dict[str, object]:
    """What the echo2 side changes in the main job (learner keys): dynamic sampling on with a bounded wait, or off."""
    if filter_ == "on":
        return {"filter_zero_variance": True, "max_wait_s": max_wait_s}
    return {"filter_zero_variance": False, "max_wait_s": None}


def echo2_config(model: str, steps: int, threads: int, out: str, learner: dict[str, object], extra: list[str]):
    """The main job with the `learner` keys set, then the user's --set overrides (which win)."""
    from echo2sdk.config import load_config

    cfg = load_config(MAIN_JOB, [
        f'model.policy="{model}"', f"learner.steps={steps}", f"learner.threads={threads}",
        "run.progress=false", f'run.out="{out}"', *extra,
    ])
    for key, value in learner.items():
        if not any(item.partition("=")[0].strip() == f"learner.{key}" for item in extra):
            setattr(cfg.learner, key, value)  # validated on assignment (None included: TOML has no null)
    return cfg


def trl_config(cfg, out: str, bf16: bool) -> dict:
    """GRPOConfig keyword arguments (TRL 1.16) that mirror echo2 Config `cfg` (the table in the docstring)."""
    L, r = cfg.learner, cfg.rollout
    R, n, mu = L.trajectories_per_step, r.group_size, L.updates_per_step
    micro = L.micro_batch if R % L.micro_batch == 0 else R
    from echo2sdk.core import lr_schedule

    return dict(
        output_dir=out, use_cpu=True, bf16=bf16, fp16=False, seed=cfg.run.seed, report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=micro, gradient_accumulation_steps=R // micro,
        max_steps=L.steps * mu, num_iterations=mu, num_generations=n, shuffle_dataset=False,
        max_completion_length=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
        min_p=r.min_p or None, learning_rate=L.lr, weight_decay=L.weight_decay, max_grad_norm=L.grad_clip,
        lr_scheduler_type=L.lr_scheduler,
        warmup_steps=lr_schedule.warmup_steps(L.steps, L.warmup_steps, L.warmup_ratio) * mu,
        beta=L.beta, epsilon=L.epsilon, epsilon_high=L.epsilon_high, loss_type=L.loss_type,
        scale_rewards="group" if L.advantages_scaled else "none", mask_truncated_completions=False,
        gradient_checkpointing=L.gradient_checkpointing, log_completions=False,
    )  # fmt: skip


# -- one side, in its own process ------------------------------------------------------------------
def run_echo2(cfg) -> dict:
    import torch  # noqa: F401 - the clock starts after the heavy imports, as on TRL's side

    from echo2sdk.runtime.learner.recipe import Trainer

    t0 = time.perf_counter()
    tr = Trainer(cfg)
    try:
        tr.setup()
        t_run = time.perf_counter()
        tr.run()
        t_end = time.perf_counter()
        autocast = tr.learner.autocast
    finally:
        tr.close()
    rows = [json.loads(line) for line in (Path(cfg.run.out) / "metrics.jsonl").read_text().splitlines()]
    if any(row["accuracy"] is None for row in rows):
        raise RuntimeError(f"task.adapter={cfg.task.adapter!r} reports no correctness (Score.correct): "
                           "no accuracy to compare")
    setup_s = t_run - t0
    key = "rollout_accuracy" if cfg.learner.filter_zero_variance else "accuracy"  # what was generated (docstring)
    rows = [row for row in rows if row[key] is not None]  # a step no group completed before
    reward = "rollout_reward_mean" if cfg.learner.filter_zero_variance else "reward_mean"
    completions = "rollouts" if cfg.learner.filter_zero_variance else "trajectories"  # what the accuracy is over
    return {"setup_s": setup_s, "total_s": t_end - t0, "bf16": autocast, "accuracy_of": key,
            "wall_s": [setup_s + row["time_s"] for row in rows], "accuracy": [row[key] for row in rows],
            "completions": [row[completions] for row in rows],
            "reward": [row[reward] for row in rows], "steps_with_accuracy": len(rows), "steps": [row["step"] for row in rows]}


def run_trl(cfg, threads: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from echo2sdk.core.learner import bf16_is_fast
    from echo2sdk.plugins import load_adapter
    from echo2sdk.weights import resolve_model

    torch.set_num_threads(threads)
    L = cfg.learner
    R, mu = L.trajectories_per_step, L.updates_per_step
    t0 = time.perf_counter()
    path = resolve_model(cfg.model.policy)
    adapter = load_adapter(cfg.task.adapter, cfg.task.options)
    tasks = list(itertools.islice(adapter.tasks(cfg.run.seed), L.steps * R // cfg.rollout.group_size))
    by_id = {t.id: t for t in tasks}
    data = Dataset.from_list([{"prompt": [dict(m) for m in t.messages], "task_id": t.id} for t in tasks])
    rounds: list[tuple[float, float]] = []  # per generation round: (accuracy, mean reward)

    def math_reward(prompts, completions, task_id, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = [adapter.score(by_id[i], text) for i, text in zip(task_id, texts, strict=True)]
        rounds.append((statistics.fmean(bool(s.correct) for s in scores), statistics.fmean(s.reward for s in scores)))
        return [float(s.reward) for s in scores]

    ends: list[float] = []
    began: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            began.append(time.perf_counter() - t0)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % mu == 0:  # the last optimizer step on this round's completions
                ends.append(time.perf_counter() - t0)

    bf16 = bf16_is_fast()
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(**trl_config(cfg, out, bf16))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        trainer = GRPOTrainer(model=model, reward_funcs=math_reward, args=args, train_dataset=data,
                              processing_class=AutoTokenizer.from_pretrained(path), callbacks=[Clock()])
        trainer.train()
        t_end = time.perf_counter() - t0
    if len(rounds) != L.steps or len(ends) != L.steps:
        raise RuntimeError(f"TRL ran {len(rounds)} generation rounds and {len(ends)} steps, expected {L.steps}")
    return {"setup_s": began[0], "total_s": t_end, "bf16": bf16, "wall_s": ends, "accuracy_of": "generation batch",
            "steps_with_accuracy": len(ends), "steps": list(range(1, len(ends) + 1)),
            "accuracy": [a for a, _ in rounds], "reward": [r for _, r in rounds], "completions": [R] * len(ends)}


def _side(argv: list[str]) -> None:
    """`vs_trl.py _side echo2|trl CONFIG.json RESULT.json THREADS`: one side, its result as JSON."""
    from echo2sdk.config import validate_config

    side, cfg_file, result, threads = argv
    cfg = validate_config(json.loads(Path(cfg_file).read_text()), cfg_file)
    out = run_echo2(cfg) if side == "echo2" else run_trl(cfg, int(threads))
    Path(result).write_text(json.dumps(out))


# -- the comparison --------------------------------------------------------------------------------
def time_to_level(wall_s: list[float], accuracy: list[float], level: float, window: int) -> tuple[float, int] | None:
    """(wall time, step) at the end of the first step whose trailing `window`-step mean accuracy >= level."""
    for k in range(window, len(accuracy) + 1):
        if statistics.fmean(accuracy[k - window : k]) >= level - 1e-9:
            return wall_s[k - 1], k
    return None


def accuracy_at(wall_s: list[float], accuracy: list[float], t: float, window: int) -> float | None:
    """The mean accuracy of the last `window` steps that ended by time `t` (fewer if fewer did; None: none)."""
    done = [a for w, a in zip(wall_s, accuracy, strict=True) if w <= t + 1e-9]
    return statistics.fmean(done[-window:]) if done else None


def pooled_accuracy_at(run: dict, t: float, n: int) -> tuple[float, int] | None:
    """(accuracy, completions) over the newest whole steps that ended by time `t` and hold at least `n` completions
    between them (all of them if fewer): a window of the same size for both sides, where a 5-step window holds 80
    of TRL's completions and as few as 20 of echo2's. None when no step ended by `t`."""
    newest, total = [], 0
    for w, a, c in sorted(zip(run["wall_s"], run["accuracy"], run["completions"], strict=True), reverse=True):
        if w <= t + 1e-9 and c > 0 and total < n:
            newest.append((a, c))
            total += c
    return _pooled(newest)


def pooled_accuracy_between(run: dict, lo: float, hi: float) -> tuple[float, int] | None:
    """(accuracy, completions) over every completion of the steps that ended in (lo, hi]: each side's whole output in
    a stretch of wall time (hundreds of completions for either side; echo2 generates more of them per second). None
    when no step ended there."""
    return _pooled((a, c) for w, a, c in zip(run["wall_s"], run["accuracy"], run["completions"], strict=True)
                   if lo < w <= hi + 1e-9 and c > 0)


def _pooled(steps) -> tuple[float, int] | None:
    """(accuracy, completions) of steps given as (accuracy, completions): each weighted by its completions."""
    right = total = 0.0
    for a, c in steps:
        right, total = right + a * c, total + c
    return (right / total, int(total)) if total else None


def plot(runs: dict[str, dict], reach: dict, level: float, png: Path, title: str, filter_on: bool) -> None:
    """Accuracy vs wall time (dotted: when each side reached the level) and vs step, both sides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, r in runs.items():
        steps = r["steps"]
        line, = by_time.plot(r["wall_s"], r["accuracy"], marker=".", label=name)
        by_step.plot(steps, r["accuracy"], marker=".", label=name)
        if reach[name]:
            by_time.axvline(reach[name][0], color=line.get_color(), linestyle=":", linewidth=1)
    by_time.set_xlim(left=0)
    by_step.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax, xlabel in ((by_time, "wall time (s)"), (by_step, "step")):
        ax.axhline(level, color="grey", linestyle="--", linewidth=1, label=f"level {level:.3f}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy (generated completions)" if filter_on else "accuracy (training completions)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_side":
        return _side(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="model.policy of both sides (default smollm2-135m)")
    p.add_argument("--steps", type=int, default=30, help="learner steps = TRL generation rounds (default 30)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads of the echo2 learner and TRL")
    p.add_argument("--set", action="append", default=[], help="echo2 config override key=value (both sides follow)")
    p.add_argument("--echo2-steps", type=int, help="echo2's learner steps (default --steps): more, so that it runs as "
                   "long as TRL and its accuracy at TRL's total wall time is measured, not extrapolated")
    p.add_argument("--filter", choices=("on", "off"), default="on",
                   help="echo2's dynamic sampling with learner.max_wait_s (on, default) or none (off); the docstring")
    p.add_argument("--max-wait-s", type=float, default=3.0, help="learner.max_wait_s with --filter on (default 3)")
    p.add_argument("--png", default="runs/vs_trl/vs_trl.png", help="the curves (default runs/vs_trl/vs_trl.png)")
    args = p.parse_args()
    if importlib.util.find_spec("trl") is None:
        sys.exit('bench/vs_trl.py needs TRL, the optional extra "bench": pip install -e ".[bench]"')

    with tempfile.TemporaryDirectory() as tmp:
        learner = side_settings(args.filter, args.max_wait_s)
        cfg = echo2_config(args.model, args.steps, args.threads, str(Path(tmp) / "echo2_run"), learner, args.set)
        steps = {"echo2": args.echo2_steps or args.steps, "trl": args.steps}
        cfg_files = {}
        for side, n in steps.items():  # the same config; each side its own number of steps
            cfg_files[side] = Path(tmp) / f"config_{side}.json"
            cfg_files[side].write_text(cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"steps": n})})
                                       .model_dump_json())
        import trl

        params = {
            "bench": "vs_trl", "model": args.model, "steps": args.steps, "echo2_steps": steps["echo2"],
            "threads": args.threads,
            "cpus": os.cpu_count(), "trl": trl.__version__, "main_job": str(MAIN_JOB.relative_to(ROOT)),
            "filter": args.filter, "learner": learner, "overrides": args.set, "seed": cfg.run.seed, "task": cfg.task.adapter,
            "task_options": cfg.task.options,
            "R": cfg.learner.trajectories_per_step, "n": cfg.rollout.group_size,
            "max_new_tokens": cfg.rollout.max_new_tokens, "temperature": cfg.rollout.temperature,
            "lr": cfg.learner.lr, "beta": cfg.learner.beta, "epsilon": cfg.learner.epsilon,
            "loss_type": cfg.learner.loss_type, "updates_per_step": cfg.learner.updates_per_step,
            "staleness": cfg.learner.staleness, "workers": cfg.rollout.workers,
            "trl_config": {k: v for k, v in trl_config(cfg, "<tmp>", False).items() if k != "bf16"},
            "differs": differs(cfg),
        }
        print(json.dumps(params), flush=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        runs = {}
        for side in ("echo2", "trl"):
            result = Path(tmp) / f"{side}.json"
            subprocess.run([sys.executable, __file__, "_side", side, str(cfg_files[side]), str(result), str(args.threads)],
                           env=env, check=True, stdout=sys.stderr)
            runs[side] = json.loads(result.read_text())
            r = runs[side]
            print(json.dumps({"side": side, "model": args.model, "steps": steps[side], "bf16": r["bf16"],
                              "accuracy_of": r["accuracy_of"], "steps_with_accuracy": r["steps_with_accuracy"],
                              "setup_s": round(r["setup_s"], 2), "total_s": round(r["total_s"], 2),
                              "s_per_step_after_setup": round((r["wall_s"][-1] - r["setup_s"]) / steps[side], 2),
                              "wall_s": [round(t, 2) for t in r["wall_s"]],
                              "accuracy": [round(a, 4) for a in r["accuracy"]],
                              "reward": [round(x, 4) for x in r["reward"]], "completions": r["completions"]}),
                  flush=True)

    window = min(WINDOW, args.steps)
    level = statistics.fmean(runs["trl"]["accuracy"][-window:])
    reach = {side: time_to_level(r["wall_s"], r["accuracy"], level, window) for side, r in runs.items()}
    ratio = reach["echo2"][0] / reach["trl"][0] if reach["echo2"] and reach["trl"] else None
    t_trl = runs["trl"]["total_s"]
    at_trl_end = {side: accuracy_at(r["wall_s"], r["accuracy"], t_trl, window) for side, r in runs.items()}
    pooled = {side: pooled_accuracy_at(r, t_trl, window * cfg.learner.trajectories_per_step) for side, r in runs.items()}
    halves = {name: {side: pooled_accuracy_between(r, lo, hi) for side, r in runs.items()}
              for name, (lo, hi) in (("first", (0.0, t_trl / 2)), ("second", (t_trl / 2, t_trl)))}
    print(json.dumps({
        "model": args.model, "steps": args.steps, "level": round(level, 4),
        "level_rule": f"TRL's mean accuracy over its last {window} steps; reached at the end of the first step whose "
                      f"trailing {window}-step mean accuracy is >= the level",
        "echo2_time_to_level_s": reach["echo2"] and round(reach["echo2"][0], 2),
        "echo2_step_to_level": reach["echo2"] and runs["echo2"]["steps"][reach["echo2"][1] - 1],
        "trl_time_to_level_s": reach["trl"] and round(reach["trl"][0], 2),
        "trl_step_to_level": reach["trl"] and runs["trl"]["steps"][reach["trl"][1] - 1],
        "ratio": ratio and round(ratio, 3), "goal": "ratio <= 0.5", "goal_met": ratio is not None and ratio <= 0.5,
        "echo2_accuracy_last": round(statistics.fmean(runs["echo2"]["accuracy"][-window:]), 4),
        "trl_total_s": round(t_trl, 2),
        "accuracy_at_trl_total_s": {side: a if a is None else round(a, 4) for side, a in at_trl_end.items()},
        # the same moment over equal numbers of completions (window x R), less noisy than 5 steps of either side
        "pooled_accuracy_at_trl_total_s": {side: p and {"accuracy": round(p[0], 4), "completions": p[1]}
                                           for side, p in pooled.items()},
        # every completion of each half of TRL's wall time: what each side's policy produced over a stretch of time
        **{f"pooled_accuracy_{name}_half_of_trl_time": {side: p and {"accuracy": round(p[0], 4), "completions": p[1]}
                                                        for side, p in half.items()} for name, half in halves.items()},
        "png": args.png,
    }), flush=True)
    plot(runs, reach, level, Path(args.png), f"echo2 vs TRL GRPOTrainer: {args.model}, {steps['echo2']} / {args.steps} steps, "
         f"R={cfg.learner.trajectories_per_step}, n={cfg.rollout.group_size}, {args.threads} threads, "
         f"seed {cfg.run.seed}, filter {args.filter}", args.filter == "on")


if __name__ == "__main__":
    main()
