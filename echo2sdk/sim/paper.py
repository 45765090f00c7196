"""`echo2 simulate paper`: the paper's provisioning experiments at paper scale, on the simulator.

Every number comes from :mod:`echo2sdk.sim`, which drives the real scheduler, buffer and chain
planner on a virtual clock. The inputs are the paper's where it gives them (marked ``paper``) and
stated assumptions where it does not (marked ``assumed``); ``docs/simulation.md`` sets each result
beside the paper's figure and explains the gaps.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from echo2sdk.core import capacity
from echo2sdk.sim import GB, Fault, Network, SimConfig, SimResult, SimWorker, measure_t_bcast, simulate
from echo2sdk.errors import DependencyNotInstalled

__all__ = [
    "PAPER",
    "paper_pool",
    "mixed_pool",
    "base_config",
    "fig3c",
    "fig4",
    "table2",
    "table4",
    "cost_comparison",
    "scale_run",
    "run_paper",
    "summary_lines",
    "plot_paper",
]

# Inputs, with where they come from.
PAPER: dict[str, Any] = {
    "price_a100": 3.06,  # paper Table 1, $/h per GPU
    "price_5090": 0.35,  # paper Table 1
    "price_h100": 2.90,  # paper E.3
    "learner_gpus": 4,  # paper §5.1: the ECHO-2 learner on 4x A100
    "central_gpus": 8,  # paper §5.1: centralized baselines on 8x A100
    "R": 128 * 16,  # paper §5.1: global batch 128 prompts, n = 16 rollouts each
    "group_size": 16,
    # paper §5.2 (S = 3, 4); S = 6 not reported: assumed = S = 4; S = 2 not reported: assumed = S = 3
    "T_train": {2: 1631.2, 3: 1631.2, 4: 1649.3, 6: 1649.3},
    "T_step_sync": 1508.2,  # paper §5.2, veRL-sync per-step time on 8x A100
    "T_step_async": 1582.3,  # paper §5.2, veRL-async
    "snapshot_bytes": 8.19e9 * 2,  # Qwen3-8B in bf16 (8.19 B parameters x 2 bytes)
    "Bw_mbps": 100.0,  # paper §5.1/5.5.1: per-worker cap
    "B0_mbps": 600.0,  # paper sweeps 300-800 Mbit/s (§5.5.1); assumed 600 for the main runs
    "mu_5090": 0.28,  # assumed: rollouts/s of one RTX 5090 on Qwen3-8B, inferred from Table 2 (9 machines at gamma 1.1)
    "install_s": 30.0,  # assumed: last byte -> generating
    "gamma": 1.1,  # paper §4.3
    "sustain_s": 120.0,  # assumed: the scheduler acts after a 2-minute sustained deviation (heartbeats every 30 s)
    "window_s": 1200.0,  # assumed: heartbeat statistics over a 20-minute sliding window
    "paper_table2": {
        "Full": {"machines": 9, "cost_per_step": 8.098, "t_bcast_s": 1437, "wait_s": 0.0},
        "w/o P2P (9)": {"machines": 9, "cost_per_step": 8.432, "t_bcast_s": 1830, "wait_s": 131.9},
        "w/o P2P (10)": {"machines": 10, "cost_per_step": 8.630, "t_bcast_s": 1872, "wait_s": 84.1},
        "w/o Cost": {"machines": 9, "cost_per_step": 9.339, "t_bcast_s": 1437, "wait_s": 0.0},
    },
    "paper_table4": {
        "forwarder slowed 0.5x": {"drop": 0.0894, "recovery_s": 312, "bubble_increase": 0.0156},
        "forwarder dropped": {"drop": 0.1645, "recovery_s": 312, "bubble_increase": 0.0263},
        "rollout worker slowed 0.5x": {"drop": 0.0680, "recovery_s": 240, "bubble_increase": 0.0097},
        "rollout worker dropped": {"drop": 0.1250, "recovery_s": 240, "bubble_increase": 0.0188},
    },
}

# A mixed-price pool for the cost ablation (Table 2). The paper does not list its pool; prices of the
# 5090 and A100 are Table 1's, the others are assumed marketplace rates (examples/catalog_mixed.toml
# holds the same rows for `echo2 plan`).
MIXED_POOL = [  # (name, $/h, rollouts/s, count)
    ("rtx5090", 0.35, 0.28, 10),
    ("rtx4090", 0.40, 0.18, 6),
    ("l40s", 0.90, 0.25, 4),
    ("a100", 3.06, 0.40, 4),
]


def paper_pool(n: int, *, mu: float | None = None, price: float | None = None, prefix: str = "5090") -> list[SimWorker]:
    """n identical RTX 5090 workers."""
    mu = PAPER["mu_5090"] if mu is None else mu
    price = PAPER["price_5090"] if price is None else price
    return [SimWorker(f"{prefix}-{i:02d}", price, mu, PAPER["Bw_mbps"]) for i in range(n)]


def mixed_pool() -> list[SimWorker]:
    """MIXED_POOL's machines, each of its row's kind (rtx5090-00 .. rtx5090-09 are of kind rtx5090)."""
    return [
        SimWorker(f"{name}-{i:02d}", price, mu, PAPER["Bw_mbps"], kind=name)
        for name, price, mu, count in MIXED_POOL
        for i in range(count)
    ]


def _net(topology: str = "chain", B0: float | None = None) -> Network:
    return Network(
        snapshot_bytes=PAPER["snapshot_bytes"],
        B0_mbps=PAPER["B0_mbps"] if B0 is None else B0,
        install_s=PAPER["install_s"],
        topology=topology,  # type: ignore[arg-type]
    )


def base_config(pool: list[SimWorker], *, S: int = 3, steps: int = 40, **kw: Any) -> SimConfig:
    """The paper's 8B deployment (see PAPER) with `pool` as the rollout workers."""
    kw.setdefault("net", _net())
    kw.setdefault("gamma", PAPER["gamma"])
    kw.setdefault("sustain_s", PAPER["sustain_s"])
    kw.setdefault("window_s", PAPER["window_s"])
    return SimConfig(
        pool=pool,
        T_train=PAPER["T_train"][S],
        R=PAPER["R"],
        group_size=PAPER["group_size"],
        S=S,
        steps=steps,
        learner_price_per_hour=PAPER["learner_gpus"] * PAPER["price_a100"],
        **kw,
    )


