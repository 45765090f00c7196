"""The command line of the conformance suites: ``python -m echo2sdk.testing check-backend NAME`` prints one
JSON line per check of `check_backend` and a summary; ``python -m echo2sdk.testing check-adapter NAME`` (or
``--config FILE``) prints `check_adapter`'s report, or its failure, as one JSON line. Both exit 1 on a failure."""

from __future__ import annotations

import argparse
import json
import sys

from echo2sdk.errors import Echo2Error
from echo2sdk.testing.adapter_check import ADAPTER_TASKS, check_adapter
from echo2sdk.testing.backend_check import DEFAULT_MODEL, CheckResult, check_backend
from echo2sdk.testing.mock import MockBackend


def _check_adapter_cli(name: str, options: dict, tasks: int, seed: int, backend: str | None, model: str) -> int:
    """`check-adapter`: one JSON line, {"adapter", "check": "pass", ...the report} or {"check": "fail", "error"}."""
    from echo2sdk.plugins import load_adapter, load_backend_class

    engine = None
    try:
        adapter = load_adapter(name, options)
        if backend == "mock":
            engine = MockBackend()
        elif backend is not None:
            engine = load_backend_class(backend)(model)  # a built-in name or a folder (weights.resolve_model)
        report = check_adapter(adapter, backend=engine, seed=seed, tasks=tasks)
    except Echo2Error as e:
        print(json.dumps({"adapter": name, "check": "fail", "error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    finally:
        if engine is not None:
            engine.close()
    report.pop("rewards", None)
    if report.get("reference_reward_mean") == 0:
        report["warning"] = ("every task's own answer (as given, boxed and tagged) scores 0: check the answer column "
                             "or field and the scorer")
    print(json.dumps({"adapter": name, "check": "pass", **report}), flush=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m echo2sdk.testing``: check-backend and check-adapter."""
    parser = argparse.ArgumentParser(prog="python -m echo2sdk.testing", description="echo2sdk conformance suites")
    sub = parser.add_subparsers(dest="command", required=True)
    cb = sub.add_parser("check-backend", help="run check_backend and print one JSON line per check")
    cb.add_argument("backend", help="registered backend name or pkg.mod:Class")
    cb.add_argument("--model", default=DEFAULT_MODEL, help=f"model folder or built-in name (default {DEFAULT_MODEL}: 64-wide heads, which every engine takes)")
    cb.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="backend option (JSON value or text)")
    cb.add_argument("--temperature", type=float, default=0.7)
    cb.add_argument("--tolerance", type=float, default=0.05, help="mean |log-prob error| allowed against transformers")
    cb.add_argument("--no-reference", action="store_true", help="skip the comparison with transformers")
    ca = sub.add_parser("check-adapter", help="run check_adapter on a task adapter and print its report as JSON")
    ca.add_argument("adapter", nargs="?", help="registered name, URL (reasoning-gym://chain_sum, dataset://data.jsonl, "
                    "poker://nlhe_headsup_v1) or pkg.mod:Class")
    ca.add_argument("--config", help="check the task a run config names (its [[task.mix]] mixture too) instead")
    ca.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="adapter option (JSON value or text)")
    ca.add_argument("--tasks", type=int, default=ADAPTER_TASKS, help=f"tasks drawn and checked (default {ADAPTER_TASKS})")
    ca.add_argument("--seed", type=int, default=0)
    ca.add_argument("--backend", help="also play 2 groups through this backend: mock (no model) or a registered "
                    "backend name with --model")
    ca.add_argument("--model", default="tiny-random", help="the --backend's model (default tiny-random)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m echo2sdk.testing`` with `argv` (default sys.argv[1:]); the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    options = {}
    for item in args.option:
        key, sep, text = item.partition("=")
        if not sep:
            parser.error(f"--option expects KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(text)
        except ValueError:
            options[key] = text
    if args.command == "check-adapter":
        if (args.adapter is None) == (args.config is None):
            parser.error("check-adapter takes an ADAPTER or --config FILE (one of them)")
        if args.config is not None:
            from echo2sdk.config import load_config

            if options:
                parser.error("--option applies to an ADAPTER; --config FILE names the task and its options")
            cfg = load_config(args.config)
            args.adapter, options = cfg.task.adapter, dict(cfg.task.options)
        return _check_adapter_cli(args.adapter, options, args.tasks, args.seed, args.backend, args.model)

    def emit(r: CheckResult) -> None:
        print(json.dumps({"backend": args.backend, **r.to_json()}), flush=True)

    results = check_backend(
        args.backend,
        args.model,
        options=options,
        temperature=args.temperature,
        logprob_tolerance=args.tolerance,
        reference=not args.no_reference,
        report=emit,
        raise_on_failure=False,
    )
    failed = [r.name for r in results if r.passed is False]
    print(json.dumps({"backend": args.backend, "summary": "fail" if failed else "pass", "failed": failed}), flush=True)
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
