"""Policy evaluation on a sandbox: the paper's Table 4 layout (appendix F).

Rows are policies (the base model and the trained checkpoint), columns are opponents (three rule-based
policies and an LLM opponent), cells are the mean net chip change per hand with a 95 % confidence
interval (normal approximation, 1.96 standard errors) over the same seeded hands for every row, so
rows differ only by the policy; the hands come from `adapter.tasks(HELD_OUT_SEED + seed)` (`held_out_tasks`),
not the deals of a training run (which reads `adapter.tasks(run.seed)`; each deal's seed is drawn from 2^31).
The chip change is the env's outcome (`meta.extra.chips`), without the training penalty for malformed replies;
the fallback rate is reported beside it. Because every row plays the same hands, each later row is also compared with
the first hand by hand (`differences`): the mean of the per-hand difference and its 95 % confidence interval, which
is far narrower than the two rows' own intervals when much of the luck is shared (the same cards and opponents'
draws; the same sampling seeds too, though two policies' draws match only while their states do). A hand that
fails ends the evaluation rather than shift the pairing. Besides the metric, a plug-in may name more per-hand values
to compare so (`eval_paired_metrics`, e.g. poker's `expected_chips` under `reward = "allin_ev"`).

    echo2 eval --env poker://nlhe_headsup_v1 --trained runs/poker/checkpoint --hands 200

Single-turn tasks (any adapter with `tasks` and `score`, e.g. math) get `evaluate_tasks`: accuracy and mean
reward of each policy on the same N held-out tasks. The TaskAdapter contract has no eval split, so "held out"
is the adapter's own stream under a seed no training run uses by default, `adapter.tasks(HELD_OUT_SEED + seed)`
(training reads `adapter.tasks(run.seed)`). For procedural tasks that is an unseen draw (problems may still
repeat by chance: level-1 math has 81 distinct sums); a file-backed adapter reshuffles the same file, so give it
a held-out file in the options.

    echo2 eval --task math --task-option difficulty=2 --trained runs/math/checkpoint --tasks 200
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Cell", "Difference", "TaskScores", "differences", "evaluate", "evaluate_tasks", "format_table",
           "format_task_table", "held_out_tasks", "task_scores_json", "paired_difference", "task_differences",
           "DEFAULT_OPPONENTS", "SOLO", "default_metric", "HELD_OUT_SEED", "table_json", "task_table_json", "finite"]

DEFAULT_OPPONENTS = ("calling_station", "tight_aggressive", "loose_aggressive", "llm")
SOLO = "-"  # the one column of an env without opponents (its plug-in sets no eval_opponents)


def default_metric(scheme: str, plugin: Any) -> str:
    """The per-hand meta.extra key a table averages: the plug-in's eval_metric; poker's chips; else the reward."""
    return getattr(plugin, "eval_metric", None) or ("chips" if scheme == "poker" else "reward")
HELD_OUT_SEED = 1_000_003  # evaluation reads adapter.tasks(HELD_OUT_SEED + seed): tasks or hands, never training's


@dataclass
class Cell:
    hands: int
    mean: float
    ci95: float
    fallback_rate: float
    values: list[float] = field(default_factory=list, repr=False)
    stats: dict[str, Any] = field(default_factory=dict)  # the env plug-in's summarize() of the cell's episodes
    ids: list[str] = field(default_factory=list, repr=False)  # the hands' task ids, in the order of `values`
    # eval_paired_metrics' per-hand values (None where a hand did not record a number)
    paired: dict[str, list[float | None]] = field(default_factory=dict, repr=False)


@dataclass
class Difference:
    """One row minus the first over the same hands (or tasks), hand by hand: the mean and its 95 % CI
    (1.96 standard errors, the normal approximation: read it for n of 30 and more)."""

    n: int
    mean: float
    ci95: float


def paired_difference(first: Sequence[float | None], other: Sequence[float | None]) -> Difference:
    """Mean of other[i] - first[i] with 1.96 standard errors of the per-item differences, over the items both
    sides hold a number for (None: not recorded); `n` says how many that was."""
    if len(first) != len(other):
        raise ValueError(f"paired_difference: {len(first)} values against {len(other)}; pairs need the same items")
    cell = _cell([b - a for a, b in zip(first, other) if a is not None and b is not None], 0, 0)
    return Difference(cell.hands, cell.mean, cell.ci95)


def differences(table: Mapping[str, Mapping[str, Cell]], metric: str = "chips") -> dict[str, dict[str, dict[str, Difference]]]:
    """{later row label: {metric: {opponent: Difference against the first row}}}: the table's metric and every
    `eval_paired_metrics` value the rows recorded. Cells that name their hands (`ids`) must name the same ones in
    the same order: a difference of two different hands is refused, not computed."""
    rows = list(table.items())
    out: dict[str, dict[str, dict[str, Difference]]] = {}
    for label, cells in rows[1:]:
        by_metric: dict[str, dict[str, Difference]] = {}
        for opp, cell in cells.items():
            first = rows[0][1].get(opp)
            if first is None:
                continue
            if first.ids and cell.ids and first.ids != cell.ids:
                raise ValueError(f"{label} vs {opp} played other hands than {rows[0][0]}: no hand-by-hand difference")
            pairs = {metric: (first.values, cell.values)}
            pairs |= {k: (first.paired[k], v) for k, v in cell.paired.items() if k in first.paired and k != metric}
            for key, (a, b) in pairs.items():
                d = paired_difference(a, b)
                if d.n:
                    by_metric.setdefault(key, {})[opp] = d
        out[label] = by_metric
    return out


def _cell(values: Sequence[float], fallbacks: int, decisions: int) -> Cell:
    n = len(values)
    mean = statistics.fmean(values) if n else float("nan")
    ci = 1.96 * statistics.stdev(values) / math.sqrt(n) if n > 1 else float("nan")
    return Cell(n, mean, ci, fallbacks / max(1, decisions), list(values))


def evaluate(
    env: str,
    policies: Mapping[str, str],
    *,
    opponents: Sequence[str] | None = None,
    hands: int = 100,
    seed: int = 0,
    backend: str = "hf",
    backend_options: Mapping[str, Any] | None = None,
    max_new_tokens: int = 12,
    temperature: float = 0.7,
    batch: int = 16,
    env_options: Mapping[str, Any] | None = None,
    llm_opponent_model: str | None = None,
    metric: str | None = None,
    on_cell: Callable[[str, str, Cell, float], None] | None = None,
) -> dict[str, dict[str, Cell]]:
    """{policy label: {opponent: Cell}}. `policies` maps a row label to a model (name or folder); every
    row plays the same `hands` seeded hands against each opponent. `on_cell(label, opponent, cell,
    seconds)` is called as each cell is done (a long evaluation shows its progress). `opponents` and `metric`
    default to the env plug-in's `eval_opponents` / `eval_metric` (else poker's: DEFAULT_OPPONENTS, "chips");
    a plug-in with `summarize(extras)` also fills each cell's `stats` (e.g. MOBA win rate, gold and XP lead)."""
    from echo2sdk.adapters.registry import load_env_plugin, parse_env
    from echo2sdk.adapters.sandbox import SandboxAdapter
    from echo2sdk.errors import ConfigError
    from echo2sdk.plugins import load_backend_class

    if hands < 2:
        raise ConfigError(f"echo2 eval: hands = {hands!r} must be >= 2 for a confidence interval")
    if batch < 1:
        raise ConfigError(f"echo2 eval: batch = {batch!r} must be >= 1")
    scheme = parse_env(env)[0]
    opponents, metric, summarize, also = _plugin_measures(scheme, load_env_plugin(scheme), opponents, metric)
    backend_cls = load_backend_class(backend)
    table: dict[str, dict[str, Cell]] = {}
    base_model = next(iter(policies.values()))
    for label, model in policies.items():
        policy = backend_cls(model, **dict(backend_options or {}))
        row: dict[str, Cell] = {}
        try:
            for opp in opponents:
                opts = dict(env_options or {}) if opp == SOLO else dict(env_options or {}, opponent=opp)
                if opp == "llm":
                    opts.setdefault("opponent_model", llm_opponent_model or base_model)
                adapter = SandboxAdapter(env=env, env_options=opts, max_action_tokens=max_new_tokens)
                tasks = held_out_tasks(adapter, hands, seed)  # deals no training run with run.seed = seed plays
                t0 = time.monotonic()
                row[opp] = _play_cell(policy, adapter, tasks, opp, hands=hands, seed=seed, batch=batch,
                                      max_new_tokens=max_new_tokens, temperature=temperature, metric=metric,
                                      also=also, summarize=summarize)
                if on_cell is not None:
                    on_cell(label, opp, row[opp], time.monotonic() - t0)
        finally:
            policy.close()
        table[label] = row
    return table