def _threshold(S: int, mu: float, n_max: int = 64, net: Network | None = None) -> dict[str, float | int | None]:
    """Eq. (2) threshold in workers: the smallest N with N * mu >= mu_min(kappa), T_bcast measured for
    N workers with the chain model (it depends a little on N); with deltas, for the mean publication."""
    kappa = capacity.kappa_for(S)
    T = PAPER["T_train"][S]
    net = (net or _net()).typical()
    for n in range(1, n_max + 1):
        tb = measure_t_bcast(n, net, PAPER["Bw_mbps"], 1 / PAPER["gamma"])
        try:
            m = capacity.mu_min(T, tb, PAPER["R"], kappa)
        except Exception:  # noqa: BLE001 - infeasible at this N
            continue
        if n * mu >= m:
            return {"workers": n, "mu_min": m, "workers_exact": m / mu, "t_bcast_s": tb}
    return {"workers": None, "mu_min": None, "workers_exact": None, "t_bcast_s": None}


# ----------------------------------------------------------------------------- Figure 3(c)


def fig3c(
    *, S_values: tuple[int, ...] = (3, 4, 6), Ns: tuple[int, ...] = tuple(range(3, 15)), steps: int = 40, seed: int = 0,
    overlap_S: tuple[int, ...] = (3,),
) -> dict[str, Any]:
    """Learner bubble ratio vs pool size for each S, under the paper's execution semantics ("pause");
    plus the same sweep with our worker's semantics ("overlap": keep generating while a snapshot
    arrives) for `overlap_S`."""
    out: dict[str, Any] = {"Ns": list(Ns), "steps": steps, "series": {}}
    mu = PAPER["mu_5090"]
    for mode, S_list in (("pause", S_values), ("overlap", overlap_S)):
        for S in S_list:
            bubbles = []
            for n in Ns:
                cfg = base_config(paper_pool(n), S=S, steps=steps, activation="all", seed=seed, rollout_during_bcast=mode)
                bubbles.append(simulate(cfg).bubble_ratio)
            thr = _threshold(S, mu)
            knee = next((n for n, b in zip(Ns, bubbles) if b <= 0.02), None)
            knee_interp = None  # where the curve crosses 2 %, linear between the two pool sizes around it
            if knee is not None and Ns.index(knee) > 0:
                i = Ns.index(knee)
                n0, b0, n1, b1 = Ns[i - 1], bubbles[i - 1], Ns[i], bubbles[i]
                knee_interp = n0 + (b0 - 0.02) / (b0 - b1) * (n1 - n0) if b0 > b1 else float(n1)
            n_star = thr["workers"]
            at = {d: _at(Ns, bubbles, n_star + d) if n_star is not None else None for d in (0, 1)}
            out["series"][f"{mode}/S={S}"] = {
                "S": S, "mode": mode, "bubble": bubbles, "threshold": thr, "knee_workers": knee,
                "knee_interpolated": knee_interp,
                "bubble_at_threshold": at[0], "bubble_at_threshold_plus_1": at[1],
            }
    return out


