"""Live cost-aware scheduler on this machine: warm-up calibration, provisioning, a killed worker
replaced from the standby pool, and the measured learner idle share against `echo2 plan`'s prediction.

    .venv/bin/python examples/scheduler_failover.py --out runs/failover

Three local workers with different prices join; the warm-up measures T_train (median of 5 offline
steps), T_bcast (one real publication) and each worker's mu_i, and the scheduler keeps the cheapest
workers that reach mu_target = gamma * mu_min active, the rest registered and idle. After
--kill-at-step steps the script kills an active worker; the scheduler activates a standby one. At the
end the run's own measurements after the failover (mean T_train, median T_bcast of the later steps, each
active worker's end-to-end throughput: trajectories the coordinator accepted per second) go through
echo2sdk.plan.make_plan, and its predicted idle shares are printed next to the measured one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from echo2sdk import Echo2
from echo2sdk.plan import CatalogEntry, format_plan, make_plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/failover")
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--kill-at-step", type=int, default=5)
    ap.add_argument("--skip", type=int, default=4, help="steps after the kill before measuring")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    prices = {f"local-{i}": round(0.35 + 0.10 * i, 2) for i in range(args.workers)}  # local-0 cheapest
    overrides = [
        f'model.policy="{args.model}"', f"rollout.workers={args.workers}", f"learner.steps={args.steps}",
        "scheduler.enabled=true", f"scheduler.prices={json.dumps(prices).replace(':', ' =')}",
        f'run.out="{args.out}"', "run.progress=false", *args.set,
    ]
    echo = Echo2.from_config("examples/scheduler_failover.toml", overrides)
    cal = echo.warmup()
    tr = echo._trainer
    killed: dict[str, object] = {}
    marks: list[tuple[float, int, dict[str, int], list[str]]] = []  # (time, steps, accepted per worker, active)

    def monitor() -> None:
        done = -1
        while not stop.is_set():
            if len(tr.rows) != done:
                done = len(tr.rows)
                workers = dict(tr.coordinator.workers)
                active = [w for w, i in workers.items() if i.alive and i.active]
                marks.append((time.monotonic(), done, {w: i.trajectories for w, i in workers.items()}, active))
                if done == args.kill_at_step and not killed:
                    victim = sorted(w.worker_id for w in tr.coordinator.alive_workers() if w.active)[0]
                    tr.procs[int(victim.split("-")[1])].kill()
                    killed.update(worker=victim, at_step=done, t=time.monotonic())
            time.sleep(0.05)

    stop = threading.Event()
    threading.Thread(target=monitor, daemon=True).start()
    summary = echo.run()

    out = Path(args.out)
    if not (out / "scheduler.jsonl").exists():
        raise SystemExit(f"the scheduler did not run (see {out / 'run.log'}): {cal['decision']}")
    events = [json.loads(line) for line in (out / "scheduler.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # The pool after the failover, once the backlog built before the kill is used up: steps from
    # kill + skip on. Throughput = trajectories the coordinator accepted from each active worker.
    stop.set()
    t_kill = float(killed["t"])
    first_step = int(killed["at_step"]) + args.skip
    t_a, _, got_a, _ = next(m for m in marks if m[1] == first_step)
    t_b, _, got_b, active = next(m for m in marks if m[1] == len(rows))  # at the last step, before shutdown
    mu = {w: (got_b.get(w, 0) - got_a.get(w, 0)) / (t_b - t_a) for w in active}  # end-to-end mu_i
    after = rows[first_step:]
    # the mean, not the warm-up's median: idle share = wait / (wait + busy) sums the same steps' T_train
    t_train = statistics.fmean(r["t_train_s"] for r in after)
    bcasts = [r["t_bcast_s"] for r in after if r["t_bcast_s"] is not None]
    t_bcast = statistics.median(bcasts) if bcasts else float(cal["T_bcast"])  # none measured: warm-up's
    wait, busy = sum(r["learner_wait_s"] for r in after), sum(r["t_train_s"] for r in after)
    measured_idle = wait / (wait + busy)
    cfg = echo.config
    catalog = [CatalogEntry(w, prices.get(w, 0.0), m) for w, m in sorted(mu.items())]
    plan = make_plan(catalog, T_train=t_train, T_bcast=t_bcast, R=cfg.learner.trajectories_per_step,
                     S=cfg.learner.staleness, gamma=cfg.scheduler.gamma)
    replaced = [e for e in events if e["event"] in ("failed", "activate") and e["t"] >= t_kill - 1]
    report = {
        "calibration": {k: cal[k] for k in ("T_train", "T_bcast", "mu")},
        "provisioned": next(e for e in events if e["event"] == "provisioned"),
        "killed": killed,
        "after_kill": replaced,
        "measured_after_kill": {"from_step": first_step + 1, "steps": len(after), "T_train": t_train, "T_bcast": t_bcast, "mu": mu,
                                "mu_pool": sum(mu.values()), "idle_share": measured_idle},
        "run_bubble_ratio": summary["bubble_ratio"],
        "plan_for_measured": plan.to_dict(),
        "idle_share_predicted_eq1": plan.idle_share,
        "idle_share_predicted_overlap": plan.idle_share_overlap,
        "idle_share_measured": measured_idle,
        "difference_points_overlap": 100 * abs(plan.idle_share_overlap - measured_idle),
        "difference_points_eq1": 100 * abs(plan.idle_share - measured_idle),
    }
    (out / "failover.json").write_text(json.dumps(report, indent=2, default=str))
    print(format_plan(plan))
    keys = ("killed", "after_kill", "measured_after_kill", "idle_share_predicted_eq1", "idle_share_predicted_overlap",
            "idle_share_measured", "difference_points_overlap", "difference_points_eq1")
    print(json.dumps({k: report[k] for k in keys}, indent=2, default=str))


if __name__ == "__main__":
    main()
