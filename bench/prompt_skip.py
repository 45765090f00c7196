"""Pre-rollout prompt skipping (learner.prompt_skip) on and off: the same job, the same seed, one after the other.

For each seed, the job (default: the main job, examples/math_smollm2.toml) runs twice through `echo2 run` in a fresh
process, with learner.prompt_skip = false (the baseline) and = true; then `echo2 eval --config` scores the base model
and each trained policy on the same held-out tasks. Nothing else should run on the machine meanwhile.

Per run it prints one JSON line: the filter rate f measured over the run (the share of completed groups whose rewards
were all one value), rollouts generated per trained trajectory, the learner's wait by cause (filtered groups, no
group, the snapshot), the wall time at the end of the first step whose trailing 3-step workers' accuracy
(rollout_accuracy) reaches --level, held-out accuracy, and the filter's own counts (prompts skipped by reason, f had
nothing been skipped, p_explore at the end, the share of prompts handed out that had a history). Then per seed one
line comparing the two (ratio of the times to --level: on / off), and one over all seeds.

    # issue 44's table (the main job, two seeds; ~20 min a seed on 2 cores):
    .venv/bin/python bench/prompt_skip.py --seeds 0 1 --out runs/prompt_skip
    # level 2, 40 steps:
    .venv/bin/python bench/prompt_skip.py --seeds 0 1 --set task.options.difficulty=2 --set learner.steps=40 \\
        --out runs/prompt_skip_l2
    # prompts that repeat, of mixed difficulty: 32 level-1 and 48 level-2 problems cycled, held-out eval at level 2
    .venv/bin/python bench/prompt_skip.py --seeds 0 1 --problems 1:32,2:48 --eval-option difficulty=2 \
        --out runs/prompt_skip_mixed
    # the smoke path:
    .venv/bin/python bench/prompt_skip.py --seeds 0 --set model.policy='"tiny-random"' --set learner.steps=2 \\
        --set rollout.max_new_tokens=4 --eval-tasks 4 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vs_trl.py beside this file (also when loaded by a test)
import vs_trl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ECHO2 = [sys.executable, "-m", "echo2sdk.cli"]


def time_to_level(rows: list[dict[str, Any]], level: float, window: int) -> tuple[float, int] | None:
    """(time_s, step) at the end of the first step whose trailing `window` steps' mean rollout_accuracy >= level
    (vs_trl's rule; steps at which no group completed have no accuracy and are left out)."""
    seen = [r for r in rows if r.get("rollout_accuracy") is not None]
    reach = vs_trl.time_to_level([r["time_s"] for r in seen], [r["rollout_accuracy"] for r in seen], level, window)
    return None if reach is None else (reach[0], seen[reach[1] - 1]["step"])


def figures(run_dir: Path, level: float, window: int) -> dict[str, Any]:
    """What one run measured, from its metrics.jsonl and summary.json."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    buf, pf = summary["buffer"], summary.get("prompt_filter") or {}
    generated, trained = sum(r["rollouts"] for r in rows), sum(r["trajectories"] for r in rows)
    reach = time_to_level(rows, level, window)
    return {
        "steps": len(rows),
        "wall_s": summary["wall_s"],
        "f": round(buf["filtered_groups"] / buf["completed_groups"], 4) if buf["completed_groups"] else None,
        "groups_completed": buf["completed_groups"],
        "rollouts_generated": generated,
        "rollouts_per_trained": round(generated / trained, 3) if trained else None,
        "learner_wait_s": round(sum(r["learner_wait_s"] for r in rows), 1),
        "wait_filtered_s": round(sum(r["learner_wait_filtered_s"] for r in rows), 1),
        "wait_empty_s": round(sum(r["learner_wait_empty_s"] for r in rows), 1),
        "wait_snapshot_s": round(sum(r["learner_wait_snapshot_s"] for r in rows), 1),
        "bubble_ratio": summary["bubble_ratio"],
        f"time_to_{level:g}_s": None if reach is None else reach[0],
        f"step_to_{level:g}": None if reach is None else reach[1],
        "rollout_accuracy_first5": summary["rollout_accuracy_first5"],
        "rollout_accuracy_last5": summary["rollout_accuracy_last5"],
        "skipped": pf.get("skipped", 0),
        "skipped_by_reason": pf.get("skipped_by_reason", {}),
        "f_unskipped": pf.get("f_unskipped"),
        "skip_precision": pf.get("precision"),
        "explore_end": pf.get("explore"),
        "repeat_share": pf.get("repeat_share"),
        "stale_refused": summary["coordinator"]["rejected"].get("stale", 0),
    }


def evaluate(runs: dict[str, Path], tasks: int, out: Path, options: list[str] | None = None) -> dict[str, float]:
    """Held-out accuracy of the base model and of each run's trained policy on the same tasks (`echo2 eval --task`
    with the run's own task, model, answer length and temperature, read from its config.json; `options`, KEY=VALUE
    task options, replace the run's: e.g. procedural level-2 problems for a run on a problem file)."""
    scores: dict[str, float] = {}
    for name, run_dir in runs.items():
        cfg = json.loads((run_dir / "config.json").read_text())
        path = out / f"eval-{name}.json"
        cmd = [*ECHO2, "eval", "--task", cfg["task"]["adapter"], "--base", cfg["model"]["policy"],
               "--trained", str(run_dir / "checkpoint"), "--tasks", str(tasks), "--json", str(path),
               "--max-new-tokens", str(cfg["rollout"]["max_new_tokens"]),
               "--temperature", str(cfg["rollout"]["temperature"])]
        given = options if options is not None else [
            f"{key}={json.dumps(value)}" for key, value in (cfg["task"].get("options") or {}).items()]
        for kv in given:
            cmd += ["--task-option", kv]
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        table = json.loads(path.read_text())["table"]
        for label, row in table.items():
            scores["base" if label.startswith("base") else name] = row["accuracy"]
    return scores


def write_problems(path: Path, spec: str) -> Path:
    """COUNT procedural problems of each LEVEL (spec "1:32,2:48"; seeded, so every run trains on the same file)."""
    import random

    from echo2_math import problems

    rng, lines = random.Random(20261207), []
    for part in spec.split(","):
        level, count = (int(x) for x in part.split(":"))
        for _ in range(count):
            p = problems.generate(rng, level)
            lines.append(json.dumps({"question": p.question, "answer": p.answer, "level": level}))
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "math_smollm2.toml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for both runs")
    ap.add_argument("--level", type=float, default=0.85, help="the workers' accuracy to reach")
    ap.add_argument("--window", type=int, default=3, help="steps in the trailing mean that must reach --level")
    ap.add_argument("--eval-tasks", type=int, default=200, help="held-out tasks per policy (0: no eval)")
    ap.add_argument("--eval-option", action="append", metavar="KEY=VALUE",
                    help="task options of the held-out eval instead of the run's (repeatable)")
    ap.add_argument("--problems", metavar="LEVEL:COUNT,...",
                    help="train on a problem file instead: COUNT seeded problems of each math LEVEL (e.g. 1:32,2:48), "
                    "written to OUT/problems.jsonl and cycled in epochs: prompts that repeat, of mixed difficulty")
    ap.add_argument("--out", default="runs/prompt_skip")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.problems:
        path = write_problems(out / "problems.jsonl", args.problems)
        args.set.append(f'task.options={{files=["{path}"]}}')
    print(json.dumps({"bench": "prompt_skip", "config": args.config, "seeds": args.seeds, "set": args.set,
                      "problems": args.problems, "level": args.level, "window": args.window,
                      "eval_tasks": args.eval_tasks, "eval_options": args.eval_option}), flush=True)
    by_seed: dict[int, dict[str, dict[str, Any]]] = {}
    for seed in args.seeds:
        dirs = {}
        for name, on in (("off", "false"), ("on", "true")):
            run_dir = out / f"seed{seed}-{name}"
            sets = [*args.set, f"run.seed={seed}", f"learner.prompt_skip={on}", "run.progress=false"]
            t0 = time.perf_counter()
            subprocess.run([*ECHO2, "run", args.config, "--out", str(run_dir), *[a for s in sets for a in ("--set", s)]],
                           check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            dirs[name] = run_dir
            by_seed.setdefault(seed, {})[name] = {"process_s": round(time.perf_counter() - t0, 1),
                                                  **figures(run_dir, args.level, args.window)}
        if args.eval_tasks:
            scores = evaluate(dirs, args.eval_tasks, out, args.eval_option)
            for name in dirs:
                by_seed[seed][name]["eval_accuracy"] = scores.get(name)
                by_seed[seed][name]["eval_accuracy_base"] = scores.get("base")
        for name, fig in by_seed[seed].items():
            print(json.dumps({"seed": seed, "prompt_skip": name, **fig}), flush=True)
        print(json.dumps({"seed": seed, **compare(by_seed[seed]["off"], by_seed[seed]["on"], args.level)}), flush=True)
    offs, ons = [s["off"] for s in by_seed.values()], [s["on"] for s in by_seed.values()]
    print(json.dumps({"seeds": args.seeds, **{f"{k}_mean": v for k, v in compare_means(offs, ons, args.level).items()}}),
          flush=True)


def compare(off: dict[str, Any], on: dict[str, Any], level: float) -> dict[str, Any]:
    key = f"time_to_{level:g}_s"
    ratio = on[key] / off[key] if on[key] is not None and off[key] else None
    return {"f_off": off["f"], "f_on": on["f"], "rollouts_per_trained_off": off["rollouts_per_trained"],
            "rollouts_per_trained_on": on["rollouts_per_trained"], f"{key}_off": off[key], f"{key}_on": on[key],
            "time_ratio_on_off": None if ratio is None else round(ratio, 3),
            "wait_off_s": off["learner_wait_s"], "wait_on_s": on["learner_wait_s"],
            "eval_off": off.get("eval_accuracy"), "eval_on": on.get("eval_accuracy")}


def compare_means(offs: list[dict[str, Any]], ons: list[dict[str, Any]], level: float) -> dict[str, Any]:
    def mean(runs: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return round(statistics.fmean(values), 4) if values else None

    key = f"time_to_{level:g}_s"
    out = {}
    for k in ("f", "rollouts_per_trained", "learner_wait_s", key, "eval_accuracy", "wall_s"):
        out[f"{k}_off"], out[f"{k}_on"] = mean(offs, k), mean(ons, k)
    return out


if __name__ == "__main__":
    main()
