"""RL quality under bounded staleness (paper §5.3, Figure 3(b)): the demo task trained once per staleness budget S,
with and without the truncated importance weight w_t = min(pi_old / pi_sampler, C) (learner.importance_weight),
per seed; reward and accuracy per learner step and against wall time, and the staleness each run realized. Reward
and accuracy are those of every group the workers completed since the previous step (metrics.jsonl
`rollout_reward_mean`, `rollout_accuracy`): under dynamic sampling the trained batch holds mixed-reward groups only.

    PYTHONPATH=$PWD .venv/bin/python bench/staleness.py [--model smollm2-135m] [--steps 30] [--seeds 0]
        [--S 2,3,4,6,11] [--importance-weight on,off] [--workers N] [--set KEY=VALUE ...] [--out runs/bench_staleness]

Each run is a real `echo2 run examples/math_smollm2.toml` (a learner and its local worker processes) in its own
subprocess, with learner.staleness = S, the publication period kappa = S - 1 (the paper's default), and
everything else the file's. The paper reports that S <= 6 stays within roughly 5 % of the synchronous
baseline and that S = 11 can destabilize standard GRPO; here the most synchronous run is the smallest S of the
invocation (S = 2, kappa = 1: a snapshot after every step), the baseline of the summary line.

How S shows up in a run: the buffer admits v >= v_t - S, and the realized staleness Delta = v_t - v of the
trained-on records depends on how far the workers run ahead. Two mechanisms make it grow with S: (1) workers
generate under the last snapshot they installed, published every kappa = S - 1 steps, so even a learner that
waits for data (the demo on a 2-core CPU: 2 workers do not keep it busy) trains on records up to ~kappa versions
old; (2) workers that outpace the learner (--workers, or a fast backend) fill the buffer, and the FIFO order
trains on the oldest admissible records first, which drifts Delta towards S. Each run's JSON line carries the
Delta histogram of everything it trained on, its mean, max, quantiles and the fraction at Delta = S, so the
comparison can be read against the staleness actually realized, not just the budget.

Output (under --out): one folder per run (runs/S<S>-iw<on|off>-seed<seed>/, `echo2 plot` reads it), results.jsonl
(the lines printed: one per run, then one summary line) and staleness.png (reward vs step, reward vs wall time,
accuracy vs step, realized Delta distribution; one line per (S, weight) config, the mean over seeds, a trailing
moving average of --smooth steps).

Full sweep: 5 S x 2 x 1 seed = 10 runs of the demo's 20 SmolLM2-135M steps, ~10 min a run on the 2-core
machine (the README's S = 3 run: 9:48), ~100 min in all; docs/recipes.md has what was measured:

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/staleness.py --model smollm2-135m --steps 20 --seeds 0 \\
        --S 2,3,4,6,11 --importance-weight on,off --out runs/bench_staleness

A sweep run in parts (one S at a time, or on several machines) is drawn and summarized together, without
running anything, from its results files:

    PYTHONPATH=$PWD .venv/bin/python bench/staleness.py --from runs/a/results.jsonl runs/b/results.jsonl \\
        --out runs/bench_staleness_all

Smoke test (tiny random model, whose reward is always 0: this checks the pipeline, not the finding):

    PYTHONPATH=$PWD .venv/bin/python bench/staleness.py --model tiny-random --steps 3 --S 2,6 \\
        --set learner.filter_zero_variance=false --out /tmp/bench_staleness
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "math_smollm2.toml"
WITHIN = 0.05  # the paper: "within roughly 5% fluctuation of the synchronous baseline"


def run_one(args: argparse.Namespace, S: int, weight: bool, seed: int) -> dict[str, Any]:
    """One training run as a subprocess (`echo2 run`), then its JSON line from the files it wrote."""
    name = f"S{S}-iw{'on' if weight else 'off'}-seed{seed}"
    out = args.out / "runs" / name
    sets = [f'model.policy="{args.model}"', f"learner.steps={args.steps}", f"learner.staleness={S}",
            f"learner.importance_weight={'true' if weight else 'false'}", f"run.seed={seed}", "run.progress=false",
            *([f"rollout.workers={args.workers}"] if args.workers is not None else []), *args.set]
    cmd = [sys.executable, "-m", "echo2sdk.cli", "run", str(args.config), "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{name}.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout_s, cwd=ROOT,
                                env=os.environ.copy()).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {"bench": "staleness", "model": args.model, "steps": args.steps, "S": S, "kappa": S - 1,
                           "importance_weight": weight, "seed": seed, "workers": args.workers, "set": args.set,
                           "run_dir": str(out), "returncode": rc, "process_wall_s": round(wall, 1)}
    if rc != 0 or not (out / "metrics.jsonl").is_file():
        tail = log_path.read_text(errors="replace")[-2000:] if log_path.is_file() else ""
        return {**row, "error": f"run failed (returncode {rc}); log {log_path}", "log_tail": tail}
    return {**row, **measurements(out, S, args.last)}


def measurements(run_dir: Path, S: int, last: int) -> dict[str, Any]:
    """Per-step reward, accuracy and timings, and the realized staleness, from a run folder."""
    from echo2sdk.plot import load_run

    run = load_run(run_dir)
    rows = run.rows
    hist = {int(k): v for k, v in run.summary.get("buffer", {}).get("staleness_hist", {}).items()}
    if not hist:  # no summary (a run that died late): the per-step histograms add up to the same counts
        for counts in run.histograms.get("staleness", {}).values():
            for d, n in counts.items():
                hist[int(d)] = hist.get(int(d), 0) + n
    # the policy's level: every group the workers completed since the previous step, filtered or not (under
    # dynamic sampling the trained batch holds groups with mixed rewards only, whatever the policy's level)
    reward = [r.get("rollout_reward_mean") for r in rows]
    accuracy = [r.get("rollout_accuracy") for r in rows]
    gaps = [g for r in rows for g in (r.get("sampler_gap") or {}).values() if g == g]  # NaN-free
    return {
        "R": run.summary.get("R"),
        "reward": [None if x is None else round(x, 4) for x in reward],
        "batch_reward": [round(r["reward_mean"], 4) for r in rows],  # of the records trained on
        "accuracy": [None if a is None else round(a, 4) for a in accuracy],
        "time_s": [r["time_s"] for r in rows],  # since the run's start, at the end of each step
        "step_wall_s": [r["t_step_wall_s"] for r in rows],
        "learner_wait_s": [r["learner_wait_s"] for r in rows],
        "train_wall_s": run.summary.get("wall_s"),
        "s_per_step": round(rows[-1]["time_s"] / len(rows), 3),
        "bubble_ratio": run.summary.get("bubble_ratio"),
        "reward_last": _mean(reward[-last:]),
        "accuracy_last": _mean(accuracy[-last:]),
        "staleness": delta_stats(hist, S) | {
            "per_step_max": [r["staleness_max"] for r in rows],
            "per_step_mean": [round(r["staleness_mean"], 3) for r in rows],
        },
        "is_weight_mean": _mean([r["is_weight_mean"] for r in rows]),
        "is_truncated_frac": _mean([r["is_truncated_frac"] for r in rows]),
        "sampler_gap_mean": _mean(gaps),  # mean |log pi_old - log pi_sampler| per token, over workers and steps
        "evicted": rows[-1]["evicted"],
        **delta_bounds(run.summary, rows, S - 1),
    }


def delta_bounds(summary: dict[str, Any], rows: list[dict[str, Any]], kappa: int) -> dict[str, int | None]:
    """The paper's staleness bounds (core/capacity.py) from the run's measured T_train, T_bcast and mu_pool:
    conservative (Appendix B.2) and tightened (B.3, valid under the overlap condition); None where unmeasured
    (no snapshot reached the workers in a short run: T_bcast unknown). They bound the lag of the freshest
    records; records the workers generated ahead of the learner, sampled oldest first, can be older (up to S)."""
    from echo2sdk.core import capacity
    from echo2sdk.errors import CapacityError

    bcasts = [r["t_bcast_s"] for r in rows if r.get("t_bcast_s") is not None]
    T_train, T_bcast = summary.get("T_train_median_s"), statistics.median(bcasts) if bcasts else None
    R, mu = summary.get("R"), summary.get("mu_pool_measured")
    out: dict[str, int | None] = {"delta_bound_conservative": None, "delta_bound_tightened": None}
    try:
        if T_train and T_bcast is not None:
            out["delta_bound_tightened"] = capacity.delta_max_tightened(T_train, T_bcast, kappa)
            if R and mu:
                out["delta_bound_conservative"] = capacity.delta_max_conservative(T_train, T_bcast, R, kappa, mu)
    except CapacityError:
        pass
    return out


def delta_stats(hist: dict[int, int], S: int) -> dict[str, Any]:
    """The realized Delta = v_t - v of every trained-on record: histogram, mean, max, quantiles, share at S."""
    n = sum(hist.values())
    if not n:
        return {"hist": {}, "n": 0}
    ordered = sorted(hist)

    def quantile(q: float) -> int:
        seen = 0
        for d in ordered:
            seen += hist[d]
            if seen >= q * n:
                return d
        return ordered[-1]

    return {"hist": {str(d): hist[d] for d in ordered}, "n": n,
            "mean": round(sum(d * c for d, c in hist.items()) / n, 3), "max": ordered[-1],
            "p50": quantile(0.5), "p90": quantile(0.9), "frac_at_S": round(hist.get(S, 0) / n, 4)}


def _seed_mean(runs: list[dict[str, Any]], key: str, i: int) -> float:
    """Step i's `key` averaged over seeds, NaN (a gap in the plot) when no seed has it (no group completed)."""
    xs = [r[key][i] for r in runs if r[key][i] is not None]
    return statistics.fmean(xs) if xs else float("nan")


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.fmean(xs), 4) if xs else None