def _at(Ns: tuple[int, ...], values: list[float], n: int) -> float | None:
    return values[Ns.index(n)] if n in Ns else None


# ----------------------------------------------------------------------------- Figure 4


def fig4(*, Ns: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64), B0s: tuple[float, ...] = (300, 600, 700, 800)) -> dict[str, Any]:
    """T_bcast (to q = 1/gamma of the workers) vs N: star-unlimited, star-limited per B0, chain per B0."""
    q, bw = 1 / PAPER["gamma"], PAPER["Bw_mbps"]
    series: dict[str, list[float]] = {
        "star-unlimited": [measure_t_bcast(n, replace(_net("star"), B0_mbps=None), bw, q) for n in Ns]
    }
    for b0 in B0s:
        series[f"star-limited B0={b0:g}"] = [measure_t_bcast(n, _net("star", b0), bw, q) for n in Ns]
    for b0 in B0s:
        series[f"chain B0={b0:g}"] = [measure_t_bcast(n, _net("chain", b0), bw, q) for n in Ns]
    return {"Ns": list(Ns), "Bw_mbps": bw, "snapshot_gb": PAPER["snapshot_bytes"] / GB, "series": series}


# ----------------------------------------------------------------------------- Table 2


def _row(r: SimResult) -> dict[str, Any]:
    return {
        "machines": r.machines_initial,
        "machines_max": r.machines_max,
        "cost_per_step": r.cost_per_step_steady,
        "cost_per_step_with_fill": r.cost_per_step,
        "t_bcast_s": r.t_bcast_s,
        "wait_s": r.learner_wait_s,
        "bubble_ratio": r.bubble_ratio,
        "workers": r.initial_active,
    }


