"""`echo2 plot RUN_DIR`: PNGs of a run from the files it wrote (metrics.jsonl, and summary.json, config.json,
tables.jsonl, histograms.jsonl where they exist), so a crashed or running run can be plotted too.

    reward.png        reward (mean, +-1 std) and accuracy vs learner step and vs wall time
    staleness.png     trajectories per staleness Delta = v_t - v, and the batch's mean and max Delta per step
    learner_time.png  each step's T_train, learner wait and publication share; the bubble ratio so far
    t_bcast.png       T_bcast per published snapshot version (q = 1/gamma of the workers, and all of them; the
                      moment q of them had the copy complete, before the install)
    workers.png       workers alive vs wall time; trajectories delivered per worker
    cost.png          worker cost so far vs wall time (only when the run's workers have prices), billed as
                      summary.json's bill (core/bill.py)
    tasks.png         a mixture's components: the workers' accuracy (or reward) and the filter rate per task
    filter.png        dynamic sampling: the filter rate per step against its predictions (from the reward's values
                      and from accuracy), and the rollouts a second raw and useful against mu_min
    skipping.png      pre-rollout prompt skipping: the prompts skipped per step, stacked by reason (recent groups
                      all right, all wrong, all one reward); the filter rate f measured vs f had none been skipped,
                      and the filter's explore probability

A figure whose data the run lacks is skipped with a line saying why. Needs matplotlib (the `plot` extra);
drawn on matplotlib's Agg canvas without pyplot, so it changes no global state.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from echo2sdk.core import bill, capacity, verdict
from echo2sdk.errors import DependencyNotInstalled, Echo2Error

__all__ = ["Run", "Plots", "load_run", "plot_run"]

_DPI = 110


@dataclass
class Run:
    """What a run folder holds: metrics rows, and whatever else it wrote ({} / [] when absent)."""

    dir: Path
    rows: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, list[tuple[int, list[dict[str, Any]]]]] = field(default_factory=dict)
    histograms: dict[str, dict[int, dict[int, int]]] = field(default_factory=dict)

    @property
    def S(self) -> int | None:
        return self.summary.get("S", self.config.get("learner", {}).get("staleness"))


@dataclass
class Plots:
    """The PNGs written and, per figure skipped, why."""

    written: list[Path] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def load_run(run_dir: str | Path) -> Run:
    """Read a run folder. Raises Echo2Error when it has no metrics rows to plot."""
    d = Path(run_dir)
    path = d / "metrics.jsonl"
    if not path.is_file():
        raise Echo2Error(f"{path} does not exist: echo2 plot takes the folder of a run (run.out / --out)")
    rows = _jsonl(path)
    if not rows:
        raise Echo2Error(f"{path} has no rows yet: nothing to plot")
    summary = _json(d / "summary.json")
    config = _json(d / "config.json") or summary.get("config", {})
    tables: dict[str, list[tuple[int, list[dict[str, Any]]]]] = {}
    for t in _jsonl(d / "tables.jsonl"):
        tables.setdefault(t["name"], []).append((t["step"], t["rows"]))
    histograms: dict[str, dict[int, dict[int, int]]] = {}
    for h in _jsonl(d / "histograms.jsonl"):  # a resumed run logs re-done steps again: the last one counts
        histograms.setdefault(h["name"], {})[h["step"]] = {int(k): v for k, v in h["counts"].items()}
    return Run(d, rows, summary, config, tables, histograms)


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Plots:
    """Write the run's PNGs to `out` (default RUN_DIR/plots); see the module for what each shows."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise DependencyNotInstalled("matplotlib", "plot") from None
    run = load_run(run_dir)
    out = Path(out) if out is not None else run.dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    result = Plots()
    for name, draw in _FIGURES.items():
        fig = Figure(layout="constrained")
        why = draw(fig, run)
        if why:
            result.skipped[name] = why
            continue
        fig.savefig(out / name, dpi=_DPI)
        result.written.append(out / name)
    return result


