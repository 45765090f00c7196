"""``echo2 run CONFIG --dry-run``: the provisioning plan of a config (machine types, counts, launch specs, $/h),
built by the same provider the run would use, and nothing launched, contacted or written. What the run would stop
at (a provider option, a resource the provider's package refuses) is listed as a problem (exit status 1)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from echo2sdk.config import Config
from echo2sdk.errors import ConfigError, DependencyNotInstalled

__all__ = ["provisioning_plan", "format_provisioning"]

PLACEHOLDER_TOKEN = "dry-run"  # never reaches a machine: a dry run launches nothing


def provisioning_plan(cfg: Config) -> dict[str, Any]:
    """What a run of `cfg` would start: its local workers, and the machines its provider may launch."""
    from echo2sdk.runtime.learner.build import worker_config
    from echo2sdk.runtime.learner.calibration import make_provider

    sc, out = cfg.scheduler, Path(cfg.run.out)
    plan: dict[str, Any] = {
        "local_workers": cfg.rollout.workers, "scheduler": sc.enabled, "provider": sc.provider,
        "ledger": str(out / "machines.jsonl"), "machines": [],
    }
    if not (sc.standby or sc.machines):
        return plan
    coordinator = SimpleNamespace(host=cfg.run.host, port=cfg.run.port, token=PLACEHOLDER_TOKEN,
                                  worker_config=worker_config(cfg, cfg.model.policy))
    plan["problems"] = problems = []
    try:
        provider = make_provider(cfg, coordinator, out)
    except ConfigError as e:  # the plan is still shown, with what a run would stop at
        provider = None
        problems.append(str(e))
    plan["connect"] = getattr(provider, "connect", None)
    types = [("standby", sc.standby, sc.standby_price, None, {})] if sc.standby else []
    types += [(m.name, m.count, m.price_per_hour, m.mu, m.resources) for m in sc.machines]
    for kind, count, price, mu, resources in types:
        first = f"{kind}-0"
        spec = provider.spec(first, price) if callable(getattr(provider, "spec", None)) else {}
        if callable(getattr(provider, "task", None)):  # the provider's own validation (skypilot: the real sky.Task)
            try:
                provider.task(first, price)
                spec["validated"] = "yes, by the installed provider package"
            except DependencyNotInstalled as e:
                spec["validated"] = f"no: {e}"
            except ConfigError as e:
                problems.append(str(e))
        plan["machines"].append({"type": kind, "count": count, "price_per_hour": price, "mu_prior": mu,
                                 "resources": resources, "spec": spec})
    plan["max_price_per_hour"] = sum(m["count"] * m["price_per_hour"] for m in plan["machines"])
    return plan


def format_provisioning(plan: dict[str, Any], config: str = "") -> str:
    lines = [f"echo2 run {config} --dry-run: nothing launched".replace("  ", " ")]
    lines.append(f"local workers: {plan['local_workers']} (processes on this host)")
    if not plan["machines"]:
        lines.append("no machines to launch (scheduler.standby = 0, no [[scheduler.machines]])")
        return "\n".join(lines)
    connect = str(plan.get("connect") or "")
    if connect.endswith(":0"):
        connect = connect[:-2] + ":<the run's port, picked at start>"
    lines.append(f"provider: {plan['provider']}" + (f", workers connect to {connect}" if connect else ""))
    if not plan["scheduler"]:
        lines.append("scheduler.enabled = false: the machines below are never launched (enable the scheduler)")
    lines.append("machine types (after warm-up the scheduler launches the cheapest set reaching mu_target; "
                 "a machine costs from its launch):")
    lines.append(f"  {'type':<10} {'count':>5} {'$/h each':>9} {'$/h all':>8}  resources")
    for m in plan["machines"]:
        res = " ".join(f"{k}={v}" for k, v in m["resources"].items()) or "-"
        lines.append(f"  {m['type']:<10} {m['count']:>5} {m['price_per_hour']:>9.3f} "
                     f"{m['count'] * m['price_per_hour']:>8.3f}  {res}")
    lines.append(f"  at most ${plan['max_price_per_hour']:.3f}/h with every machine up")
    for m in plan["machines"]:
        spec = m["spec"]
        if not spec:
            continue
        lines.append(f"launch spec of {m['type']}-0:")
        for key in ("resources", "setup", "files", "run", "envs", "secrets", "autostop", "validated"):
            if spec.get(key) not in (None, [], {}, ""):
                value = spec[key]
                if key == "secrets":
                    value = ", ".join(value) + " (in the worker's environment only; its value is never shown)"
                lines.append(f"  {key}: {value}")
    lines.append(f"ledger: {plan['ledger']} (each launch recorded before it happens); end them all with "
                 f"`echo2 fleet down {Path(plan['ledger']).parent}`")
    lines += [f"problem: {p}" for p in plan.get("problems", [])]
    return "\n".join(lines)