def table2(*, steps: int = 60, random_seeds: tuple[int, ...] = tuple(range(10)), seed: int = 0) -> dict[str, Any]:
    """Full vs w/o peer broadcast vs w/o cost-aware activation on the mixed-price pool."""
    pool = mixed_pool()
    full = simulate(base_config(pool, steps=steps, seed=seed))
    rows: dict[str, Any] = {"Full": _row(full)}
    by_rho = sorted(pool, key=lambda w: (w.price_per_hour / w.mu, w.name))
    for n in (full.machines_initial, full.machines_initial + 1):
        names = [w.name for w in by_rho[:n]]  # the same cheapest workers; the paper also ran one more
        r = simulate(base_config(pool, steps=steps, seed=seed, net=_net("star"), active=names, closed_loop=False))
        rows[f"w/o P2P ({n})"] = _row(r)
    nocost = [simulate(base_config(pool, steps=steps, seed=s, activation="random")) for s in random_seeds]
    costs = [r.cost_per_step_steady for r in nocost]
    row = _row(nocost[0])
    row.update(
        machines=statistics.fmean(r.machines_initial for r in nocost),
        cost_per_step=statistics.fmean(costs),
        cost_per_step_with_fill=statistics.fmean(r.cost_per_step for r in nocost),
        cost_per_step_range=[min(costs), max(costs)],
        t_bcast_s=statistics.fmean(r.t_bcast_s or 0.0 for r in nocost),
        wait_s=statistics.fmean(r.learner_wait_s for r in nocost),
        bubble_ratio=statistics.fmean(r.bubble_ratio for r in nocost),
        runs=len(nocost),
        workers=None,
    )
    rows["w/o Cost"] = row
    saving = 1 - rows["Full"]["cost_per_step"] / row["cost_per_step"]
    return {"rows": rows, "cost_aware_saving_vs_random": saving, "paper": PAPER["paper_table2"], "pool": [list(p) for p in MIXED_POOL]}


# ----------------------------------------------------------------------------- Table 4


_FAULTS = {
    "forwarder slowed 0.5x": ("forwarder", "slow", "broadcast"),
    "forwarder dropped": ("forwarder", "drop", "broadcast"),
    "rollout worker slowed 0.5x": ("rollout", "slow", "rollout"),
    "rollout worker dropped": ("rollout", "drop", "rollout"),
}


def table4(*, steps: int = 40, n: int = 8, standby: int = 4, seed: int = 0, mu: float = 0.29) -> dict[str, Any]:
    """Single-worker faults in a minimally saturated n-worker deployment with gamma = 1.0. The default
    mu = 0.29 rollouts/s makes 8 the minimum (7 x 0.29 < mu_min <= 8 x 0.29) and a worker at half
    speed enough to drop the pool below mu_target, as in all four of the paper's rows."""
    pool = paper_pool(n + standby, mu=mu)
    cfg = base_config(pool, steps=steps, seed=seed, gamma=1.0, record_timeline=True)
    base = simulate(cfg)
    T = cfg.T_train
    pub = next(p for p in base.publications if p["t0"] >= steps * T * 0.4 and p["t_bcast_all_s"])
    t_b = pub["t_bcast_all_s"]
    at = {"broadcast": pub["t0"] + 0.25 * t_b, "rollout": pub["t0"] + t_b + 0.25 * T}
    rows = {}
    for label, (role, kind, stage) in _FAULTS.items():
        t_f = at[stage]
        r = simulate(replace(cfg, faults=(Fault(t_f, role, kind, 0.5),)))
        target = r.mu_target or 0.0
        before = [rate for t, _, rate in r.timeline if t < t_f]
        pre = before[-1] if before else target
        after = sorted((t, rate) for t, _, rate in r.timeline if t_f <= t <= t_f + 2 * cfg.k * T)
        below = [rate < target * (1 - 1e-9) for _, rate in after]
        first_low = below.index(True) if True in below else None
        back = next((i for i in range(first_low or 0, len(after)) if not below[i]), None) if first_low is not None else None
        last_low = max((i for i, b in enumerate(below) if b), default=None)
        rows[label] = {
            "worker": r.faults[0]["worker"] if r.faults else None,
            "fault_at_s": t_f,
            # peak instantaneous reduction of the pool's generating capacity
            "drop": max((1 - rate / pre for _, rate in after), default=0.0),
            # fault -> the pool is back at mu_target (0 when it never left it)
            "recovery_s": 0.0 if first_low is None else (after[back][0] - t_f if back is not None else None),
            # fault -> the end of the last dip below mu_target (a delayed install can come later)
            "settled_s": 0.0 if last_low is None else (
                after[last_low + 1][0] - t_f if last_low + 1 < len(after) else None
            ),
            "bubble_increase": r.bubble_ratio - base.bubble_ratio,
            "mu_target": target,
            "actions": [a for a in r.actions if a["t"] >= t_f][:4],
        }
    return {
        "workers": base.machines_initial,
        "gamma": 1.0,
        "steps": steps,
        "baseline_bubble": base.bubble_ratio,
        "baseline_actions": base.actions,
        "rows": rows,
        "paper": PAPER["paper_table4"],
    }