# -- figures: each draws on `fig` and returns None, or the reason it has nothing to show -------------------
def _reward(fig: Any, run: Run) -> str | None:
    rows = run.rows
    has_acc = any(r.get("accuracy") is not None for r in rows)
    fig.set_size_inches(10, 6.4 if has_acc else 3.6)
    axes = fig.subplots(2 if has_acc else 1, 2, squeeze=False)
    steps = [r["step"] for r in rows]
    scale, unit = _time_unit(rows)
    times = [r["time_s"] / scale for r in rows]
    mean = [r["reward_mean"] for r in rows]
    std = [r.get("reward_std") or 0.0 for r in rows]
    # every completed group, filtered or not (dynamic sampling trains on mixed-reward groups only)
    rollout = [r.get("rollout_reward_mean") for r in rows]
    rollout_acc = _percent(rows, "rollout_accuracy")
    for ax, xs, xlabel in ((axes[0][0], steps, "learner step"), (axes[0][1], times, f"wall time ({unit})")):
        ax.plot(xs, mean, **_line(rows), label="mean reward of the batch")
        ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2,
                        label="+-1 std")
        if any(x is not None for x in rollout):
            ax.plot(xs, rollout, **_line(rows), color="tab:orange", label="mean reward of all completed groups")
        ax.set(xlabel=xlabel, ylabel="reward", title=f"Reward vs {xlabel.split(' (')[0]}")
        if xs is steps:
            _integer_ticks(ax)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
    if has_acc:
        acc = _percent(rows, "accuracy")
        for ax, xs, xlabel in ((axes[1][0], steps, "learner step"), (axes[1][1], times, f"wall time ({unit})")):
            ax.plot(xs, acc, **_line(rows), color="tab:green", label="the batch")
            if any(x is not None for x in rollout_acc):
                ax.plot(xs, rollout_acc, **_line(rows), color="tab:orange", label="all completed groups")
            ax.set(xlabel=xlabel, ylabel="accuracy (% correct)", ylim=(-3, 103),
                   title=f"Accuracy vs {xlabel.split(' (')[0]}")
            ax.legend(fontsize=8, loc="lower right")
            if xs is steps:
                _integer_ticks(ax)
            ax.grid(alpha=0.3)
    fig.suptitle(f"{run.dir.name}: reward and accuracy ({len(rows)} steps)")
    return None


def _staleness(fig: Any, run: Run) -> str | None:
    rows, S = run.rows, run.S
    counts, source = _staleness_counts(run)
    fig.set_size_inches(10, 3.8)
    left, right = fig.subplots(1, 2)
    if counts:
        ks = sorted(counts)
        left.bar(ks, [counts[k] for k in ks], width=0.7, color="tab:purple")
        left.set_ylim(0, 1.2 * max(counts.values()))  # room for the legend
        left.set_xticks(range(min(ks), max(max(ks), S or 0) + 1))
        left.set(title=f"Staleness of trained trajectories ({source})")
    else:
        left.text(0.5, 0.5, "no staleness histogram recorded\n(no summary.json or histograms.jsonl)",
                  ha="center", va="center", transform=left.transAxes)
        left.set(title="Staleness of trained trajectories")
    left.set(xlabel="staleness Delta = v_t - v (versions)", ylabel="trajectories")
    steps = [r["step"] for r in rows]
    right.plot(steps, [r["staleness_max"] for r in rows], **_line(rows, "s"), color="tab:orange", linewidth=3,
               alpha=0.6, label="max Delta of the batch")
    right.plot(steps, [r["staleness_mean"] for r in rows], **_line(rows), color="tab:blue", label="mean Delta of the batch")
    right.set_ylim(-0.2, max(S or 0, max(r["staleness_max"] for r in rows)) + 1)
    _integer_ticks(right, "xy")
    _integer_ticks(left, "y")
    right.set(xlabel="learner step", ylabel="staleness Delta (versions)", title="Batch staleness per step")
    if S is not None:
        budget = dict(color="tab:red", linestyle="--", linewidth=1, label=f"budget S = {S}")
        left.axvline(S, **budget)
        right.axhline(S, **budget)
    if S is not None and counts:
        left.legend(fontsize=8, loc="upper left")
    right.legend(fontsize=8, loc="upper left")
    right.grid(alpha=0.3)
    fig.suptitle(f"{run.dir.name}: staleness (the buffer admits v >= v_t - S)")
    return None


