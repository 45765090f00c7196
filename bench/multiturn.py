"""Multi-turn learner cost: one Learner.step on synthetic multi-turn episodes against one on single-turn
records with the same number of trained tokens (the baseline, in the same run).

A multi-turn record is shaped like core/episodes.py makes them: prompt_ids = the opening (system + first
user turn, shared by the group), response_ids = a_1 + u_2 + a_2 + ... + a_T with loss_mask 1 on the actions
a_t and 0 on the rendered user turns u_t. The single-turn baseline has the same groups of the same prompts
and one response per record of `turns x action_tokens` tokens, every one trained: the same trained tokens
without the observation tokens in between.

Every case runs in a fresh subprocess, so its peak RSS (ru_maxrss) is its own; `rss_model_gib` is the RSS
after the learner is built (weights, optimizer and reference), so peak - model is what the step added.
`cpu_s` is the process's CPU time (user + system) over the step: on a shared machine it moves far less with
the other load than the wall time does (run with --threads 1 there, so that no thread spins waiting).

    nice -n 10 .venv/bin/python bench/multiturn.py [--model smollm2-135m] [--turns 12] [--episodes 8]

Prints one JSON line per case with its parameters (s_per_step: the timed step's T_train; s_per_trained_token:
that over the batch's loss tokens; record_tokens: prompt + response tokens of all records) and a last line
with the multi-turn / single-turn ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

GIB = 1 << 30


def _episode_groups(a: argparse.Namespace, vocab: int) -> list[list]:
    """`episodes` records in groups of `group_size`: `turns` actions of `action_tokens` tokens (mask 1)
    with a user turn of obs_min..obs_max tokens (mask 0) between consecutive actions."""
    from echo2sdk.core.records import Meta, Trajectory

    rng = random.Random(a.seed)
    tok = lambda n: tuple(rng.randrange(3, vocab) for _ in range(n))  # noqa: E731
    groups = []
    for g in range(a.episodes // a.group_size):
        prompt = tok(a.prompt_tokens)
        group = []
        for _ in range(a.group_size):
            ids: list[int] = []
            mask: list[int] = []
            lp: list[float] = []
            for t in range(a.turns):
                if t:
                    u = tok(rng.randint(a.obs_min, a.obs_max))
                    ids += u
                    mask += [0] * len(u)
                    lp += [0.0] * len(u)
                ids += tok(a.action_tokens)
                mask += [1] * a.action_tokens
                lp += [-rng.uniform(0.5, 3.0) for _ in range(a.action_tokens)]
            meta = Meta(group_id=f"g{g}", prompt_ids=prompt, response_ids=tuple(ids), logprobs=tuple(lp),
                        loss_mask=tuple(mask))
            group.append(Trajectory(prompt="p", response="y", reward=rng.random(), version=0, meta=meta))
        groups.append(group)
    return groups


def _single_turn_groups(a: argparse.Namespace, vocab: int) -> list[list]:
    """The same groups with one trained response of turns x action_tokens tokens per record."""
    from echo2sdk.core.records import Meta, Trajectory

    out = []
    for group in _episode_groups(a, vocab):
        recs = []
        for t in group:
            m = t.meta
            resp = tuple(i for i, k in zip(m.response_ids, m.loss_mask) if k)
            lp = tuple(x for x, k in zip(m.logprobs, m.loss_mask) if k)
            meta = Meta(group_id=m.group_id, prompt_ids=m.prompt_ids, response_ids=resp, logprobs=lp)
            recs.append(Trajectory(prompt="p", response="y", reward=t.reward, version=0, meta=meta))
        out.append(recs)
    return out


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _case(a: argparse.Namespace) -> dict:
    """Runs in the child: build the learner, warm up (optional), time one step."""
    import torch

    from echo2sdk.core.learner import Learner
    from echo2sdk.weights import resolve_model

    kw = dict(lr=1e-6, beta=a.beta, micro_batch=a.micro_batch, precision=a.precision, updates_per_step=a.updates,
              threads=a.threads or None)
    if a.token_budget is not None:
        kw["token_budget"] = a.token_budget
    learner = Learner(resolve_model(a.model), **kw)
    rss_model = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    build = _episode_groups if a.case == "multiturn" else _single_turn_groups
    groups = build(a, learner.vocab_size)
    rows = [t.meta for g in groups for t in g]
    for _ in range(a.warmup):
        learner.step(groups)
    cpu0, t0 = _cpu_s(), time.perf_counter()
    st = learner.step(groups)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    return {
        "case": a.case,
        "records": len(rows),
        "trained_tokens": st.tokens,
        "record_tokens": sum(len(m.prompt_ids) + len(m.response_ids) for m in rows),
        "max_row_tokens": max(len(m.prompt_ids) + len(m.response_ids) for m in rows),
        "s_per_step": round(st.t_train_s, 3),
        "wall_s": round(wall, 3),
        "t_forward_s": round(st.t_forward_s, 3),
        "t_backward_s": round(st.t_backward_s, 3),
        "t_optim_s": round(st.t_optim_s, 3),
        "s_per_trained_token": st.t_train_s / st.tokens,
        "cpu_s": round(cpu, 3),
        "cpu_s_per_trained_token": cpu / st.tokens,
        "rss_model_gib": round(rss_model, 3),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 3),
        "loss": st.loss,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--episodes", type=int, default=8, help="records per step (R)")
    p.add_argument("--group-size", type=int, default=4, help="records per group (one shared prompt)")
    p.add_argument("--turns", type=int, default=12)
    p.add_argument("--action-tokens", type=int, default=40, help="tokens per model turn (loss mask 1)")
    p.add_argument("--obs-min", type=int, default=60, help="fewest tokens per user turn (loss mask 0)")
    p.add_argument("--obs-max", type=int, default=100)
    p.add_argument("--prompt-tokens", type=int, default=120)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--token-budget", type=int, default=None, help="learner token_budget (default: the learner's)")
    p.add_argument("--updates", type=int, default=1, help="updates_per_step")
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--precision", default="auto")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--warmup", type=int, default=0, help="untimed steps before the timed one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", default="singleturn,multiturn")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # the child
    a = p.parse_args()
    if a.episodes % a.group_size:
        p.error(f"--episodes ({a.episodes}) must be a multiple of --group-size ({a.group_size})")

    if a.case:
        print(json.dumps(_case(a)))
        return
    params = {k: v for k, v in vars(a).items() if k not in ("case", "cases")}
    results = {}
    for case in a.cases.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--case", case]
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
        results[case] = json.loads(out)
        print(json.dumps({"bench": "multiturn", **params, **results[case]}), flush=True)
    if {"singleturn", "multiturn"} <= results.keys():
        m, s = results["multiturn"], results["singleturn"]
        print(json.dumps({
            "bench": "multiturn", **params, "case": "ratio multiturn/singleturn",
            "s_per_trained_token": m["s_per_trained_token"] / s["s_per_trained_token"],
            "cpu_s_per_trained_token": m["cpu_s_per_trained_token"] / s["cpu_s_per_trained_token"],
            "record_tokens": m["record_tokens"] / s["record_tokens"],
            "peak_rss": m["peak_rss_gib"] / s["peak_rss_gib"],
            "step_added_rss": (m["peak_rss_gib"] - m["rss_model_gib"]) / (s["peak_rss_gib"] - s["rss_model_gib"]),
        }))


if __name__ == "__main__":
    main()
