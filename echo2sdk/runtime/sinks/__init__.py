"""Metrics sinks: where a run's numbers go (metrics.jsonl, TensorBoard, Weights & Biases, MLflow, yours).

A sink is any object with the five methods of `MetricsSink`. Sinks register in the entry-point group
``echo2sdk.sinks`` (the built-ins `jsonl`, `tensorboard`, `wandb` and `mlflow` through the same path, in
pyproject.toml); a name may also be a direct ``"pkg.module:Class"``. `load_sinks` opens the ones a run asks
for (``run.log_to``) and returns them as one `Sinks`, which the trainer calls once per step.

`jsonl` is the run's record of truth (``--resume`` cuts metrics.jsonl back to a checkpoint, ``echo2 plot``
reads it): when it fails the run fails. Every other sink is optional: one whose package is missing, that
fails to open, or that raises later is logged with the reason and dropped; training goes on.

Nothing heavy is imported here: each built-in imports its library in ``open``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from echo2sdk.errors import Echo2Error, NameNotFound

__all__ = ["MetricsSink", "Sinks", "SINKS", "REQUIRED", "load_sinks", "check_sink", "flatten", "redact", "sample_rows"]

log = logging.getLogger("echo2sdk.sinks")

SINKS = "echo2sdk.sinks"
#: Sinks whose failure ends the run (the others are logged and dropped).
REQUIRED = frozenset({"jsonl"})
_METHODS = ("open", "log", "log_table", "log_histogram", "close")


class MetricsSink(Protocol):
    """Where one run's metrics go. The trainer calls `open` once, then any number of `log`, `log_table` and
    `log_histogram` with non-decreasing steps, then `close` once. Nothing is called after `close`.

    Values are plain JSON data: numbers, booleans, strings, None (not measured) and, in `log`, dicts of
    them one level deep (``row["task"]``: the batch's mean of each task metadata field). A sink that needs
    flat scalar names uses `flatten` (``task/correct``). A sink writes only under `run_dir` unless its
    user pointed it elsewhere (a tracking server)."""

    def open(self, run_dir: Path, config: dict[str, Any]) -> None:
        """Start: `config` is the run's full configuration (secrets redacted), to be recorded now so that a
        run that crashes later still says how it was configured."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """One learner step's metrics.jsonl row (docs/observability.md lists its keys)."""

    def log_table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        """A table: rows with the same keys, e.g. `samples` (prompt, response, reward, ...) every N steps."""

    def log_histogram(self, step: int, name: str, counts: Mapping[int, int]) -> None:
        """Counts per integer bucket, e.g. `staleness`: trajectories of the step's batch per Delta = v_t - v."""

    def close(self) -> None:
        """Flush and release files, writers and runs."""


def check_sink(sink: Any, name: str) -> None:
    """Raise Echo2Error naming the sink, the group and the methods it lacks, if it is not a MetricsSink."""
    missing = [m for m in _METHODS if not callable(getattr(sink, m, None))]
    if missing:
        raise Echo2Error(f"metrics sink {name!r} ({type(sink).__qualname__}) in group {SINKS!r} lacks {missing}; "
                         f"a sink implements {', '.join(_METHODS)} (echo2sdk.runtime.sinks.MetricsSink)")


class Sinks:
    """The run's open sinks (`load_sinks` opened them) as one: each call goes to every sink in order. An optional sink that raises is
    logged once with the exception and dropped for the rest of the run; a required one's error propagates."""

    def __init__(self, sinks: Mapping[str, MetricsSink], required: Iterable[str] = REQUIRED):
        self._sinks = dict(sinks)
        self._required = frozenset(required)

    @property
    def names(self) -> list[str]:
        return list(self._sinks)

    def __getitem__(self, name: str) -> MetricsSink:
        return self._sinks[name]

    def __contains__(self, name: object) -> bool:
        return name in self._sinks

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._each("log", step, metrics)

    def log_table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        self._each("log_table", step, name, rows)

    def log_histogram(self, step: int, name: str, counts: Mapping[int, int]) -> None:
        self._each("log_histogram", step, name, counts)

    def close(self) -> None:
        """Close every sink (each once); then raise the first required sink's error, if any."""
        first: BaseException | None = None
        for name in list(self._sinks):
            try:
                self._sinks.pop(name).close()
            except Exception as e:  # noqa: BLE001 - one sink's failure must not keep the others open
                if name in self._required and first is None:
                    first = e
                log.warning("metrics sink %r failed to close: %s: %s", name, type(e).__name__, e)
        if first is not None:
            raise first

    def _each(self, method: str, *args: Any) -> None:
        for name, sink in list(self._sinks.items()):
            try:
                getattr(sink, method)(*args)
            except Exception as e:  # noqa: BLE001 - an optional sink never kills the run
                if name in self._required:
                    raise
                log.warning("metrics sink %r failed in %s (%s: %s); it is off for the rest of the run",
                            name, method, type(e).__name__, e)
                self._sinks.pop(name, None)
                try:
                    sink.close()
                except Exception:  # noqa: BLE001, S110 - it failed already; its close is best effort
                    pass


def load_sinks(names: Iterable[str], run_dir: str | Path, config: Mapping[str, Any],
               required: Iterable[str] = REQUIRED) -> Sinks:
    """Open the sinks `names` (registered names or "pkg.mod:Class") on `run_dir` with `config` (redacted
    here) and return them as one `Sinks`, in the order given, each name once.

    An unknown name raises NameNotFound (a typo in run.log_to is a configuration error). A required sink
    (`jsonl`) that cannot be loaded or opened raises. Any other sink that cannot be imported, lacks a
    method, or fails to open (its package is not installed: DependencyNotInstalled names the extra) is
    logged with the reason and left out."""
    from echo2sdk.plugins import load_object

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    clean = redact(config)
    required = frozenset(required)
    opened: dict[str, MetricsSink] = {}
    for name in dict.fromkeys(names):
        try:
            sink = load_object(SINKS, name)()
            check_sink(sink, name)
            sink.open(run_dir, clean)
        except NameNotFound:
            raise
        except Exception as e:  # noqa: BLE001 - an optional sink that cannot start is skipped, not fatal
            if name in required:
                raise
            log.warning("metrics sink %r is off: %s", name, e if isinstance(e, Echo2Error) else f"{type(e).__name__}: {e}")
            continue
        opened[name] = sink
    log.info("metrics sinks: %s", ", ".join(opened) or "none")
    return Sinks(opened, required)


# -- helpers the sinks share -------------------------------------------------------------------------
def flatten(metrics: Mapping[str, Any], sep: str = "/", prefix: str = "") -> dict[str, float]:
    """The numeric leaves of `metrics` under flat names: nested dicts become ``task/correct``; booleans
    become 0/1; None, strings and non-finite numbers (not a measurement) are left out."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, sep, name + sep))
        elif isinstance(value, (bool, int, float)) and math.isfinite(value):
            out[name] = float(value)
    return out


#: A key that names a secret: `token`, `hf_token`, `api_key`, `db_password`, ... (not `max_new_tokens`).
_SECRET = re.compile(r"(^|[_.-])(token|secret|password|passwd|api_?key|private_?key)$", re.IGNORECASE)
REDACTED = "<redacted>"


def redact(config: Any) -> Any:
    """A copy of `config` with every value whose key names a secret (token, secret, password, api key,
    private key) replaced by "<redacted>" when set. Sinks may send the config off the machine."""
    if isinstance(config, Mapping):
        return {k: (REDACTED if _SECRET.search(str(k)) and v not in (None, "") else redact(v)) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [redact(v) for v in config]
    return config


#: Longest prompt or response text kept in a sample row (characters).
MAX_TEXT = 4000


def sample_rows(records: Iterable[Any], limit: int = 8) -> list[dict[str, Any]]:
    """Up to `limit` trajectories of a batch as table rows: one per GRPO group first, then a second per group,
    and so on. Columns: prompt, response, reward, version, worker, then the task's scalar metadata (e.g.
    correct), the same in every row (None where a record lacks one). Texts are cut to MAX_TEXT characters."""
    groups: dict[str, list[Any]] = {}
    for t in records:
        groups.setdefault(t.meta.group_id, []).append(t)
    picked: list[Any] = []
    depth = 0
    while len(picked) < limit and any(depth < len(g) for g in groups.values()):
        picked += [g[depth] for g in groups.values() if depth < len(g)][: limit - len(picked)]
        depth += 1
    extra_keys = sorted({k for t in picked for k, v in t.meta.extra.items() if isinstance(v, (bool, int, float, str))})
    return [
        {
            "prompt": _text(t.prompt)[:MAX_TEXT],
            "response": t.response[:MAX_TEXT],
            "reward": t.reward,
            "version": t.version,
            "worker": t.meta.worker,
            **{k: t.meta.extra.get(k) for k in extra_keys},
        }
        for t in picked
    ]


def _text(prompt: Any) -> str:
    """A prompt as text: a string as it is, chat messages as 'role: content' lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.role}: {m.content}" for m in prompt)


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """The table's column names: every key of every row, in first-seen order."""
    return list(dict.fromkeys(k for r in rows for k in r))


def sorted_counts(counts: Mapping[Any, Any]) -> list[tuple[int, int]]:
    """A histogram's (bucket, count) pairs with integer buckets, in bucket order."""
    return sorted((int(k), int(v)) for k, v in counts.items())