def _learner_time(fig: Any, run: Run) -> str | None:
    rows = run.rows
    fig.set_size_inches(10, 6)
    top, bottom = fig.subplots(2, 1, sharex=True)
    steps = [r["step"] for r in rows]
    train = [r["t_train_s"] for r in rows]
    wait = [r["learner_wait_s"] for r in rows]
    pub = [r.get("t_publish_s") or 0.0 for r in rows]
    top.bar(steps, train, label="T_train (forward, backward, optimizer)", color="tab:blue")
    top.bar(steps, wait, bottom=train, label="learner wait (no admissible batch yet)", color="tab:orange")
    top.bar(steps, pub, bottom=[a + b for a, b in zip(train, wait)], label="publication (learner's share)",
            color="tab:gray")
    top.set(ylabel="seconds", title="Where each learner step's time went")
    top.legend(fontsize=8)
    top.grid(alpha=0.3, axis="y")
    ratio, sw, st = [], 0.0, 0.0
    for w, t in zip(wait, train):
        sw, st = sw + w, st + t
        ratio.append(100 * sw / (sw + st) if sw + st > 0 else 0.0)
    bottom.plot(steps, ratio, **_line(rows), color="tab:orange")
    bottom.set(xlabel="learner step", ylabel="bubble ratio so far (%)", ylim=(0, max(5.0, 1.15 * max(ratio))),
               title="Bubble ratio = total wait / (total wait + total T_train), up to each step")
    _integer_ticks(bottom)
    bottom.grid(alpha=0.3)
    final = run.summary.get("bubble_ratio")
    note = f"; summary.json: {100 * final:.1f} %" if isinstance(final, (int, float)) else ""
    fig.suptitle(f"{run.dir.name}: learner time (median T_train {statistics.median(train):.1f} s{note})")
    return None


def _t_bcast(fig: Any, run: Run) -> str | None:
    per_version, source = _bcast_per_version(run)
    if not per_version:
        return "no snapshot installation was measured (t_bcast_s is null in every row)"
    fig.set_size_inches(8, 3.8)
    ax = fig.subplots()
    vs = sorted(per_version)
    x = list(range(len(vs)))
    q = [per_version[v][0] for v in vs]
    a = [per_version[v][1] if per_version[v][1] is not None else 0.0 for v in vs]
    ax.bar([i - 0.2 for i in x], q, width=0.4, label="T_bcast: installed on q = 1/gamma of the workers")
    ax.bar([i + 0.2 for i in x], a, width=0.4, label="installed on all workers")
    received = [(i - 0.2, per_version[v][2]) for i, v in enumerate(vs) if per_version[v][2] is not None]
    if received:  # the rest of the bar: the workers finishing the batch they were generating
        ax.scatter(*zip(*received), marker="_", s=400, linewidths=2.5, color="black", zorder=3,
                   label="its copy complete on q of the workers (the rest: their current batch ending)")
    for i, v in enumerate(vs):
        if per_version[v][1] is None:
            ax.text(i + 0.2, 0, "not on all", ha="center", va="bottom", fontsize=8, rotation=90)
    ax.set_xticks(x, [f"v{v}" for v in vs])
    ax.set_ylim(0, 1.3 * max(q + a))  # room for the legend
    ax.set(xlabel=f"snapshot version ({source})", ylabel="seconds from publication",
           title=f"{run.dir.name}: snapshot broadcast time per version")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return None


def _workers(fig: Any, run: Run) -> str | None:
    rows = run.rows
    workers = run.summary.get("workers") or []
    fig.set_size_inches(10 if workers else 6, 3.6)
    axes = fig.subplots(1, 2 if workers else 1, squeeze=False)[0]
    scale, unit = _time_unit(rows)
    times = [r["time_s"] / scale for r in rows]
    ax = axes[0]
    ax.step(times, [r["workers_alive"] for r in rows], where="post", marker="o" if len(rows) <= 50 else None)
    top = max(r["workers_alive"] for r in rows)
    ax.set(xlabel=f"wall time ({unit})", ylabel="workers alive", ylim=(-0.2, top + 1), title="Rollout workers alive")
    _integer_ticks(ax, "y")
    ax.grid(alpha=0.3)
    if workers:
        ids = [w["worker_id"] for w in workers]
        axes[1].barh(ids, [w.get("trajectories", 0) for w in workers], color="tab:green")
        axes[1].set(xlabel="trajectories accepted", title="Trajectories per worker (summary.json)")
        axes[1].invert_yaxis()
    fig.suptitle(f"{run.dir.name}: rollout pool")
    return None


