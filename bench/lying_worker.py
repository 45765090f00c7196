"""Lying-worker detection (core/audit.py): how far honest workers stay from the threshold, and how fast a liar
is caught.

    .venv/bin/python bench/lying_worker.py runs [--model tiny-random] [--steps 16] [--lies fabricate,other]
    .venv/bin/python bench/lying_worker.py gaps [--model smollm2-135m] [--lags 3]

runs: real runs of the learner with 2 honest local worker processes and a third worker process
(tests/security/_liar.py): honest (the baseline, same pool size), fabricating every log-prob (-0.01), and
serving another model's responses under the learner's version numbers (--other, default a peaked random
tiny model). One JSON line per run: the step the liar was flagged at, the batches it reached (stepped or
withheld whole) until then, the largest honest statistics vs learner.lie_threshold / lie_var_threshold in the
step's pi_old and in the replay (learner.audit_replay: records recomputed under the version they claim), the
liar's statistics in each batch, the records the audit's screen withheld (the liar's, the honest workers'), the
replay's time beside T_train, and the reward per step; the liar runs
also carry the baseline's mean reward over the steps after the quarantine beside their own.

gaps: the honest audit statistics per lag on a real backend, forward passes only (no worker processes): a batch
sampled by the hf backend from the initial weights (as a fresh worker serves them), its per-record gap
|log pi_old - log pi_sampler| and per-group var statistic (core/audit.py) under the learner at lag 0, then after
each of `--lags` real learner updates (--lr, default 3e-6: the main job's before it moved to 1e-5); beside them the statistics of the same responses
with fabricated constant log-probs (-0.01, -0.1, -1) and of tiny-random's responses. One JSON line per lag and
one for the liars.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIAR = ROOT / "tests" / "security" / "_liar.py"


def _config(model: str, steps: int, out: str, extra: list[str]):
    from echo2sdk.config import load_config

    return load_config(None, [
        f'model.policy="{model}"', "rollout.workers=2", "rollout.group_size=4", "rollout.max_new_tokens=24",
        "rollout.nice=0", f"learner.steps={steps}", "learner.trajectories_per_step=8", "learner.staleness=3",
        "learner.lr=1e-4", "learner.data_timeout_s=600", "run.progress=false", "run.heartbeat_s=0.5",
        "learner.filter_zero_variance=false", f'run.out="{out}"', *extra,
    ])


def _one_run(model: str, steps: int, lie: list[str], extra: list[str]) -> dict:
    from echo2sdk.runtime.providers.local import worker_env
    from echo2sdk.runtime.learner.recipe import Trainer

    with tempfile.TemporaryDirectory() as out:
        tr = Trainer(_config(model, steps, out, extra))
        third = None
        try:
            tr.setup()
            c = tr.coordinator
            third = subprocess.Popen([sys.executable, str(LIAR), "--connect", f"{c.host}:{c.port}", "--id", "third",
                                      *lie], env=worker_env(c.token, tr.cfg.rollout.threads), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
            summary = tr.run()
        finally:
            tr.close()
            if third is not None:
                third.kill()
                third.wait()
        rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    # every audited batch, the stepped ones and those withheld whole (metrics rows hold the stepped ones only)
    hist, replays = tr.audit.history, tr.audit.replays
    flagged_at = next((r["step"] for r in rows if r["workers_quarantined"]), None)
    withheld = summary["records_withheld_by_worker"]

    def stat(steps, name, honest):
        values = [getattr(s, name) for h in steps for w, s in h.items() if (w != "third") == honest]
        return [round(v, 4) if v == v else None for v in values]

    def top(values):
        return max((v for v in values if v is not None), default=None)

    return {
        "lie": " ".join(lie) or "honest",
        "model": model,
        "steps": steps,
        "threshold": tr.cfg.learner.lie_threshold,
        "var_threshold": tr.cfg.learner.lie_var_threshold,
        "audit_replay": tr.cfg.learner.audit_replay,
        "quarantined": summary["quarantined"],
        "flagged_at_step": flagged_at,
        "liar_batches_to_flag": sum(1 for h in hist if "third" in h) if lie else None,
        "third_gaps": stat(hist, "gap", False),
        "third_var": stat(hist, "var", False),
        "third_replay_gaps": stat(replays, "gap", False),
        "third_replay_var": stat(replays, "var", False),
        "honest_gap_max": top(stat(hist, "gap", True)),
        "honest_var_max": top(stat(hist, "var", True)),
        "honest_replay_gap_max": top(stat(replays, "gap", True)),
        "honest_replay_var_max": top(stat(replays, "var", True)),
        "honest_replay_var_n": sum(1 for v in stat(replays, "var", True) if v is not None),
        "replay_s_mean": round(statistics.fmean(r["t_audit_replay_s"] for r in rows), 3),
        "t_train_s_mean": round(statistics.fmean(r["t_train_s"] for r in rows), 3),
        "third_records_withheld": withheld.get("third", 0),
        "honest_records_withheld": sum(n for w, n in withheld.items() if w != "third"),
        "batches_withheld": summary["batches_withheld"],
        "reward_per_step": [round(r["reward_mean"], 4) for r in rows],
        # who got records in at all, and what the buffer evicted (a worker may reach no batch in a short run)
        "trajectories_by_worker": {w["worker_id"]: w["trajectories"] for w in summary["workers"]},
        "evicted_by_reason": summary["buffer"].get("evicted_by_reason"),
    }


def runs(args: argparse.Namespace) -> None:
    extra = list(args.set)
    other = args.other
    with tempfile.TemporaryDirectory() as tmp:
        if other is None:
            sys.path.insert(0, str(LIAR.parent))
            from _liar import peaked_model

            other = str(peaked_model(Path(tmp) / "other"))
        base = None if args.no_baseline else _one_run(args.model, args.steps, [], extra)
        if base is not None:
            print(json.dumps(base), flush=True)
        lies = {"fabricate": ["--fabricate", "-0.01"], "other": ["--model", other, "--keep-model"]}
        for lie in (lies[name] for name in args.lies.split(",")):
            row = _one_run(args.model, args.steps, lie, extra)
            after = row["flagged_at_step"]
            if base is not None and after is not None and after < args.steps:  # the steps after the quarantine
                row["reward_mean_after_flag"] = statistics.fmean(row["reward_per_step"][after:])
                row["baseline_reward_mean_same_steps"] = statistics.fmean(base["reward_per_step"][after:])
            print(json.dumps(row), flush=True)


def _sample(backend, adapter, tasks, n: int, params, worker: str) -> list[list]:
    """One GRPO group per task from `backend`, as the worker builds its records (version 0)."""
    from echo2sdk.core.records import Meta, Trajectory

    prompts = [backend.encode_chat(t.messages) for t in tasks]
    samples = backend.generate([p for p in prompts for _ in range(n)], params)
    groups = []
    for i, task in enumerate(tasks):
        group = []
        for s in samples[i * n : (i + 1) * n]:
            meta = Meta(group_id=task.id, prompt_ids=tuple(prompts[i]), response_ids=tuple(s.token_ids),
                        logprobs=tuple(min(lp, 0.0) for lp in s.logprobs), worker=worker)
            reward = float(adapter.score(task, s.text).reward)
            group.append(Trajectory(prompt=task.id, response=s.text, reward=reward, version=0, meta=meta))
        groups.append(group)
    return groups


def _sums(learner, groups: list[list], fabricate: float | None = None) -> list[list]:
    """Per group, per record: the audit's TokenSums (core/audit.py) of the record under the learner's pi_old."""
    from echo2sdk.core.audit import TokenSums

    rows = learner._rows(groups)
    lp = learner._token_logprobs(rows).tolist()
    out, at = [], 0
    for g in groups:
        sums = []
        for r in rows[at : at + len(g)]:
            own = lp[: len(r.mask)]
            lp = lp[len(r.mask) :]
            claims = [fabricate] * len(own) if fabricate is not None else r.sampler_logprobs
            d = [a - b for a, b in zip(own, claims)]
            sums.append(TokenSums(len(d), sum(map(abs, d)), sum(d), sum(x * x for x in d), sum(own),
                                  sum(x * x for x in own)))
        at += len(g)
        out.append(sums)
    return out


def _summary(values: list[float]) -> dict:
    g = sorted(v for v in values if v == v)  # NaN: undefined
    if not g:
        return {"n": 0, "undefined": len(values)}
    return {"n": len(g), "mean": round(statistics.fmean(g), 5), "p50": round(g[len(g) // 2], 5),
            "p90": round(g[int(0.9 * (len(g) - 1))], 5), "max": round(g[-1], 5), "undefined": len(values) - len(g)}


def _stats(sums: list[list]) -> dict:
    """Record gaps, and the var statistic per group (pooled over its records, as the learner's screen sees a
    unit): the two audit statistics at lag 0."""
    from echo2sdk.core.audit import TokenSums

    return {"record_gap": _summary([s.gap for g in sums for s in g]),
            "group_var": _summary([sum(g, TokenSums()).unexplained for g in sums])}


def gaps(args: argparse.Namespace) -> None:
    """Honest gap per lag, and the liars' gaps, on `args.model` (forward passes and `args.lags` updates)."""
    import itertools

    from echo2sdk.backends.hf import HFBackend
    from echo2sdk.core.contracts import SamplingParams
    from echo2sdk.core.learner import Learner
    from echo2sdk.plugins import load_adapter
    from echo2sdk.weights import resolve_model

    path = resolve_model(args.model)
    learner = Learner(path, lr=args.lr, temperature=args.temperature, threads=args.threads)
    adapter = load_adapter("math", {"difficulty": 1})
    tasks = adapter.tasks(0)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    with HFBackend(path, threads=args.threads) as backend:
        probe = _sample(backend, adapter, list(itertools.islice(tasks, args.prompts)), 4, params, "honest")
        train = [_sample(backend, adapter, list(itertools.islice(tasks, args.prompts)), 4, params, "honest")
                 for _ in range(args.lags)]
    base = {"model": args.model, "lr": args.lr, "temperature": args.temperature, "precision_bf16": learner.autocast,
            "max_new_tokens": args.max_new_tokens}
    for lag in range(args.lags + 1):
        if lag:
            learner.step(train[lag - 1])  # one real update: the probe batch is now `lag` versions old
        sums = _sums(learner, probe)
        print(json.dumps({**base, "lag": lag, "honest": _stats(sums), "honest_gap_over_1_plus_lag_max":
                          round(max(s.gap for g in sums for s in g) / (1 + lag), 5)}), flush=True)
    with HFBackend(resolve_model(args.other), threads=args.threads) as other:
        foreign = _sample(other, adapter, list(itertools.islice(tasks, args.prompts)), 4, params, "liar")
    liars = {f"fabricated_{c:g}": _stats(_sums(learner, probe, fabricate=c)) for c in (-0.01, -0.1, -1.0)}
    print(json.dumps({**base, "lag": args.lags, **liars, f"other_model_{args.other}": _stats(_sums(learner, foreign))}),
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("runs")
    r.add_argument("--model", default="tiny-random")
    r.add_argument("--steps", type=int, default=16)
    r.add_argument("--other", help="the liar's model (default: a peaked random tiny model)")
    r.add_argument("--set", action="append", default=[], help="config override key=value")
    r.add_argument("--lies", default="fabricate,other", choices=["fabricate,other", "fabricate", "other"],
                   help="the liar runs after the honest baseline (default both)")
    r.add_argument("--no-baseline", action="store_true", help="the liar runs only (no honest baseline run first)")
    r.set_defaults(func=runs)
    g = sub.add_parser("gaps")
    g.add_argument("--model", default="smollm2-135m")
    g.add_argument("--other", default="tiny-random")
    g.add_argument("--lags", type=int, default=3)
    g.add_argument("--lr", type=float, default=3e-6)  # the main job's before it moved to 1e-5 (docs/security.md's runs)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--max-new-tokens", type=int, default=48)
    g.add_argument("--prompts", type=int, default=8)
    g.add_argument("--threads", type=int, default=None)
    g.set_defaults(func=gaps)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