def _plugin_measures(
    scheme: str, plugin: Any, opponents: Sequence[str] | None, metric: str | None
) -> tuple[list[str], str, Callable[[list[dict[str, Any]]], Mapping[str, Any]] | None, list[str]]:
    """What an evaluation plays and measures: (opponents, metric, the plug-in's `summarize` or None, its paired
    metrics other than `metric`). `opponents` and `metric` when given, else the env plug-in's."""
    # the plug-in's opponents; poker's by default; a single-player env (no eval_opponents) plays one column: the
    # env as configured, no `opponent` option injected
    solo = (SOLO,) if scheme != "poker" else DEFAULT_OPPONENTS
    opponents = list(opponents or getattr(plugin, "eval_opponents", None) or solo)
    metric = metric or default_metric(scheme, plugin)
    summarize = getattr(plugin, "summarize", None)
    also = [k for k in getattr(plugin, "eval_paired_metrics", ()) if k != metric]
    return opponents, metric, summarize, also


def _play_cell(
    policy: Any, adapter: Any, tasks: Sequence[Any], opp: str, *, hands: int, seed: int, batch: int,
    max_new_tokens: int, temperature: float, metric: str, also: Sequence[str],
    summarize: Callable[[list[dict[str, Any]]], Mapping[str, Any]] | None,
) -> Cell:
    """`policy`'s Cell against `opp`: the `hands` held-out `tasks` played on `adapter` in batches of `batch`, a
    batch starting at hand i sampled with seed `seed` + i. Its values are each hand's `metric` (the reward where
    a hand has none), `paired` each hand's `also` metrics, `stats` summarize(the hands' extras) when the plug-in
    has one. RuntimeError when a hand failed (leaving it out would shift every later hand's pairing)."""
    from echo2sdk.core.contracts import SamplingParams
    from echo2sdk.core.episodes import EpisodeStats, play_episodes

    values: list[float] = []
    extras: list[dict[str, Any]] = []
    fallbacks = decisions = 0
    ids: list[str] = []
    for i in range(0, hands, batch):
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + i)
        chunk, played = tasks[i : i + batch], EpisodeStats()
        groups = play_episodes(policy, adapter, chunk, 1, params, version=0, stats=played)
        if played.dropped_groups:  # a hand left out would shift every later hand's pairing
            raise RuntimeError(f"echo2 eval: {played.dropped_groups} of {len(chunk)} hands against {opp} "
                               f"failed: {(played.errors or ['no error text'])[0]}")
        for task, (record,) in zip(chunk, groups):
            extra = record.meta.extra
            ids.append(task.id)
            values.append(float(extra.get(metric, record.reward)))
            extras.append(dict(extra))
            fallbacks += int(extra.get("fallbacks", 0))
            decisions += int(extra.get("turns", 0))
    cell = _cell(values, fallbacks, decisions)
    cell.ids = ids
    cell.paired = {k: [_number(e.get(k)) for e in extras] for k in also}
    if summarize is not None:
        cell.stats = dict(summarize(extras))
    return cell


