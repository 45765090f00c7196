"""Learner-side framework overhead: the share of the learner's active wall time (waiting for data
excluded) that is not forward, backward or optimizer, during a short real run with 2 worker processes.

Baseline in the same run: the same Learner.step called back to back on one batch with no coordinator,
buffer or publication, which is the floor of what a step costs outside fwd/bwd/opt (batch building).

    .venv/bin/python bench/overhead.py [--model smollm2-135m] [--steps 8]

Prints one JSON line per measurement with its parameters.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def _overhead(rows: list[dict]) -> dict:
    rows = rows[1:]  # the first step includes start-up
    active = compute = wait = 0.0
    prev = None
    for r in rows:
        interval = r["time_s"] - prev if prev is not None else r["t_step_wall_s"]
        prev = r["time_s"]
        active += interval - r["learner_wait_s"]
        wait += r["learner_wait_s"]
        compute += r["t_forward_s"] + r["t_backward_s"] + r["t_optim_s"]
    return {
        "overhead_share": (active - compute) / active,
        "active_s": active,
        "compute_s": compute,
        "wait_s": wait,
        "wait_share_of_wall": wait / (wait + active),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--R", type=int, default=16)
    args = p.parse_args()

    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.recipe import Trainer

    out = tempfile.mkdtemp(prefix="echo2-overhead-")
    cfg = load_config(
        "examples/math_smollm2.toml",
        [
            f'model.policy="{args.model}"',
            f"learner.steps={args.steps}",
            f"learner.trajectories_per_step={args.R}",
            "run.progress=false",
            f'run.out="{out}"',
        ],
    )
    params = {"model": args.model, "steps": args.steps, "R": args.R, "workers": cfg.rollout.workers}
    tr = Trainer(cfg)
    try:
        tr.run()
        run = _overhead(tr.rows)
        print(json.dumps({"bench": "overhead", "mode": "echo2_run", **params, **run}))
        groups = tr.last_batch  # baseline input: the run's last batch
    finally:
        tr.close()
    if groups:
        active = compute = 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            st = tr.learner.step(groups)
            active += time.perf_counter() - t0
            compute += st.t_forward_s + st.t_backward_s + st.t_optim_s
        print(
            json.dumps(
                {"bench": "overhead", "mode": "bare_learner_step", **params, "overhead_share": (active - compute) / active}
            )
        )


if __name__ == "__main__":
    main()