# ----------------------------------------------------------------------------- cost, scale


def cost_comparison(echo2_cost_per_step: float) -> dict[str, Any]:
    """ECHO-2 (simulated) against centralized sync/async on 8x A100 at the paper's step times."""
    central = PAPER["central_gpus"] * PAPER["price_a100"]
    sync = central * PAPER["T_step_sync"] / 3600
    asyn = central * PAPER["T_step_async"] / 3600
    return {
        "echo2_cost_per_step": echo2_cost_per_step,
        "sync_cost_per_step": sync,
        "async_cost_per_step": asyn,
        "saving_vs_sync": 1 - echo2_cost_per_step / sync,
        "saving_vs_async": 1 - echo2_cost_per_step / asyn,
        "paper_saving_range": [0.333, 0.363],
    }


def scale_run(*, workers: int = 76, steps: int = 100) -> dict[str, Any]:
    """The E.3 deployment size: 76 RTX 5090 workers, R = 256 x 16, 100 steps. QwQ-32B's T_train and a
    5090's throughput on it are not in the paper: assumed T_train = 3300 s, mu = 0.1 rollouts/s,
    65.5 GB bf16 snapshots, B0 = 1 Gbit/s. Reports the wall-clock time of the simulation itself."""
    cfg = SimConfig(
        pool=paper_pool(workers, mu=0.1),
        T_train=3300.0,
        R=256 * 16,
        group_size=16,
        S=3,
        steps=steps,
        net=Network(snapshot_bytes=32.8e9 * 2, B0_mbps=1000.0, install_s=60.0),
        activation="all",
        learner_price_per_hour=8 * PAPER["price_h100"],
    )
    t0 = time.perf_counter()
    r = simulate(cfg)
    return {
        "workers": workers,
        "steps": r.steps,
        "sim_wall_clock_s": time.perf_counter() - t0,
        "bubble_ratio": r.bubble_ratio,
        "t_bcast_s": r.t_bcast_s,
        "mu_min": r.mu_min,
        "groups_admitted": r.buffer["admitted"],
    }


# ----------------------------------------------------------------------------- delta snapshots


def delta_snapshots(delta_ratio: float, *, anchor_every: int = 10, S_values: tuple[int, ...] = (2, 3, 6),
                    pool_size: int = 16, steps: int = 40, seed: int = 0) -> dict[str, Any]:
    """Full snapshots vs deltas of `delta_ratio` x the full size (measured: bench/delta.py) with a full anchor
    every `anchor_every` publications, on the paper's 8B deployment (100 Mbit/s workers, B0 600 Mbit/s): per S,
    eq. (2)'s T_bcast (the mean publication), mu_min and workers; and a simulated run on `pool_size` RTX 5090s
    with cost-aware activation: machines chosen, T_bcast measured (median over publications), bubble, wait
    and cost per step."""
    rows: dict[str, Any] = {}
    for S in S_values:
        for mode, net in (("full", _net()), ("delta", replace(_net(), delta_ratio=delta_ratio, anchor_every=anchor_every))):
            thr = _threshold(S, PAPER["mu_5090"], net=net)
            r = simulate(base_config(paper_pool(pool_size), S=S, steps=steps, seed=seed, net=net))
            rows[f"S={S}/{mode}"] = {"S": S, "kappa": capacity.kappa_for(S), "mode": mode,
                                     "t_bcast_eq2_s": thr["t_bcast_s"], "mu_min": thr["mu_min"],
                                     "workers_eq2": thr["workers"], **_row(r)}
    return {"delta_ratio": delta_ratio, "anchor_every": anchor_every, "pool_size": pool_size, "steps": steps,
            "snapshot_gb": PAPER["snapshot_bytes"] / GB, "Bw_mbps": PAPER["Bw_mbps"], "B0_mbps": PAPER["B0_mbps"],
            "rows": rows}