def _cost(fig: Any, run: Run) -> str | None:
    workers = run.summary.get("workers") or []
    if not workers:
        return "no summary.json worker table (the run has not finished): prices and join times unknown"
    prices = (run.config.get("scheduler") or {}).get("prices") or {}
    billed = bill.billed(workers, prices, run.rows[-1]["time_s"])  # (price, join, last heartbeat) on the run's clock
    if not any(p > 0 for p, _, _ in billed):
        return "no prices in this run (every worker's price_per_hour is 0 and scheduler.prices is empty)"
    scale, unit = _time_unit(run.rows)
    end = run.rows[-1]["time_s"]
    ts = [end * i / 200 for i in range(201)]
    cost = [sum(p * max(0.0, min(t, b) - a) for p, a, b in billed) / 3600 for t in ts]
    fig.set_size_inches(8, 3.8)
    ax = fig.subplots()
    ax.plot([t / scale for t in ts], cost, color="tab:red")
    rate = sum(p for p, _, _ in billed)
    ax.set(xlabel=f"wall time ({unit})", ylabel="worker cost so far ($)",
           title=f"{run.dir.name}: rollout worker cost, ${cost[-1]:.4g} in all "
                 f"({rate:.3g} $/h for {len(billed)} workers, ${cost[-1] / len(run.rows):.3g} per step)")
    ax.grid(alpha=0.3)
    return None


def _tasks(fig: Any, run: Run) -> str | None:
    """Per task of a mixture (metrics "tasks"): the workers' accuracy (reward where the task scores no
    correctness) and the share of its groups filtered, against the learner step."""
    names = sorted({name for r in run.rows for name in (r.get("tasks") or {})})
    if not names:
        return "no task mixture (metrics rows have no per-task 'tasks')"
    rows = run.rows
    fig.set_size_inches(10, 3.8)
    left, right = fig.subplots(1, 2)
    steps = [r["step"] for r in rows]
    for name in names:
        part = [(r.get("tasks") or {}).get(name) or {} for r in rows]
        acc = [None if p.get("rollout_accuracy") is None else 100 * p["rollout_accuracy"] for p in part]
        if all(a is None for a in acc):  # no correctness: the reward
            acc = [p.get("rollout_reward_mean") for p in part]
        left.plot(steps, acc, **_line(rows), label=name)
        right.plot(steps, [None if p.get("filter_rate") is None else 100 * p["filter_rate"] for p in part],
                   **_line(rows), label=name)
    left.set(xlabel="learner step", ylabel="accuracy of completed groups (%)", title="Workers' accuracy by task")
    right.set(xlabel="learner step", ylabel="groups filtered (%)", ylim=(-3, 103), title="Filter rate by task")
    return _step_panels(fig, (left, right), f"{run.dir.name}: {len(names)} tasks")