def _rel(x: float | None, base: float | None) -> float | None:
    return None if x is None or not base else round((x - base) / abs(base), 4)


def summarize(rows: list[dict[str, Any]], last: int) -> dict[str, Any]:
    """Each (S, weight) config over its seeds, against the smallest S with the same weight setting."""
    ok = [r for r in rows if "error" not in r]
    configs: dict[tuple[int, bool], list[dict]] = {}
    for r in ok:
        configs.setdefault((r["S"], r["importance_weight"]), []).append(r)
    out = []
    for (S, weight), runs in sorted(configs.items(), key=lambda kv: (not kv[0][1], kv[0][0])):
        deltas = {}
        for r in runs:
            for d, c in r["staleness"]["hist"].items():
                deltas[int(d)] = deltas.get(int(d), 0) + c
        out.append({"S": S, "importance_weight": weight, "seeds": [r["seed"] for r in runs],
                    "reward_last": _mean([r["reward_last"] for r in runs]),
                    "accuracy_last": _mean([r["accuracy_last"] for r in runs]),
                    "reward_all_steps": _mean([x for r in runs for x in r["reward"]]),
                    "s_per_step": _mean([r["s_per_step"] for r in runs]),
                    "delta": {k: v for k, v in delta_stats(deltas, S).items() if k != "hist"}})
    for c in out:
        base = min((b for b in out if b["importance_weight"] == c["importance_weight"]), key=lambda b: b["S"])
        c["baseline_S"] = base["S"]
        for key in ("reward_last", "accuracy_last"):
            c[f"{key}_vs_baseline"] = _rel(c[key], base[key])
        rel = [c[f"{k}_vs_baseline"] for k in ("reward_last", "accuracy_last")]
        c[f"within_{WITHIN:g}_of_baseline"] = None if None in rel else all(abs(x) <= WITHIN for x in rel)
    return {"bench": "staleness", "summary": True, "last_steps": last, "runs": len(rows), "failed": len(rows) - len(ok),
            "configs": out}