# ----------------------------------------------------------------------------- all of it


def run_paper(out: str | Path, *, plots: bool = True, quick: bool = False, delta_ratio: float | None = None,
              anchor_every: int = 10) -> dict[str, Any]:
    """Run every experiment, write DIR/paper.json (and the PNGs with `plots`), return the results. With
    `delta_ratio`: also full vs delta snapshots (delta_snapshots)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if quick:
        f3 = fig3c(S_values=(3, 6), Ns=(5, 6, 7, 8, 9), steps=20)
        t2 = table2(steps=24, random_seeds=(0, 1, 2))
        t4 = table4(steps=24)
    else:
        f3 = fig3c()
        t2 = table2()
        t4 = table4()
    results = {
        "inputs": {k: v for k, v in PAPER.items() if not k.startswith("paper_")},
        "fig3c": f3,
        "fig4": fig4(),
        "table2": t2,
        "table4": t4,
        "cost": cost_comparison(t2["rows"]["Full"]["cost_per_step"]),
        "scale": scale_run(steps=20 if quick else 100),
    }
    if delta_ratio is not None:
        results["delta"] = delta_snapshots(delta_ratio, anchor_every=anchor_every, steps=20 if quick else 40)
    results["elapsed_s"] = time.perf_counter() - t0
    (out / "paper.json").write_text(json.dumps(results, indent=2, default=_json_default))
    if plots:
        results["plots"] = [str(p) for p in plot_paper(results, out)]
    return results


def summary_lines(results: dict[str, Any]) -> list[str]:
    """The headline numbers of a run_paper() result, one per line."""
    lines = []
    for key, s in results["fig3c"]["series"].items():
        thr = s["threshold"]
        lines.append(
            f"fig3c {key}: eq.(2) threshold {thr['workers_exact']:.2f} workers, bubble <= 2% from "
            f"{s['knee_workers']} workers (crosses 2% at {_num(s['knee_interpolated'])}); at ceil(threshold) "
            f"{_pct(s['bubble_at_threshold'])}, +1 {_pct(s['bubble_at_threshold_plus_1'])}"
        )
    f4 = results["fig4"]
    n = f4["Ns"][-1]
    lines.append("fig4 T_bcast at N=%d: " % n + ", ".join(f"{k} {v[-1]:.0f} s" for k, v in f4["series"].items()))
    for name, row in results["table2"]["rows"].items():
        lines.append(
            f"table2 {name}: {row['machines']:.3g} machines, ${row['cost_per_step']:.3f}/step, "
            f"T_bcast {row['t_bcast_s'] or 0:.0f} s, wait {row['wait_s']:.1f} s/step"
        )
    lines.append(f"table2 cost-aware vs random activation: {100 * results['table2']['cost_aware_saving_vs_random']:.1f}% cheaper")
    for name, row in results["table4"]["rows"].items():
        rec = "n/a" if row["recovery_s"] is None else f"{row['recovery_s']:.0f} s"
        lines.append(f"table4 {name}: drop {100 * row['drop']:.2f}%, recovery {rec}, bubble +{100 * row['bubble_increase']:.2f} pt")
    c = results["cost"]
    lines.append(
        f"cost/step: ECHO-2 ${c['echo2_cost_per_step']:.3f}, sync ${c['sync_cost_per_step']:.3f} "
        f"({100 * c['saving_vs_sync']:.1f}% less), async ${c['async_cost_per_step']:.3f} ({100 * c['saving_vs_async']:.1f}% less)"
    )
    sc = results["scale"]
    lines.append(f"scale: {sc['workers']} workers x {sc['steps']} steps simulated in {sc['sim_wall_clock_s']:.2f} s")
    if "delta" in results:
        d = results["delta"]
        for name, row in d["rows"].items():
            lines.append(
                f"delta {name} (ratio {d['delta_ratio']:g}, anchor every {d['anchor_every']}): eq.(2) T_bcast "
                f"{_num(row['t_bcast_eq2_s'])} s, mu_min {_num(row['mu_min'])}/s, {row['workers_eq2']} workers; run: "
                f"{row['machines']} machines, T_bcast {_num(row['t_bcast_s'])} s, bubble {_pct(row['bubble_ratio'])}, "
                f"${row['cost_per_step']:.3f}/step"
            )
    return lines


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _json_default(o: Any) -> Any:
    if isinstance(o, set | tuple):
        return list(o)
    if isinstance(o, float) and not math.isfinite(o):
        return None
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def plot_paper(results: dict[str, Any], out: str | Path) -> list[Path]:
    """Figure 3(c), Figure 4 and the two tables as PNGs (needs matplotlib: the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DependencyNotInstalled("matplotlib", "plot") from None
    out = Path(out)
    paths = []

    f3 = results["fig3c"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = {}
    for key, s in f3["series"].items():
        style = "-o" if s["mode"] == "pause" else "--x"
        line = ax.plot(f3["Ns"], [100 * b for b in s["bubble"]], style, label=f"S={s['S']} ({s['mode']})",
                       color=colors.get(s["S"]))[0]
        colors.setdefault(s["S"], line.get_color())
        if s["mode"] == "pause" and s["threshold"]["workers_exact"]:
            ax.axvline(s["threshold"]["workers_exact"], color=line.get_color(), linestyle=":", linewidth=1)
    ax.axhline(2, color="grey", linewidth=0.6)
    ax.set(xlabel="rollout workers (RTX 5090)", ylabel="learner bubble ratio (%)",
           title="Fig. 3(c), simulated: bubble vs pool size (dotted: eq. (2) threshold)")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "fig3c_bubble_vs_pool.png"))

    f4 = results["fig4"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, ys in f4["series"].items():
        style = "-" if name.startswith("chain") else ("-." if name == "star-unlimited" else "--")
        ax.plot(f4["Ns"], ys, style, marker=".", label=name)
    ax.set(xlabel="rollout workers N", ylabel="T_bcast to q = 1/gamma (s)", yscale="log",
           title=f"Fig. 4, simulated: {f4['snapshot_gb']:.1f} GB snapshot, Bw = {f4['Bw_mbps']:g} Mbit/s")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "fig4_tbcast_vs_n.png"))

    paths.append(_table_png(
        out / "table2_ablation.png", "Table 2, simulated (paper in brackets)",
        ["method", "#mach", "cost/step $", "T_bcast s", "wait s"],
        [_with_paper(k, v, results["table2"]["paper"].get(k)) for k, v in results["table2"]["rows"].items()],
        plt,
    ))
    paths.append(_table_png(
        out / "table4_faults.png", "Table 4, simulated (8 workers, gamma = 1.0)",
        ["fault", "throughput drop", "recovery s", "bubble +"],
        [[k, f"{100 * v['drop']:.2f}%", f"{v['recovery_s'] or 0:.0f}", f"{100 * v['bubble_increase']:.2f} pt"]
         for k, v in results["table4"]["rows"].items()],
        plt,
    ))
    return paths


def _with_paper(name: str, v: dict[str, Any], paper: dict[str, Any] | None) -> list[str]:
    cells = [f"{v['machines']:.3g}", f"{v['cost_per_step']:.3f}", f"{v['t_bcast_s'] or 0:.0f}", f"{v['wait_s']:.1f}"]
    if paper:
        keys = ("machines", "cost_per_step", "t_bcast_s", "wait_s")
        cells = [f"{c} [{paper[k]:g}]" for c, k in zip(cells, keys)]
    return [name, *cells]


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _table_png(path: Path, title: str, header: list[str], rows: list[list[str]], plt: Any) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * (len(rows) + 2)))
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    table = ax.table(cellText=rows, colLabels=header, loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    return _save(fig, path)


if __name__ == "__main__":  # pragma: no cover
    import sys

    print(json.dumps(run_paper(sys.argv[1] if len(sys.argv) > 1 else "runs/paper"), indent=2, default=_json_default)[:2000])