def _filter(fig: Any, run: Run) -> str | None:
    """Capacity in useful rollouts: the share of the groups completed each step that dynamic sampling
    filtered, beside the filter rate predicted from the values the reward took and from accuracy (binary); the
    workers' rollouts a second, raw and useful, against summary.json's mu_min (in useful rollouts)."""
    rows = run.rows
    if all(r.get("filter_rate") is None for r in rows):
        return "no filter rate measured (filter_rate is null in every row: no group completed, or a run older " \
               "than the metric)"
    fig.set_size_inches(10, 3.8)
    left, right = fig.subplots(1, 2)
    steps = [r["step"] for r in rows]
    styles = ({"color": "black"}, {"color": "tab:green", "linestyle": "--"}, {"color": "tab:purple", "linestyle": ":"})
    for (key, label, _), style in zip(verdict.FILTER_RATES, styles, strict=True):
        values = _percent(rows, key)
        if any(v is not None for v in values):
            left.plot(steps, values, **_line(rows), **style, label=label)
    cap = run.summary.get("capacity") or {}
    whole = [f"{name} {100 * cap[key]:.1f} %" for key, _, name in verdict.FILTER_RATES
             if isinstance(cap.get(key), (int, float))]
    left.set(xlabel="learner step", ylabel="groups filtered (%)", ylim=(-3, 103),
             title="Filter rate per step" + (f"\nrun: {', '.join(whole)}" if whole else ""))
    for key, label, color in (("rollouts_per_s", "raw", "tab:blue"), ("useful_rollouts_per_s", "useful", "tab:orange")):
        right.plot(steps, [r.get(key) for r in rows], **_line(rows), color=color, label=label)
    mu_min = cap.get("mu_min", run.summary.get("mu_min"))
    shown = None  # mu_min named in a corner where no line can show it
    if isinstance(mu_min, (int, float)):
        if mu_min <= 10 * max((r.get("rollouts_per_s") or 0) for r in rows):
            right.axhline(mu_min, color="tab:red", linestyle="--", label=f"mu_min {mu_min:.3g}/s")
        else:
            shown = f"mu_min {mu_min:.3g}/s (off the scale)"
    elif mu_min:
        shown = f"mu_min: {str(mu_min).split(':')[0]}"  # the rule's error, e.g. "infeasible"
    if shown:
        right.text(0.98, 0.95, shown, transform=right.transAxes, ha="right", va="top", fontsize=8, color="tab:red")
    right.set(xlabel="learner step", ylabel="rollouts / s", ylim=(0, None),
              title="Workers' rollouts a second since the previous step")
    return _step_panels(fig, (left, right), f"{run.dir.name}: dynamic sampling and capacity in useful rollouts")


#: why the prompt filter skipped a prompt before rollout (metrics `prompts_skipped_by_reason`): legend, colour
_SKIP_REASONS = {"all_correct": ("recent groups all right", "tab:green"),
                 "all_wrong": ("recent groups all wrong", "tab:red"),
                 "all_same": ("recent groups all one reward (no correctness)", "tab:gray")}


