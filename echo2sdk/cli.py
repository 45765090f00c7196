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

    if args.dry_run:
        return _dry_run(args)
    if args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:  # not yet under torchrun: re-execute there
        from echo2sdk.runtime.learner.distributed import launch_argv

        argv = launch_argv(args.nproc_per_node, _run_argv(args))
        os.execv(argv[0], argv)
    overrides = list(args.set or [])
    out = args.out
    if args.resume and not out:  # continue in the folder of the run being resumed
        from echo2sdk.runtime.learner.checkpoint import run_folder

        out = str(run_folder(args.resume))
    if out:
        overrides.append(f"run.out={json.dumps(out)}")
    if args.token_file:
        overrides.append(f"run.token_file={json.dumps(args.token_file)}")
    if any(item.partition("=")[0].strip() == "run.token" for item in args.set or []):
        from echo2sdk.runtime.trust.credentials import ARGV_WARNING

        print(f"echo2 run: warning: --set run.token: {ARGV_WARNING} (or run.token_file)", file=sys.stderr)
    if args.status_port is not None:
        overrides.append(f"run.status_port={args.status_port}")
    echo = Echo2.from_config(args.config, overrides, resume=args.resume)
    summary = echo.run()
    if not summary:  # a torchrun rank other than 0
        return 0
    keep = ("steps", "wall_s", "reward_first5", "reward_last5", "accuracy_first5", "accuracy_last5",
            "rollout_accuracy_first5", "rollout_accuracy_last5", "staleness_max", "T_train_median_s",
            "T_bcast_median_s", "bubble_ratio", "checkpoint", "stopped")
    print(json.dumps({k: summary[k] for k in keep}, indent=2))
    from echo2sdk.runtime.learner.console import refusals_line

    if line := refusals_line(summary.get("coordinator", {}).get("rejected", {})):
        print(f"echo2 run: {line}", file=sys.stderr)
    for error in summary.get("save_errors", []):  # trained, summarised, but not all of it saved
        print(f"echo2 run: error: {error} (metrics.jsonl and summary.json are in {echo.config.run.out})",
              file=sys.stderr)
    stopped = summary.get("stopped")
    if stopped:
        return 128 + int(getattr(signal, stopped))  # the shell's convention for a signal
    return 1 if summary.get("save_errors") else 0


def _dry_run(args: argparse.Namespace) -> int:
    from echo2sdk.config import load_config
    from echo2sdk.runtime.providers.dry_run import format_provisioning, provisioning_plan

    overrides = list(args.set or []) + ([f"run.out={json.dumps(args.out)}"] if args.out else [])
    plan = provisioning_plan(load_config(args.config, overrides))
    print(format_provisioning(plan, args.config))
    return 1 if plan.get("problems") else 0


def _fleet(args: argparse.Namespace) -> int:
    from echo2sdk.runtime.providers import ENDED, fleet_down, fleet_status

    if args.action == "down":
        result = fleet_down(args.run_dir, force=args.force)
        for name, said in sorted(result.items()):
            print(f"{name}: {said}")
        if not result:
            print(f"{args.run_dir}: every recorded machine is already down")
        return 0 if all(v in ENDED for v in result.values()) else 1
    rows = fleet_status(args.run_dir)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'machine':<16} {'provider':<9} {'type':<8} {'$/h':>7}  {'ledger':<7} now")
    for r in rows:
        price = f"{r['price_per_hour']:.3f}" if r["price_per_hour"] is not None else "-"
        why = f"  ({r['reason']})" if r["reason"] else ""
        print(f"{r['machine']:<16} {r['provider']:<9} {r['type'] or '-':<8} {price:>7}  {r['ledger']:<7} {r['now']}{why}")
    from echo2sdk.runtime.providers.ledger import holder

    if (pid := holder(args.run_dir)) is not None:
        print(f"the run is still going: process {pid} holds {args.run_dir}/.fleet.lock")
    up = [r for r in rows if r["now"] not in ("down", "gone")]
    print(f"{len(up)} of {len(rows)} recorded machines still up" + (f": echo2 fleet down {args.run_dir}" if up else ""))
    return 0


