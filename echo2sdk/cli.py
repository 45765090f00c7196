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
    from echo2sdk.core.worker import run_worker

    token = args.token or os.environ.get("ECHO2_TOKEN")
    if not token:
        print("echo2 worker: give --token or set ECHO2_TOKEN", file=sys.stderr)
        return 2
    if args.nice:
        os.nice(args.nice)
    return run_worker(args.connect, token, worker_id=args.id, price_per_hour=args.price)


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
    w.set_defaults(func=_worker)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # A run shows a progress bar and writes INFO to DIR/run.log; the console gets warnings only.
    level = logging.WARNING if args.command == "run" else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from echo2sdk.errors import Echo2Error

    try:
        return args.func(args)
    except Echo2Error as e:
        print(f"echo2: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