def _skipping(fig: Any, run: Run) -> str | None:
    """Pre-rollout prompt skipping: the prompts the filter skipped each step, stacked by why (their recent groups
    all right, all wrong, or all one reward); the filter rate f measured on the groups generated against the
    estimate of f had no prompt been skipped, and the filter's exploration probability."""
    rows = run.rows
    if all("prompts_skipped" not in r for r in rows):
        return "no prompt filter columns (prompts_skipped is in no row: a run older than pre-rollout prompt skipping)"
    if all(r.get("prompt_explore") is None for r in rows):
        return "the prompt filter is off (prompt_explore is null in every row)"
    fig.set_size_inches(10, 3.8)
    left, right = fig.subplots(1, 2)
    steps = [r["step"] for r in rows]
    by_reason = [r.get("prompts_skipped_by_reason") or {} for r in rows]
    reasons = [*_SKIP_REASONS, *sorted({k for b in by_reason for k in b} - set(_SKIP_REASONS))]
    bottom = [0] * len(rows)
    for reason in reasons:
        counts = [b.get(reason, 0) for b in by_reason]
        label, color = _SKIP_REASONS.get(reason, (reason, None))
        left.bar(steps, counts, bottom=bottom, width=0.8, color=color, label=label)
        bottom = [a + c for a, c in zip(bottom, counts)]
    left.set_ylim(0, max(1.0, 1.4 * max(bottom)))  # room for the legend
    _integer_ticks(left, "y")
    skipped, handed = sum(r.get("prompts_skipped") or 0 for r in rows), sum(r.get("prompts_handed") or 0 for r in rows)
    left.set(xlabel="learner step", ylabel="prompts skipped",
             title=f"Prompts skipped before rollout\nrun: {skipped} skipped, {handed} handed to workers")
    for key, label, style in (("filter_rate", "f measured", {"color": "black"}),
                              ("filter_rate_unskipped", "f had none been skipped (est.)",
                               {"color": "tab:orange", "linestyle": "--"}),
                              ("prompt_explore", "explore probability", {"color": "tab:blue", "linestyle": ":"})):
        values = _percent(rows, key)
        if any(v is not None for v in values):
            right.plot(steps, values, **_line(rows), **style, label=label)
    right.set(xlabel="learner step", ylabel="%", ylim=(-3, 128), yticks=range(0, 101, 20),
              title="Filter rate f (groups filtered) per step\nmeasured vs had no prompt been skipped")
    for ax in (left, right):
        _integer_ticks(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", ncols=2 if ax is right else 1)
    fig.suptitle(f"{run.dir.name}: pre-rollout prompt skipping")
    return None


def _step_panels(fig: Any, axes: tuple, title: str) -> None:
    """Panels against the learner step: integer ticks, a grid, a legend each; the figure's title."""
    for ax in axes:
        _integer_ticks(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)


_FIGURES = {
    "reward.png": _reward,
    "staleness.png": _staleness,
    "learner_time.png": _learner_time,
    "t_bcast.png": _t_bcast,
    "workers.png": _workers,
    "cost.png": _cost,
    "tasks.png": _tasks,
    "filter.png": _filter,
    "skipping.png": _skipping,
}


# -- data helpers ------------------------------------------------------------------------------------------
def _staleness_counts(run: Run) -> tuple[dict[int, int], str]:
    """Trajectories per Delta over the run: summary.json's buffer counter, else the summed per-step
    histograms of histograms.jsonl; ({}, "") when the run has neither."""
    hist = (run.summary.get("buffer") or {}).get("staleness_hist")
    if hist:
        return {int(k): int(v) for k, v in hist.items()}, "all sampled, summary.json"
    per_step = run.histograms.get("staleness") or {}
    total: dict[int, int] = {}
    for counts in per_step.values():
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
    return total, f"{len(per_step)} steps, histograms.jsonl"


def _bcast_per_version(run: Run) -> tuple[dict[int, tuple[float, float | None, float | None]], str]:
    """T_bcast (q, all, q received: None for runs before it) per version: the trainer's last `t_bcast` table when
    it logged one; else read off the rows, where a new t_bcast_s value belongs to the newest version published by
    then (every kappa-th)."""
    if run.tables.get("t_bcast"):
        rows = run.tables["t_bcast"][-1][1]
        return {r["version"]: (r["t_bcast_s"], r.get("t_bcast_all_s"), r.get("t_bcast_received_s"))
                for r in rows if r.get("t_bcast_s") is not None}, "tables.jsonl"
    learner = run.config.get("learner", {})
    kappa = run.summary.get("kappa") or (
        capacity.publication_period(learner["staleness"], learner.get("kappa")) if "staleness" in learner else 1
    )
    out: dict[int, tuple[float, float | None, float | None]] = {}
    last = None
    for r in run.rows:
        value = (r.get("t_bcast_s"), r.get("t_bcast_all_s"), r.get("t_bcast_received_s"))
        if value[0] is not None and value[:2] != last:  # a new T_bcast: a new publication (not a later copy's)
            out[r["version"] - r["version"] % kappa] = value
        last = value[:2]
    return out, f"newest published when measured, kappa = {kappa}"


def _integer_ticks(ax: Any, which: str = "x") -> None:
    """Whole-number ticks (steps, versions, counts) on the axes `which` names ("x", "y" or "xy")."""
    from matplotlib.ticker import MaxNLocator

    for axis in which:
        getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True))


def _time_unit(rows: list[dict[str, Any]]) -> tuple[float, str]:
    longest = max(r["time_s"] for r in rows)
    return (1.0, "s") if longest < 300 else (60.0, "min") if longest < 3 * 3600 else (3600.0, "h")


def _percent(rows: list[dict[str, Any]], key: str) -> list[float | None]:
    """A fraction column of the rows as percentages, None where a row lacks it."""
    return [100 * r[key] if r.get(key) is not None else None for r in rows]


def _line(rows: list[dict[str, Any]], marker: str = "o") -> dict[str, Any]:
    return {"marker": marker if len(rows) <= 50 else None, "markersize": 4}


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The lines of a JSON-lines file; a last line cut off by a crash is left out."""
    if not path.is_file():
        return []
    out = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise Echo2Error(f"{path}:{i + 1} is not JSON: {line[:80]!r}") from None
    return out