def plot(rows: list[dict[str, Any]], path: Path, smooth: int) -> None:
    """2 x 2: reward vs step and vs wall time, accuracy vs step, realized Delta distribution; a line per config."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    ok = [r for r in rows if "error" not in r]
    configs: dict[tuple[int, bool], list[dict]] = {}
    for r in ok:
        configs.setdefault((r["S"], r["importance_weight"]), []).append(r)
    Ss = sorted({S for S, _ in configs})
    fig = Figure(figsize=(12, 8.5))
    (ax_r, ax_t), (ax_a, ax_d) = fig.subplots(2, 2)
    for (S, weight), runs in sorted(configs.items()):
        style = dict(color=f"C{Ss.index(S)}", linestyle="-" if weight else "--",
                     label=f"S={S} (kappa={S - 1}) IS {'on' if weight else 'off'}, {len(runs)} seed(s)")
        n = min(len(r["reward"]) for r in runs)
        steps = list(range(1, n + 1))
        reward = _smooth([_seed_mean(runs, "reward", i) for i in range(n)], smooth)
        wall = [statistics.fmean(r["time_s"][i] for r in runs) for i in range(n)]
        acc = [_seed_mean(runs, "accuracy", i) for i in range(n)]
        ax_r.plot(steps, reward, **style)
        ax_t.plot(wall, reward, **style)
        ax_a.plot(steps, _smooth(acc, smooth), **style)
        hist: dict[int, int] = {}
        for r in runs:
            for d, c in r["staleness"]["hist"].items():
                hist[int(d)] = hist.get(int(d), 0) + c
        total = sum(hist.values()) or 1
        ds = sorted(hist)
        ax_d.plot(ds, [hist[d] / total for d in ds], marker="o", **style)
    avg = f" (trailing mean of {smooth} steps)" if smooth > 1 else ""
    ax_r.set(xlabel="learner step", ylabel="reward" + avg, title="reward vs step")
    ax_t.set(xlabel="wall time since the run's start (s)", ylabel="reward" + avg, title="reward vs wall time")
    ax_a.set(xlabel="learner step", ylabel="accuracy" + avg, title="accuracy vs step")
    ax_d.set(xlabel="realized staleness Delta = v_t - v", ylabel="fraction of trained-on records",
             title="realized staleness per config")
    for ax in (ax_r, ax_t, ax_a, ax_d):
        ax.grid(alpha=0.3)
    for ax in (ax_r, ax_a, ax_d):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_d.legend(fontsize=7)
    model = ok[0]["model"] if ok else "?"
    fig.suptitle(f"Staleness sweep on the demo task ({model}); paper: S <= 6 within ~5 % of synchronous, "
                 "S = 11 unstable; solid: importance weight on, dashed: off", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _smooth(xs: list[float], k: int) -> list[float]:
    """Trailing mean of k values, NaN (a gap) skipped."""
    windows = ([x for x in xs[max(0, i - k + 1) : i + 1] if x == x] for i in range(len(xs)))
    return [statistics.fmean(w) if w else float("nan") for w in windows]


def load_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """The run lines of earlier results.jsonl files (their summary lines are recomputed). The same (S, weight,
    seed) twice is refused: averaging a run with itself would pass for a second seed."""
    rows, seen = [], {}
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            row = json.loads(line) if line.strip() else {}
            if row.get("bench") != "staleness" or row.get("summary"):
                continue
            key = (row["S"], row["importance_weight"], row["seed"])
            if key in seen:
                raise SystemExit(f"--from: S={key[0]}, importance weight {'on' if key[1] else 'off'}, seed {key[2]} "
                                 f"is in both {seen[key]} and {path}:{n}")
            seen[key] = f"{path}:{n}"
            rows.append(row)
    if not rows:
        raise SystemExit(f"--from: no staleness run lines in {', '.join(map(str, paths))}")
    return rows


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _weights(text: str) -> list[bool]:
    choice = {"on": True, "off": False}
    try:
        return [choice[x.strip()] for x in text.split(",") if x.strip()]
    except KeyError as e:
        raise argparse.ArgumentTypeError(f"--importance-weight takes on and/or off, got {e.args[0]!r}") from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="model.policy (tiny-random for a smoke test)")
    p.add_argument("--steps", type=int, default=20, help="learner steps per run (the demo's 20)")
    p.add_argument("--seeds", type=_ints, default=[0], help="run.seed values, comma-separated")
    p.add_argument("--S", type=_ints, default=[2, 3, 4, 6, 11], help="staleness budgets, comma-separated (>= 2)")
    p.add_argument("--importance-weight", type=_weights, default=[True, False], help="on,off (default both)")
    p.add_argument("--workers", type=int, default=None, help="rollout.workers (default the config's, 2)")
    p.add_argument("--config", type=Path, default=CONFIG, help="the task's config (default the demo task)")
    p.add_argument("--set", action="append", default=[], help="another config override key=value (repeatable)")
    p.add_argument("--last", type=int, default=5, help="steps averaged for the final reward and accuracy")
    p.add_argument("--smooth", type=int, default=5, help="trailing moving average of the plotted curves, in steps")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    p.add_argument("--out", type=Path, default=Path("runs/bench_staleness"), help="folder for runs, results, PNG")
    p.add_argument("--from", dest="sources", type=Path, nargs="+", default=None, metavar="RESULTS",
                   help="run nothing: summarize and draw the run lines of these results.jsonl files together")
    args = p.parse_args()
    if bad := [S for S in args.S if S < 2]:
        p.error(f"--S: every staleness budget must be >= 2 (kappa = S - 1 >= 1), got {bad}")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = load_rows(args.sources) if args.sources else []  # read before results.jsonl may be rewritten
    with open(args.out / "results.jsonl", "w") as results:
        for row in rows:
            for f in (sys.stdout, results):
                print(json.dumps(row), file=f, flush=True)
        for seed in args.seeds if not args.sources else ():
            for S in sorted(args.S):  # both weight settings of an S in a row: a cut-short sweep still pairs them
                for weight in args.importance_weight:
                    row = run_one(args, S, weight, seed)
                    rows.append(row)
                    for f in (sys.stdout, results):
                        print(json.dumps(row), file=f, flush=True)
        summary = summarize(rows, args.last)
        for f in (sys.stdout, results):
            print(json.dumps(summary), file=f, flush=True)
    if any("error" not in r for r in rows):
        plot(rows, args.out / "staleness.png", args.smooth)
        print(f"wrote {args.out / 'staleness.png'} and {args.out / 'results.jsonl'}", file=sys.stderr)


if __name__ == "__main__":
    main()
