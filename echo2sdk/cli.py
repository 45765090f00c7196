"""`echo2 ...`: a thin shell over the library. It parses arguments and calls library functions."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

__all__ = ["main"]


def _run(args: argparse.Namespace) -> int:
    from echo2sdk.api import Echo2

    if args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:  # not yet under torchrun: re-execute there
        from echo2sdk.runtime.distributed import launch_argv

        argv = launch_argv(args.nproc_per_node, _run_argv(args))
        os.execv(argv[0], argv)
    overrides = list(args.set or [])
    out = args.out
    if args.resume and not out:  # continue in the folder of the run being resumed
        from echo2sdk.runtime.checkpoint import run_folder

        out = str(run_folder(args.resume))
    if out:
        overrides.append(f"run.out={json.dumps(out)}")
    echo = Echo2.from_config(args.config, overrides, resume=args.resume)
    summary = echo.run()
    if not summary:  # a torchrun rank other than 0
        return 0
    keep = ("steps", "wall_s", "reward_first5", "reward_last5", "accuracy_first5", "accuracy_last5",
            "staleness_max", "T_train_median_s", "T_bcast_median_s", "bubble_ratio", "checkpoint", "stopped")
    print(json.dumps({k: summary[k] for k in keep}, indent=2))
    stopped = summary.get("stopped")
    return 128 + int(getattr(signal, stopped)) if stopped else 0  # the shell's convention for a signal


def _run_argv(args: argparse.Namespace) -> list[str]:
    """`echo2 run ...` as given, without --nproc-per-node (what every rank runs)."""
    argv = ["run", args.config]
    for item in args.set or []:
        argv += ["--set", item]
    for flag, value in (("--out", args.out), ("--resume", args.resume)):
        if value:
            argv += [flag, value]
    return argv


def _worker(args: argparse.Namespace) -> int:
    from echo2sdk.runtime.worker import run_worker

    token = args.token or os.environ.get("ECHO2_TOKEN")
    if not token:
        print("echo2 worker: give --token or set ECHO2_TOKEN", file=sys.stderr)
        return 2
    if args.nice:
        os.nice(args.nice)
    pin = None
    if args.coordinator_fingerprint:
        from echo2sdk.runtime.tls import parse_fingerprint

        pin = parse_fingerprint(args.coordinator_fingerprint)
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
        allow_plugins=args.allow_plugin or (),
        tls=not args.plaintext,
        coordinator_fingerprint=pin,
        relay_tls=False if args.relay_plaintext else None,
        model=args.model,
    )


def _keys(args: argparse.Namespace) -> int:
    from echo2sdk.runtime.tls import Identity

    folder = Identity.generate(args.name, days=args.days).save(args.out)
    fp = Identity.load(folder).fingerprint.hex()
    print(json.dumps({"folder": str(folder), "fingerprint": fp}, indent=2))
    return 0


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


def _run_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="train from a TOML config")
    r.add_argument("config", help="path to a TOML config (see examples/)")
    r.add_argument("--out", help="output folder (overrides run.out)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. learner.steps=10")
    r.add_argument("--resume", metavar="DIR", help="continue from the newest checkpoint of run folder DIR "
                   "(or from checkpoint folder DIR/checkpoints/step-N); output goes on in DIR unless --out")
    r.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="shard the learner over N local processes (FSDP2 under torchrun; one GPU each on CUDA, "
                   "gloo on CPUs). Several machines: torchrun ... -m echo2sdk.cli run CONFIG")
    r.set_defaults(func=_run)


def _plot(args: argparse.Namespace) -> int:
    from echo2sdk.plot import plot_run

    result = plot_run(args.run_dir, args.out)
    for path in result.written:
        print(path)
    for name, why in result.skipped.items():
        print(f"{name}: skipped: {why}")
    return 0


def _plot_parser(sub: argparse._SubParsersAction) -> None:
    pt = sub.add_parser("plot", help="PNGs of a run: reward, accuracy, staleness, learner wait, T_bcast, workers, cost")
    pt.add_argument("run_dir", metavar="RUN_DIR", help="a run's output folder (it holds metrics.jsonl)")
    pt.add_argument("--out", metavar="DIR", help="folder for the PNGs (default RUN_DIR/plots)")
    pt.set_defaults(func=_plot)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("echo2sdk")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from echo2sdk import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="echo2", description="ECHO-2 RL post-training")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true",
                      help="errors only on the console, and no progress bar (DIR/run.log keeps everything)")
    loud.add_argument("-v", "--verbose", action="store_true", help="INFO messages on the console too")
    sub = p.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    _worker_parser(sub)
    _keys_parser(sub)
    _plot_parser(sub)
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
    ev.add_argument("--opponents", help="comma-separated; default: the env plug-in's (poker: 3 rule-based + llm)")
    ev.add_argument("--metric", help="meta.extra field averaged per cell; default: the plug-in's (poker chips)")
    ev.add_argument("--hands", type=int, default=100, help="seeded hands per (policy, opponent) cell")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--max-new-tokens", type=int, default=12)
    ev.add_argument("--temperature", type=float, default=0.7)
    ev.add_argument("--json", help="also write the table as JSON to this path")
    ev.add_argument("--backend", default="hf", help="inference backend of the evaluated policies (hf, vllm, ...)")
    ev.add_argument("--batch", type=int, default=16, help="hands played side by side (one generate call per turn)")
    ev.set_defaults(func=_eval)
    return p


def _worker_parser(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("worker", help="start a rollout worker that joins a coordinator")
    w.add_argument("--connect", required=True, metavar="HOST:PORT")
    w.add_argument("--token", help="shared token (default: $ECHO2_TOKEN)")
    w.add_argument("--id", help="worker id (default: hostname-pid)")
    w.add_argument("--model", help="local model folder, built-in name or Hugging Face hub id to serve "
                   "(default: what the coordinator names)")
    w.add_argument("--price", type=float, default=0.0, help="$/h of this machine, for cost-aware activation")
    w.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by N (0-19)")
    w.add_argument("--no-relay", action="store_true", help="do not serve snapshot chunks to peers (behind a NAT)")
    w.add_argument("--relay-only", action="store_true", help="forward snapshots, generate nothing (bandwidth helper)")
    w.add_argument("--relay-uplink-mbps", type=float, help="pace what this worker forwards (emulate a capped uplink)")
    w.add_argument("--connect-timeout-s", type=float, default=60.0, metavar="S",
                   help="keep dialling a coordinator that is not up yet for S seconds, then exit 1")
    w.add_argument("--reconnect-s", type=float, default=120.0, metavar="S",
                   help="re-dial a lost coordinator for up to S seconds, keeping the model loaded (0: exit at once)")
    w.add_argument("--allow-plugin", action="append", metavar="PKG.MOD:ATTR",
                   help="let the coordinator's config name this unregistered plug-in or component (repeatable); "
                        "registered entry points need no flag")
    w.add_argument("--plaintext", action="store_true",
                   help="no TLS: only against a coordinator started with TLS off (token handshake and MACs still run)")
    w.add_argument("--relay-plaintext", action="store_true",
                   help="serve snapshot chunks without TLS (faster; chunks stay verified, the weights travel in clear)")
    w.add_argument("--coordinator-fingerprint", metavar="SHA256",
                   help="pin the coordinator's certificate (as `echo2 keys` printed it)")
    w.set_defaults(func=_worker)


def _keys_parser(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser("keys", help="make a TLS certificate and key for the coordinator (prints its fingerprint)")
    k.add_argument("--out", required=True, help="folder for echo2-cert.pem and echo2-key.pem (mode 0600)")
    k.add_argument("--name", default="echo2", help="the certificate's common name")
    k.add_argument("--days", type=int, default=365, help="validity in days")
    k.set_defaults(func=_keys)


def _eval(args: argparse.Namespace) -> int:
    from echo2sdk.adapters.evaluate import evaluate, format_table

    # the table goes to stdout: keep an in-process vLLM engine's INFO/WARNING lines off it (unless asked for)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from echo2sdk.adapters.registry import load_env_plugin, parse_env

    plugin = load_env_plugin(parse_env(args.env)[0])
    metric = args.metric or getattr(plugin, "eval_metric", "chips")
    policies = {f"base ({args.base})": args.base}
    if args.trained:
        policies[f"trained ({args.trained})"] = args.trained
    table = evaluate(
        args.env,
        policies,
        opponents=[o.strip() for o in args.opponents.split(",") if o.strip()] if args.opponents else None,
        metric=metric,
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
    unit = getattr(plugin, "eval_unit", "hand")
    print(format_table(table, env=args.env, hands=args.hands, seed=args.seed, metric=metric, unit=unit))
    if args.json:
        data = {p: {o: {k: v for k, v in vars(c).items() if k != "values"} for o, c in row.items()} for p, row in table.items()}
        with open(args.json, "w") as fh:
            json.dump({"env": args.env, "hands": args.hands, "seed": args.seed, "metric": metric, "table": data}, fh, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # A run shows a progress bar and writes INFO to DIR/run.log; the console gets warnings only.
    level = logging.WARNING if args.command in ("run", "plan", "simulate", "plot") else logging.INFO
    if args.quiet:
        level = logging.ERROR
        if args.command == "run":
            args.set = [*(args.set or []), "run.progress=false"]
    elif args.verbose:
        level = logging.INFO
    before = set(logging.getLogger().handlers)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in set(logging.getLogger().handlers) - before:  # the console handler: INFO records that the
        handler.setLevel(level)  # echo2sdk logger lets through for DIR/run.log stay off the console
    from echo2sdk.errors import Echo2Error

    try:
        return args.func(args)
    except Echo2Error as e:
        print(f"echo2: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