def _number(value: Any) -> float | None:
    """A per-hand value as a finite float, else None (not recorded, not a number, NaN or infinite)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def format_table(
    table: Mapping[str, Mapping[str, Cell]], *, env: str, hands: int, seed: int, metric: str = "chips", unit: str = "hand"
) -> str:
    """Table 4 layout: one row per policy, one column per opponent, `mean ± ci95` per cell."""
    opponents = list(next(iter(table.values())))
    names = {o: ("the env (no opponent)" if o == SOLO else f"Rule-based{i + 1} ({o})" if o != "llm" else "LLM opponent")
             for i, o in enumerate(opponents)}
    head = ["policy", *(names[o] for o in opponents)]
    rows = [[label, *(f"{c.mean:+.3f} ± {c.ci95:.3f}" for c in cells.values())] for label, cells in table.items()]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(x.ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
    out = [
        f"Net {metric} change per {unit} on {env}: mean ± 95% CI over {hands} held-out {unit}s "
        f"(adapter.tasks({HELD_OUT_SEED} + {seed})), "
        f"the same {unit}s for every row. Positive = profit.",
        line(head),
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        *(line(r) for r in rows),
    ]
    fb = "; ".join(
        f"{label}: " + ", ".join(f"{o} {c.fallback_rate:.0%}" for o, c in cells.items()) for label, cells in table.items()
    )
    out.append(f"Fallback rate (malformed or illegal replies per decision): {fb}")
    for label, cells in table.items():
        for o, c in cells.items():
            if c.stats:
                out.append(f"{label} vs {o}: " + ", ".join(_stat(k, v) for k, v in c.stats.items()))
    first = next(iter(table))
    for label, by_metric in differences(table, metric).items():
        for key, diffs in by_metric.items():
            out.append(f"{label} minus {first}, {key} per {unit}, paired over the same {unit}s (mean ± 95% CI): "
                       + ", ".join(f"{o} {d.mean:+.3f} ± {d.ci95:.3f}"
                                   + (f" (the {d.n} of {table[label][o].hands} {unit}s both rows recorded it in)"
                                      if d.n < table[label][o].hands else "") for o, d in diffs.items()))
    return "\n".join(out)


def _stat(key: str, value: Any) -> str:
    """One plug-in statistic as text: a *_rate as a percentage, a *_diff signed, other floats to 2 places."""
    if isinstance(value, float):
        text = f"{value:.0%}" if key.endswith("_rate") else f"{value:+.2f}" if key.endswith("_diff") else f"{value:.2f}"
    else:
        text = str(value)
    return f"{key} {text}"


# -- single-turn tasks ----------------------------------------------------------------------------------
@dataclass
class TaskScores:
    """One policy on the held-out tasks: accuracy (share scored correct; None when the adapter's scores carry
    no `correct`) and the mean reward with its 95 % confidence interval, over the tasks scored; `failed` counts
    the tasks whose score raised or gave no finite reward (left out of the means; `errors`: the first few, named
    by task). `rewards` holds one entry per task (None: failed), for the paired differences. `by_task`: the same
    per component of a mixture (tasks whose info names a "task")."""

    tasks: int
    accuracy: float | None
    reward_mean: float
    reward_ci95: float
    rewards: list[float | None] = field(default_factory=list, repr=False)
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    by_task: dict[str, TaskScores] = field(default_factory=dict)


SHOWN_ERRORS = 5  # failures named per row


def task_scores_json(c: TaskScores) -> dict[str, Any]:
    """A row as `echo2 eval --json` writes it (no per-task rewards)."""
    return {"tasks": c.tasks, "accuracy": c.accuracy, "reward_mean": c.reward_mean, "reward_ci95": c.reward_ci95,
            "failed": c.failed, "errors": c.errors, "by_task": {k: task_scores_json(v) for k, v in c.by_task.items()}}


def held_out_tasks(adapter: Any, n: int, seed: int = 0) -> list[Any]:
    """The first `n` tasks of `adapter.tasks(HELD_OUT_SEED + seed)`; fewer when the stream is shorter."""
    import itertools

    from echo2sdk.errors import ConfigError

    if n < 2:
        raise ConfigError(f"echo2 eval: tasks = {n!r} must be >= 2 for a confidence interval")
    tasks = list(itertools.islice(adapter.tasks(HELD_OUT_SEED + seed), n))
    if len(tasks) < 2:
        raise ConfigError(f"echo2 eval: the adapter's held-out stream (seed {HELD_OUT_SEED + seed}) gave {len(tasks)} "
                          f"task(s); at least 2 are needed")
    return tasks


def evaluate_tasks(
    adapter: str,
    policies: Mapping[str, str],
    *,
    options: Mapping[str, Any] | None = None,
    tasks: int = 100,
    seed: int = 0,
    backend: str = "hf",
    backend_options: Mapping[str, Any] | None = None,
    max_new_tokens: int = 64,
    temperature: float = 0.7,
    batch: int = 16,
    on_row: Callable[[str, TaskScores, float], None] | None = None,
) -> dict[str, TaskScores]:
    """{policy label: TaskScores} for single-turn adapter `adapter` (a registered name or "pkg.mod:Class", built
    with `options`). Every row answers the same held-out tasks with the same sampling seeds, so rows differ only
    by the policy. `on_row(label, scores, seconds)` is called as each row is done."""
    from echo2sdk.core.contracts import SamplingParams, is_episodic
    from echo2sdk.errors import ConfigError
    from echo2sdk.plugins import load_adapter, load_backend_class

    if batch < 1:
        raise ConfigError(f"echo2 eval: batch = {batch!r} must be >= 1")
    task_adapter = load_adapter(adapter, dict(options or {}))
    if is_episodic(task_adapter):
        raise ConfigError(f"echo2 eval: adapter {adapter!r} plays episodes; evaluate it with --env URL")
    items = held_out_tasks(task_adapter, tasks, seed)
    backend_cls = load_backend_class(backend)
    table: dict[str, TaskScores] = {}
    for label, model in policies.items():
        policy = backend_cls(model, **dict(backend_options or {}))
        t0 = time.monotonic()
        scores: list[Any] = []
        try:
            for i in range(0, len(items), batch):
                chunk = items[i : i + batch]
                params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + i)
                samples = policy.generate([policy.encode_chat(t.messages) for t in chunk], params)
                scores += [_score(task_adapter, t, s.text) for t, s in zip(chunk, samples)]
        finally:
            policy.close()
        table[label] = _task_scores(items, scores)
        if on_row is not None:
            on_row(label, table[label], time.monotonic() - t0)
    return table


def _score(adapter: Any, task: Any, text: str) -> Any:
    """The adapter's Score of one answer with a finite reward, or the error text (naming the task) when its score
    raised or gave none: a failed task is counted, not the end of the evaluation."""
    from echo2sdk.core.failures import as_reward

    try:
        score = adapter.score(task, text)
        as_reward(getattr(score, "reward", None))
        return score
    except Exception as e:  # noqa: BLE001 - any failure of the task's code (RewardError included) is the finding
        return f"task {task.id!r}: {type(e).__name__}: {str(e)[:200]}"


def _task_scores(items: Sequence[Any], scores: Sequence[Any], split: bool = True) -> TaskScores:
    rewards = [None if isinstance(s, str) else float(s.reward) for s in scores]
    errors = [s for s in scores if isinstance(s, str)]
    judged = [bool(s.correct) for s in scores if not isinstance(s, str) and s.correct is not None]
    cell = _cell([r for r in rewards if r is not None], 0, 0)
    by_task: dict[str, TaskScores] = {}
    if split:
        names = [t.info.get("task") if isinstance(t.info.get("task"), str) else None for t in items]
        for name in sorted({n for n in names if n is not None}):
            picked = [k for k, n in enumerate(names) if n == name]
            by_task[name] = _task_scores([items[k] for k in picked], [scores[k] for k in picked], split=False)
    return TaskScores(len(rewards), statistics.fmean(judged) if judged else None, cell.mean, cell.ci95, rewards,
                      failed=len(errors), errors=errors[:SHOWN_ERRORS], by_task=by_task)


def format_task_table(table: Mapping[str, TaskScores], *, task: str, tasks: int, seed: int) -> str:
    """One row per policy: accuracy and mean reward ± 95 % CI over the same held-out tasks."""
    head = ["policy", "accuracy", "reward (mean ± 95% CI)", "failed"]
    rows = [_task_row(label, c) for label, c in table.items()]
    for label, c in table.items():
        rows += [_task_row(f"  {label}: {name}", part) for name, part in c.by_task.items()]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(x.ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
    n = next(iter(table.values())).tasks if table else tasks
    labels = list(table)
    diffs = [f"{label} minus {labels[0]}, reward paired over the same tasks (mean ± 95% CI): {d.mean:+.3f} ± {d.ci95:.3f}"
             for label, d in task_differences(table).items()]
    failures = [f"{label}: {c.failed} task(s) failed to score, left out of its means: " + "; ".join(c.errors)
                for label, c in table.items() if c.failed]
    return "\n".join([
        f"{task}: accuracy and mean reward over {n} held-out tasks (adapter.tasks({HELD_OUT_SEED} + {seed})), "
        f"the same tasks and sampling seeds for every row.",
        line(head),
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        *(line(r) for r in rows),
        *diffs,
        *failures,
    ])


def _task_row(label: str, c: TaskScores) -> list[str]:
    reward = "-" if c.tasks == c.failed else f"{c.reward_mean:.3f} ± {c.reward_ci95:.3f}"
    return [label, "-" if c.accuracy is None else f"{c.accuracy:.1%}", reward, f"{c.failed} of {c.tasks}"]


def task_differences(table: Mapping[str, TaskScores]) -> dict[str, Difference]:
    """{later row label: its reward minus the first row's, task by task}."""
    rows = list(table.items())
    return {label: paired_difference(rows[0][1].rewards, c.rewards) for label, c in rows[1:]}


def table_json(table: Mapping[str, Mapping[str, Cell]], metric: str) -> dict[str, Any]:
    """A sandbox evaluation's table as `echo2 eval --json` writes it (no per-hand values), and each later row's
    paired differences from the first (`differences`)."""
    data = {p: {o: {k: v for k, v in vars(c).items() if k not in ("values", "paired", "ids")} for o, c in row.items()}
            for p, row in table.items()}
    diffs = {label: {key: {o: vars(d) for o, d in by_opp.items()} for key, by_opp in by_metric.items()}
             for label, by_metric in differences(table, metric).items()}
    return {"table": data, "differences_from_first_row": diffs}


def task_table_json(table: Mapping[str, TaskScores]) -> dict[str, Any]:
    """A task evaluation's table as `echo2 eval --json` writes it, and each later row's reward differences from the
    first (`task_differences`)."""
    return {"table": {label: task_scores_json(c) for label, c in table.items()},
            "reward_differences_from_first_row": {label: vars(d) for label, d in task_differences(table).items()}}


def finite(data: object) -> object:
    """`data` with NaN and infinities as None, so JSON gets null (strict JSON), not NaN."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data
