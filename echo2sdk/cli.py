"""`echo2 ...`: a thin shell over the library. It parses arguments and calls library functions."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

__all__ = ["main"]


def _run(args: argparse.Namespace) -> int:
    from echo2sdk.api import Echo2

    overrides = list(args.set or [])
    if args.out:
        overrides.append(f"run.out={json.dumps(args.out)}")
    echo = Echo2.from_config(args.config, overrides)
    summary = echo.run()
    keep = ("steps", "wall_s", "reward_first5", "reward_last5", "accuracy_first5", "accuracy_last5",
            "staleness_max", "T_train_median_s", "T_bcast_median_s", "bubble_ratio", "checkpoint")
    print(json.dumps({k: summary[k] for k in keep}, indent=2))
    return 0


def _worker(args: argparse.Namespace) -> int:
    from echo2sdk.runtime.worker import run_worker

    token = args.token or os.environ.get("ECHO2_TOKEN")
    if not token:
        print("echo2 worker: give --token or set ECHO2_TOKEN", file=sys.stderr)
        return 2
    if args.nice:
        os.nice(args.nice)
    return run_worker(
        args.connect,
        token,
        worker_id=args.id,
        price_per_hour=args.price,
        relay=not args.no_relay,
        relay_only=args.relay_only,
        relay_uplink_bps=args.relay_uplink_mbps * 1e6 / 8 if args.relay_uplink_mbps else None,
        reconnect_s=args.reconnect_s,
        connect_timeout_s=args.connect_timeout_s,
    )


def _plan(args: argparse.Namespace) -> int:
    from echo2sdk.plan import format_plan, load_catalog, make_plan

    plan = make_plan(
        load_catalog(args.catalog),
        T_train=args.t_train,
        R=args.R,
        S=args.S,
        kappa=args.kappa,
        gamma=args.gamma,
        T_bcast=args.t_bcast,
        snapshot_gb=args.snapshot_gb,
        B0_mbps=args.b0,
        Bw_mbps=args.bw,
        chunk_mb=args.chunk_mb,
        install_s=args.install_s,
        learner_price_per_hour=args.learner_price,
        solver=args.solver,
    )
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    return 0 if plan.feasible else 1


def _simulate(args: argparse.Namespace) -> int:
    from echo2sdk.errors import ConfigError

    if args.scenario != "paper":
        raise ConfigError(f"echo2 simulate: unknown scenario {args.scenario!r} (known: paper)")
    from echo2sdk.sim.paper import run_paper, summary_lines

    results = run_paper(args.out, plots=not args.no_plots, quick=args.quick)
    print("\n".join(summary_lines(results)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="echo2", description="ECHO-2 RL post-training")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train from a TOML config")
    r.add_argument("config", help="path to a TOML config (see examples/)")
    r.add_argument("--out", help="output folder (overrides run.out)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. learner.steps=10")
    r.set_defaults(func=_run)
    w = sub.add_parser("worker", help="start a rollout worker that joins a coordinator")
    w.add_argument("--connect", required=True, metavar="HOST:PORT")
    w.add_argument("--token", help="shared token (default: $ECHO2_TOKEN)")
    w.add_argument("--id", help="worker id (default: hostname-pid)")
    w.add_argument("--price", type=float, default=0.0, help="$/h of this machine, for cost-aware activation")
    w.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by N (0-19)")
    w.add_argument("--no-relay", action="store_true", help="do not serve snapshot chunks to peers (behind a NAT)")
    w.add_argument("--relay-only", action="store_true", help="forward snapshots, generate nothing (bandwidth helper)")
    w.add_argument("--relay-uplink-mbps", type=float, help="pace what this worker forwards (emulate a capped uplink)")
    w.add_argument("--connect-timeout-s", type=float, default=60.0, metavar="S",
                   help="keep dialling a coordinator that is not up yet for S seconds, then exit 1")
    w.add_argument("--reconnect-s", type=float, default=120.0, metavar="S",
                   help="re-dial a lost coordinator for up to S seconds, keeping the model loaded (0: exit at once)")
    w.set_defaults(func=_worker)
    pl = sub.add_parser("plan", help="provisioning decision: mu_min, mu_target, chosen workers, cost, idle share")
    pl.add_argument("--catalog", required=True, help="worker catalog, .toml ([[worker]]) or .csv: name, price_per_hour, mu, count")
    pl.add_argument("--t-train", type=float, required=True, help="T_train: seconds per learner step")
    pl.add_argument("--R", type=float, required=True, help="R: trajectories per learner step")
    pl.add_argument("--S", type=int, required=True, help="S: staleness budget (kappa = S - 1)")
    pl.add_argument("--kappa", type=int, help="publication period (default S - 1)")
    pl.add_argument("--gamma", type=float, default=1.1, help="safety factor (default 1.1)")
    pl.add_argument("--t-bcast", type=float, help="T_bcast in seconds; or estimate it with --snapshot-gb/--b0/--bw")
    pl.add_argument("--snapshot-gb", type=float, help="snapshot size in GB (1e9 bytes)")
    pl.add_argument("--b0", type=float, help="learner uplink B0 in Mbit/s (default: unlimited)")
    pl.add_argument("--bw", type=float, help="per-worker link Bw in Mbit/s")
    pl.add_argument("--chunk-mb", type=float, default=64.0, help="chunk size in MiB (default 64)")
    pl.add_argument("--install-s", type=float, default=0.0, help="seconds from last byte to generating")
    pl.add_argument("--learner-price", type=float, default=0.0, help="$/h of the learner cluster")
    pl.add_argument("--solver", choices=["exact", "greedy"], default="exact",
                    help="worker selection: exact min-cost cover (default) or the paper's greedy cheapest-rho prefix")
    pl.add_argument("--json", action="store_true", help="print JSON")
    pl.set_defaults(func=_plan)
    sm = sub.add_parser("simulate", help="paper-scale experiments on the discrete-event simulator")
    sm.add_argument("scenario", choices=["paper"], help="'paper': Fig. 3(c), Fig. 4, Tables 2 and 4, cost")
    sm.add_argument("--out", default="runs/paper", help="output folder for paper.json and the PNGs")
    sm.add_argument("--quick", action="store_true", help="smaller sweeps (seconds, for a smoke test)")
    sm.add_argument("--no-plots", action="store_true", help="write paper.json only (no matplotlib needed)")
    sm.set_defaults(func=_simulate)
    ev = sub.add_parser("eval", help="net chip change of base and trained policies vs rule-based and LLM opponents")
    ev.add_argument("--env", default="poker://nlhe_headsup_v1", help="sandbox env URL")
    ev.add_argument("--base", default="smollm2-135m", help="the base policy (model name or HF folder)")
    ev.add_argument("--trained", help="the trained policy, e.g. runs/poker/checkpoint")
    ev.add_argument("--opponents", default="calling_station,tight_aggressive,loose_aggressive,llm")
    ev.add_argument("--hands", type=int, default=100, help="seeded hands per (policy, opponent) cell")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--max-new-tokens", type=int, default=12)
    ev.add_argument("--temperature", type=float, default=0.7)
    ev.add_argument("--json", help="also write the table as JSON to this path")
    ev.add_argument("--backend", default="hf", help="inference backend of the evaluated policies (hf, vllm, ...)")
    ev.add_argument("--batch", type=int, default=16, help="hands played side by side (one generate call per turn)")
    ev.set_defaults(func=_eval)
    return p


def _eval(args: argparse.Namespace) -> int:
    from echo2sdk.adapters.evaluate import evaluate, format_table

    # the table goes to stdout: keep an in-process vLLM engine's INFO/WARNING lines off it (unless asked for)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    policies = {f"base ({args.base})": args.base}
    if args.trained:
        policies[f"trained ({args.trained})"] = args.trained
    table = evaluate(
        args.env,
        policies,
        opponents=[o.strip() for o in args.opponents.split(",") if o.strip()],
        hands=args.hands,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        llm_opponent_model=args.base,
        backend=args.backend,
        batch=args.batch,
        on_cell=lambda label, opp, c, dt: print(
            f"  {label} vs {opp}: {c.mean:+.3f} ± {c.ci95:.3f} over {c.hands} hands ({dt:.0f} s)", file=sys.stderr, flush=True
        ),
    )
    print(format_table(table, env=args.env, hands=args.hands, seed=args.seed))
    if args.json:
        data = {p: {o: {k: v for k, v in vars(c).items() if k != "values"} for o, c in row.items()} for p, row in table.items()}
        with open(args.json, "w") as fh:
            json.dump({"env": args.env, "hands": args.hands, "seed": args.seed, "table": data}, fh, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # A run shows a progress bar and writes INFO to DIR/run.log; the console gets warnings only.
    level = logging.WARNING if args.command in ("run", "plan", "simulate") else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from echo2sdk.errors import Echo2Error

    try:
        return args.func(args)
    except Echo2Error as e:
        print(f"echo2: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