def _run_argv(args: argparse.Namespace) -> list[str]:
    """`echo2 run ...` as given, without --nproc-per-node (what every rank runs)."""
    argv = ["run", args.config]
    for item in args.set or []:
        argv += ["--set", item]
    for flag, value in (("--out", args.out), ("--resume", args.resume), ("--status-port", args.status_port),
                        ("--token-file", args.token_file)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def _worker(args: argparse.Namespace) -> int:
    from echo2sdk.runtime.worker.process import run_worker

    from echo2sdk.runtime.trust.credentials import ARGV_WARNING, MIN_TOKEN_BITS, given_token, token_bits

    from echo2sdk.runtime.trust.worker_keys import given_credential

    credential = given_credential(args.credential_file) if not (args.token or args.token_file) else None
    given = None if credential else given_token(args.token, args.token_file, names=("--token", "--token-file"))
    if credential is None and given is None:
        print("echo2 worker: give --token-file PATH or --credential-file PATH, or set ECHO2_TOKEN or "
              "ECHO2_CREDENTIAL", file=sys.stderr)
        return 2
    token, source = given or (None, "")
    if args.token:
        print(f"echo2 worker: warning: {ARGV_WARNING}", file=sys.stderr)
    if token is not None and token_bits(token) < MIN_TOKEN_BITS:  # the run refuses such a token; a hand-made Coordinator may not
        print(f"echo2 worker: warning: the token ({source}) is {len(token)} characters, about "
              f"{token_bits(token):.0f} bits: under the {MIN_TOKEN_BITS} bits a run requires", file=sys.stderr)
    from echo2sdk.runtime.worker.priority import lower_priority

    priority = lower_priority(args.nice)
    if args.nice:
        print(f"echo2 worker: CPU priority: {priority}", file=sys.stderr)
    pin = None
    if args.coordinator_fingerprint:
        from echo2sdk.runtime.trust.tls import parse_fingerprint

        pin = parse_fingerprint(args.coordinator_fingerprint)
    return run_worker(
        args.connect,
        token,
        credential=credential,
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
        relay_port=args.relay_port,
        model=args.model,
        bootstrap=args.bootstrap,
    )


def _keys(args: argparse.Namespace) -> int:
    from echo2sdk.runtime.trust.tls import Identity

    if args.worker:
        return _worker_credential(args)
    if not args.out:
        print("echo2 keys: give --out DIR (a certificate), or  worker NAME  (a worker credential)", file=sys.stderr)
        return 2
    folder = Identity.generate(args.name, days=args.days).save(args.out)
    fp = Identity.load(folder).fingerprint.hex()
    print(json.dumps({"folder": str(folder), "fingerprint": fp}, indent=2))
    return 0


def _worker_credential(args: argparse.Namespace) -> int:
    """`echo2 keys worker NAME`: print NAME's credential (NAME:KEY), derived from the run token."""
    from echo2sdk.runtime.trust.credentials import given_token
    from echo2sdk.runtime.trust.worker_keys import issue

    if len(args.worker) != 2 or args.worker[0] != "worker":
        print(f"echo2 keys: expected  worker NAME, got {' '.join(args.worker)!r}", file=sys.stderr)
        return 2
    given = given_token(None, args.token_file, names=("--token", "--token-file"))
    if given is None:
        print("echo2 keys worker: give the run token by --token-file PATH or $ECHO2_TOKEN", file=sys.stderr)
        return 2
    print(issue(given[0], args.worker[1]))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from echo2sdk import sky_catalog
    from echo2sdk.errors import ConfigError
    from echo2sdk.plan import filter_rate_of, format_plan, load_catalog, make_plan

    sky = None
    if sky_catalog.is_sky_spec(args.catalog):
        sky = sky_catalog.sky_catalog(args.catalog, args.mu_table, spot=args.spot, clouds=args.clouds,
                                      regions=args.regions)
    elif given := [o for o, v in (("--spot", args.spot), ("--clouds", args.clouds), ("--regions", args.regions),
                                  ("--mu-table", args.mu_table)) if v]:
        raise ConfigError(f"{', '.join(given)}: only with --catalog skypilot:TYPES (a catalog file has its own prices "
                          "and mu)")
    plan = make_plan(
        sky.entries if sky else load_catalog(args.catalog),
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
        delta_ratio=args.delta_ratio,
        anchor_every=args.anchor_every,
        **filter_rate_of(filter_rate=args.filter_rate, accuracy=args.accuracy, reward_shares=args.reward_shares,
                         filter_from=args.filter_from, group_size=args.group_size,
                         prompt_concentration=args.prompt_concentration),
    )
    if sky:
        plan.warnings[:0] = sky.warnings
    if args.json:
        print(json.dumps({**plan.to_dict(), **({"skypilot": sky.to_dict()} if sky else {})}, indent=2))
    else:
        print((sky_catalog.format_offerings(sky) + "\n" if sky else "") + format_plan(plan))
    return 0 if plan.feasible else 1


def _simulate(args: argparse.Namespace) -> int:
    from echo2sdk.errors import ConfigError

    skip = [f"--{n.replace('_', '-')}" for n in ("skip_rate", "skip_precision") if getattr(args, n) is not None]
    if skip and args.scenario != "filter":
        raise ConfigError(f"echo2 simulate: {', '.join(skip)} only with the 'filter' scenario, got {args.scenario!r}")
    if args.scenario == "launch":  # launch latency x spot preemptions x early activation
        from echo2sdk.sim.launch import launch_lines, run_launch

        print("\n".join(launch_lines(run_launch(args.out, quick=args.quick))))
        return 0
    if args.scenario == "filter":  # dynamic sampling's filter rate x provisioning on raw or useful rollouts x skip rate
        from echo2sdk.sim.filtering import filter_lines, run_filter

        results = run_filter(args.out, quick=args.quick, skip_rate=args.skip_rate or 0.0,
                             skip_precision=1.0 if args.skip_precision is None else args.skip_precision)
        print("\n".join(filter_lines(results)))
        return 0
    if args.scenario != "paper":
        raise ConfigError(f"echo2 simulate: unknown scenario {args.scenario!r} (known: paper, launch, filter)")
    from echo2sdk.sim.paper import run_paper, summary_lines

    results = run_paper(args.out, plots=not args.no_plots, quick=args.quick, delta_ratio=args.delta_ratio,
                        anchor_every=args.anchor_every)
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
    r.add_argument("--token-file", metavar="PATH", help="file holding the worker token (sets run.token_file; "
                   "default: run.token, else $ECHO2_TOKEN, else one drawn per run)")
    r.add_argument("--status-port", type=int, metavar="PORT", help="serve the live status page on PORT (0: a free "
                   "one; sets run.status_port); its URL with the token is printed at start")
    r.add_argument("--dry-run", action="store_true", help="print the provisioning plan (machine types, counts, "
                   "launch specs, $/h) and exit: nothing is launched")
    r.set_defaults(func=_run)


def _fleet_parser(sub: argparse._SubParsersAction) -> None:
    f = sub.add_parser("fleet", help="the machines a run launched (its ledger, RUN_DIR/machines.jsonl): status, or "
                       "down every one of them, even after the learner was killed")
    f.add_argument("action", choices=["status", "down"])
    f.add_argument("run_dir", metavar="RUN_DIR", help="the run's output folder")
    f.add_argument("--json", action="store_true", help="status as JSON")
    f.add_argument("--force", action="store_true", help="down: even while the run's learner is still going")
    f.set_defaults(func=_fleet)


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
    _fleet_parser(sub)
    _plan_parser(sub)
    _simulate_parser(sub)
    _eval_parser(sub)
    return p


def _plan_parser(sub: argparse._SubParsersAction) -> None:
    """echo2 plan: the provisioning decision for a worker catalog."""
    pl = sub.add_parser("plan", help="provisioning decision: mu_min, mu_target, chosen workers, cost, idle share")
    pl.add_argument("--catalog", required=True, help="worker catalog, .toml ([[worker]]) or .csv: name, price_per_hour, mu, "
                    "count; or skypilot:H100,L4,A100:8 for SkyPilot's cheapest price of each type (needs --mu-table)")
    pl.add_argument("--mu-table", metavar="FILE", help="with skypilot:TYPES, each type's mu (rollouts/s of one machine) "
                    "and count (default 1): .toml [[gpu]] tables or .csv with columns type, mu, count")
    pl.add_argument("--spot", action="store_true", help="with skypilot:TYPES, spot prices (default on-demand)")
    pl.add_argument("--clouds", metavar="LIST", help="with skypilot:TYPES, the clouds to price, e.g. aws,runpod "
                    "(default: a dozen GPU clouds, docs/provisioning.md)")
    pl.add_argument("--regions", metavar="REGEX", help="with skypilot:TYPES, only regions matching this regular "
                    "expression (searched, case-insensitive), e.g. '^us-'")
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
    pl.add_argument("--delta-ratio", type=float, help="with --snapshot-gb: delta snapshots of this fraction of the "
                    "full size (bench/delta.py measures it); T_bcast is the mean publication's")
    pl.add_argument("--anchor-every", type=int, default=10, help="with --delta-ratio: a full snapshot every N "
                    "publications (default 10)")
    pl.add_argument("--solver", choices=["exact", "greedy"], default="exact",
                    help="worker selection: exact min-cost cover (default) or the paper's greedy cheapest-rho prefix")
    pl.add_argument("--filter-rate", type=float, help="f: the share of GRPO groups dynamic sampling drops (zero reward "
                    "variance); the pool is sized on useful rollouts, R / (1 - f) generated a step")
    pl.add_argument("--accuracy", type=float, help="predict f from the policy's accuracy p on the task and --group-size "
                    "G (binary rewards): f = p^G + (1 - p)^G if every prompt is as hard, more with "
                    "--prompt-concentration")
    pl.add_argument("--reward-shares", metavar="Q1,Q2,...", help="predict f from the shares of the rollouts that get "
                    "each value of a reward of a few values (math: unformatted, boxed but wrong, right) and "
                    "--group-size G: f = sum_v Q_v^G if every prompt is as hard, more with --prompt-concentration; "
                    "a run's summary.json gives them (capacity.reward_shares)")
    pl.add_argument("--filter-from", metavar="RUN_DIR", help="predict f from a run's summary.json: its reward shares "
                    "and their concentration (or its accuracy and the prompts' concentration), at its group size or "
                    "--group-size G (a pilot run at G = 4 predicts f at G = 16)")
    pl.add_argument("--group-size", type=int, help="G, samples per prompt (with --accuracy, --reward-shares or "
                    "--filter-from)")
    pl.add_argument("--prompt-concentration", type=float, metavar="NU", help="how alike the task's prompts are (with "
                    "--accuracy: their success rates spread as Beta(p NU, (1 - p) NU), summary.json's "
                    "capacity.prompt_concentration; with --reward-shares: their shares spread as Dirichlet(NU Q), "
                    "capacity.reward_concentration). Default: alike")
    pl.add_argument("--json", action="store_true", help="print JSON")
    pl.set_defaults(func=_plan)


def _simulate_parser(sub: argparse._SubParsersAction) -> None:
    """echo2 simulate: the paper-scale experiments on the discrete-event simulator."""
    sm = sub.add_parser("simulate", help="paper-scale experiments on the discrete-event simulator")
    sm.add_argument("scenario", choices=["paper", "launch", "filter"], help="'paper': Fig. 3(c), Fig. 4, Tables 2 and "
                    "4, cost; 'launch': launch latency x spot preemptions x early activation (writes DIR/launch.json); "
                    "'filter': dynamic sampling's filter rate x a pool sized on raw or on useful rollouts "
                    "(x --skip-rate; writes DIR/filter.json)")
    sm.add_argument("--out", default="runs/paper", help="output folder for paper.json and the PNGs")
    sm.add_argument("--quick", action="store_true", help="smaller sweeps (seconds, for a smoke test)")
    sm.add_argument("--no-plots", action="store_true", help="write paper.json only (no matplotlib needed)")
    sm.add_argument("--delta-ratio", type=float, help="also full vs delta snapshots: a delta's bytes / the full "
                    "snapshot's (measured by bench/delta.py), at S = 2, 3, 6")
    sm.add_argument("--anchor-every", type=int, default=10, help="with --delta-ratio: a full snapshot every N "
                    "publications (default 10)")
    sm.add_argument("--skip-rate", type=float, metavar="S", help="with 'filter': also price the learner's "
                    "pre-rollout prompt filter skipping a share S of the drawn prompts (0 <= S < 1, never generated), "
                    "beside skip rate 0: generated groups are zero-variance at f_after = (f - S P) / (1 - S)")
    sm.add_argument("--skip-precision", type=float, metavar="P", help="with --skip-rate: the share of skipped "
                    "prompts that would have been zero-variance (default 1.0, the most skipping can save)")
    sm.set_defaults(func=_simulate)


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    """echo2 eval: base vs trained policy on held-out tasks or against opponents."""
    ev = sub.add_parser("eval", help="base vs trained policy: accuracy and reward on held-out tasks (--task), or net "
                        "chip change vs rule-based and LLM opponents (--env)")
    ev.add_argument("--env", help="sandbox env URL (default poker://nlhe_headsup_v1 unless --task)")
    ev.add_argument("--task", metavar="ADAPTER", help="a single-turn task adapter (e.g. math): accuracy and mean reward "
                    "on --tasks held-out tasks, adapter.tasks(1000003 + seed)")
    ev.add_argument("--task-option", action="append", metavar="KEY=VALUE",
                    help="an option of the --task adapter, TOML value (repeatable), e.g. difficulty=2")
    ev.add_argument("--env-option", action="append", metavar="KEY=VALUE",
                    help="an env_options key of the --env sandbox, TOML value (repeatable), e.g. free_fold=false")
    ev.add_argument("--tasks", type=int, default=100, help="held-out tasks per policy (with --task or --config)")
    ev.add_argument("--config", help="take the task (a [[task.mix]] mixture too: per-component rows), the base model "
                    "(model.policy), the answer length (rollout.max_new_tokens) and the temperature from this run "
                    "config instead of --task; a dataset:// component is evaluated on its own file's rows")
    ev.add_argument("--base", help="the base policy (model name or HF folder; default: --config's model.policy, else "
                    "smollm2-135m)")
    ev.add_argument("--trained", help="the trained policy, e.g. runs/poker/checkpoint")
    ev.add_argument("--opponents", help="comma-separated; default: the env plug-in's (poker: 3 rule-based + llm)")
    ev.add_argument("--metric", help="meta.extra field averaged per cell; default: the plug-in's (poker chips)")
    ev.add_argument("--hands", type=int, default=100, help="seeded hands per (policy, opponent) cell")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--max-new-tokens", type=int, help="default 12 per turn (--env), 64 per answer (--task)")
    ev.add_argument("--temperature", type=float, help="default: --config's rollout.temperature, else 0.7")
    ev.add_argument("--json", help="also write the table as JSON to this path")
    ev.add_argument("--backend", default="hf", help="inference backend of the evaluated policies (hf, vllm, ...)")
    ev.add_argument("--batch", type=int, default=16, help="hands played (or tasks answered) side by side")
    ev.set_defaults(func=_eval)


def _nice(value: str) -> int | str:
    from echo2sdk.core.checks import nice

    try:
        return nice(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _worker_parser(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("worker", help="start a rollout worker that joins a coordinator")
    w.add_argument("--connect", required=True, metavar="HOST:PORT")
    secret = w.add_mutually_exclusive_group()
    secret.add_argument("--token-file", metavar="PATH", help="file holding the run token (default: $ECHO2_TOKEN)")
    secret.add_argument("--token", help="the run token itself: readable by every user of this machine (ps); "
                        "prefer --token-file or $ECHO2_TOKEN")
    secret.add_argument("--credential-file", metavar="PATH",
                        help="file holding this worker's credential (NAME:KEY from `echo2 keys worker NAME`; default: "
                        "$ECHO2_CREDENTIAL when no token is given): logs in as worker NAME without the run token")
    w.add_argument("--id", help="worker id (default: hostname-pid)")
    w.add_argument("--model", help="local model folder, built-in name or Hugging Face hub id to serve "
                   "(default: what the coordinator names)")
    w.add_argument("--bootstrap", action="store_true",
                   help="this machine has no model: take its files from the coordinator over the authenticated "
                        "session, and its weights as any snapshot (the delivery, or the run's snapshot store with "
                        "this machine's AWS_*/cloud credentials), into $ECHO2_CACHE/bootstrap")
    w.add_argument("--price", type=float, default=0.0, help="$/h of this machine, for cost-aware activation")
    w.add_argument("--nice", type=_nice, default=0, metavar="N|idle",
                   help="lower this process's CPU priority to niceness N (0-19; never raised), or 'idle': run "
                        "only on cores nothing else wants (Linux SCHED_IDLE; local workers beside a learner)")
    w.add_argument("--no-relay", action="store_true", help="do not serve snapshot chunks to peers (behind a NAT)")
    w.add_argument("--relay-only", action="store_true", help="forward snapshots, generate nothing (bandwidth helper)")
    w.add_argument("--relay-uplink-mbps", type=float, help="pace what this worker forwards (emulate a capped uplink)")
    w.add_argument("--relay-port", type=int, default=0, metavar="PORT",
                   help="serve snapshot chunks on this port (default: any free one; a cloud firewall opens a fixed one)")
    w.add_argument("--connect-timeout-s", type=float, default=60.0, metavar="S",
                   help="keep dialling a coordinator that is not up yet for S seconds, then exit 1")
    w.add_argument("--reconnect-s", type=float, default=120.0, metavar="S",
                   help="re-dial a lost coordinator for up to S seconds, keeping the model loaded (0: exit at once)")
    w.add_argument("--allow-plugin", action="append", metavar="WHAT",
                   help="let the coordinator's config name what loads code or reads this machine (repeatable, exact "
                        "string): an unregistered plug-in or component PKG.MOD:ATTR, reasoning-gym://NAME of a "
                        "generator that evaluates answers, store.local (a snapshot store in a folder here), "
                        "store.NAME[=VALUE] (a store option beyond the connection ones, or the endpoint this "
                        "machine's credentials may go to), store.metadata (credentials from the instance-metadata "
                        "service); registered entry points need no flag (docs/security.md)")
    w.add_argument("--plaintext", action="store_true",
                   help="no TLS: only against a coordinator started with TLS off (token handshake and MACs still run)")
    w.add_argument("--relay-plaintext", action="store_true",
                   help="serve snapshot chunks without TLS (faster; chunks stay verified, the weights travel in clear)")
    w.add_argument("--coordinator-fingerprint", metavar="SHA256",
                   help="pin the coordinator's certificate (as `echo2 keys` printed it)")
    w.set_defaults(func=_worker)


def _keys_parser(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser("keys", help="make a TLS certificate and key for the coordinator (prints its fingerprint), "
                       "or print a worker credential:  echo2 keys worker NAME")
    k.add_argument("worker", nargs="*", metavar="worker NAME",
                   help="print worker NAME's credential (NAME:KEY, for `echo2 worker --credential-file`), derived "
                   "from the run token (--token-file PATH, else $ECHO2_TOKEN)")
    k.add_argument("--token-file", metavar="PATH", help="with  worker NAME: file holding the run token")
    k.add_argument("--out", help="folder for echo2-cert.pem and echo2-key.pem (mode 0600)")
    k.add_argument("--name", default="echo2", help="the certificate's common name")
    k.add_argument("--days", type=int, default=365, help="validity in days")
    k.set_defaults(func=_keys)


def _eval(args: argparse.Namespace) -> int:
    if args.task or args.config:
        return _eval_tasks(args)
    from echo2sdk.adapters.evaluate import HELD_OUT_SEED, default_metric, evaluate, finite, format_table, table_json
    from echo2sdk.config import key_values

    # the table goes to stdout: keep an in-process vLLM engine's INFO/WARNING lines off it (unless asked for)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from echo2sdk.adapters.registry import load_env_plugin, parse_env

    args.env = args.env or "poker://nlhe_headsup_v1"
    scheme = parse_env(args.env)[0]
    plugin = load_env_plugin(scheme)
    metric = args.metric or default_metric(scheme, plugin)
    env_options = dict(key_values(args.env_option, "--env-option"))
    _eval_defaults(args)
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
        max_new_tokens=args.max_new_tokens or 12,
        temperature=args.temperature,
        llm_opponent_model=args.base,
        env_options=env_options,
        backend=args.backend,
        batch=args.batch,
        on_cell=lambda label, opp, c, dt: print(
            f"  {label} vs {opp}: {c.mean:+.3f} ± {c.ci95:.3f} over {c.hands} hands ({dt:.0f} s)", file=sys.stderr, flush=True
        ),
    )
    unit = getattr(plugin, "eval_unit", "hand")
    print(format_table(table, env=args.env, hands=args.hands, seed=args.seed, metric=metric, unit=unit))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(finite({"env": args.env, "env_options": env_options, "hands": args.hands,
                              "seed": args.seed, "held_out_seed": HELD_OUT_SEED + args.seed, "metric": metric,
                              **table_json(table, metric)}), fh, indent=2, allow_nan=False)
    return 0


def _eval_defaults(args: argparse.Namespace) -> None:
    """--base and --temperature where neither the command line nor --config gave them."""
    args.base, args.temperature = args.base or "smollm2-135m", 0.7 if args.temperature is None else args.temperature


def _eval_tasks(args: argparse.Namespace) -> int:
    """`echo2 eval --task ADAPTER`: accuracy and mean reward of base (and trained) on held-out tasks."""
    from echo2sdk.adapters.evaluate import HELD_OUT_SEED, evaluate_tasks, finite, format_task_table, task_table_json
    from echo2sdk.config import key_values
    from echo2sdk.errors import ConfigError

    if args.env:
        raise ConfigError(f"echo2 eval: give --task or --env, not both (got --task {args.task} --env {args.env})")
    if args.env_option:
        raise ConfigError(f"echo2 eval: --env-option is for --env sandboxes; a --task adapter takes --task-option "
                          f"(got --env-option {args.env_option[0]!r})")
    options = dict(key_values(args.task_option, "--task-option"))
    max_new_tokens = args.max_new_tokens or 64
    if args.config:  # the run's task (a [[task.mix]] mixture included) and answer length
        from echo2sdk.config import load_config

        if args.task or options:
            raise ConfigError(f"echo2 eval: --config {args.config} names the task; drop --task / --task-option")
        cfg = load_config(args.config)
        args.task, options = cfg.task.adapter, dict(cfg.task.options)
        max_new_tokens = args.max_new_tokens or cfg.rollout.max_new_tokens
        args.base = args.base or cfg.model.policy
        args.temperature = cfg.rollout.temperature if args.temperature is None else args.temperature
    _eval_defaults(args)
    policies = {f"base ({args.base})": args.base}
    if args.trained:
        policies[f"trained ({args.trained})"] = args.trained
    table = evaluate_tasks(
        args.task, policies, options=options, tasks=args.tasks, seed=args.seed, backend=args.backend,
        max_new_tokens=max_new_tokens, temperature=args.temperature, batch=args.batch,
        on_row=lambda label, c, dt: print(f"  {label}: {c.tasks} tasks in {dt:.0f} s", file=sys.stderr, flush=True),
    )
    print(format_task_table(table, task=args.task, tasks=args.tasks, seed=args.seed))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(finite({"task": args.task, "options": options, "tasks": args.tasks, "seed": args.seed,
                              "held_out_seed": HELD_OUT_SEED + args.seed, **task_table_json(table)}), fh, indent=2,
                      allow_nan=False)
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
        code = args.func(args)
    except Echo2Error as e:
        print(f"echo2: error: {e}", file=sys.stderr)
        code = 2
    if args.command == "run" and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a torchrun rank
        from echo2sdk.runtime.learner.distributed import leave

        leave(code)  # without the interpreter's teardown, where gloo aborts a rank now and then
    return code


if __name__ == "__main__":
    sys.exit(main())
