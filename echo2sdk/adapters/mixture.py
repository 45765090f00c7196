"""A mixture of task adapters drawn by weight, per task (prime-rl's `[[env]] ratio`).

    [[task.mix]]
    adapter = "reasoning-gym://chain_sum"
    weight = 2
    options = { config = { max_terms = 2 } }

    [[task.mix]]
    adapter = "dataset://data/qa.jsonl"
    weight = 1
    name = "qa"                       # optional: the task's name in the metrics (default: from the adapter)

Each task of `tasks(seed)` comes from one component, drawn with probability weight / sum(weights) by a
generator seeded with `seed` (each component's own stream is tasks(seed) too, consumed in order). A task's
id is "NAME/ID" and its info gains `task = NAME`: the worker's record carries it, so metrics.jsonl splits
reward, accuracy, the workers' level and the groups filtered by task (`tasks`), as do the plots and the
status page. Scoring goes back to the component with the component's own task. Components are single-turn
adapters (score); a mixture of episodic tasks is not supported yet.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from echo2sdk.core import checks
from echo2sdk.core.contracts import Score, Task
from echo2sdk.errors import AdapterError, ConfigError, Echo2Error

__all__ = ["MixtureAdapter", "MIXTURE", "component_name", "part_name"]

MIXTURE = "mixture"  # the registered adapter name a config's [[task.mix]] loads
_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}")


def component_name(adapter: str) -> str:
    """The default name of a component in the metrics: the URL's id (reasoning-gym://chain_sum -> chain_sum; a
    dataset path's file stem), else the adapter name."""
    tail = adapter.partition("://")[2] or adapter
    tail = tail.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    stem = tail.split(".", 1)[0] if adapter.startswith("dataset://") else tail
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", stem)[:64] or "task"


def part_name(part: Mapping[str, Any]) -> Any:
    """A [[task.mix]] table's name in the metrics: its `name`, else component_name(its adapter)."""
    return part.get("name", component_name(part["adapter"]))


class MixtureAdapter:
    """mix: a list of {adapter, weight (> 0, default 1), options (default {}), name (default: component_name)}."""

    def __init__(self, mix: Sequence[Mapping[str, Any]]):
        from echo2sdk.core.contracts import is_episodic
        from echo2sdk.plugins import load_adapter

        if isinstance(mix, (str, bytes)) or not isinstance(mix, Sequence) or not mix:
            raise ConfigError(f"task.mix = {mix!r}: expected a list of {{adapter, weight, options}} tables")
        self.mix: list[dict[str, Any]] = []
        self._adapters: dict[str, Any] = {}
        for k, part in enumerate(mix):
            where = f"task.mix[{k}]"
            if not isinstance(part, Mapping):
                raise ConfigError(f"{where} = {part!r}: expected a table with adapter, weight, options")
            unknown = set(part) - {"adapter", "weight", "options", "name"}
            if unknown:
                raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; a component has adapter, weight, options, name")
            adapter = part.get("adapter")
            if not isinstance(adapter, str) or not adapter:
                raise ConfigError(f"{where}.adapter = {adapter!r}: expected an adapter name or URL")
            weight = part.get("weight", 1.0)
            checks.real(f"{where}.weight", weight, lo=0, open_lo=True, error=ConfigError)
            options = part.get("options", {})
            if not isinstance(options, Mapping):
                raise ConfigError(f"{where}.options = {options!r}: expected a table")
            name = part_name(part)
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ConfigError(f"{where}.name = {name!r}: expected 1-64 letters, digits or _.+-")
            if name in self._adapters:
                raise ConfigError(f"{where}: the name {name!r} is taken by another component; give one a `name`")
            if adapter == MIXTURE or adapter.endswith(":MixtureAdapter"):
                raise ConfigError(f"{where}.adapter = {adapter!r}: a mixture's components are tasks, not mixtures "
                                  "(give their components here, with their weights)")
            try:
                loaded = load_adapter(adapter, dict(options))
            except Echo2Error as e:
                raise ConfigError(f"{where}.adapter = {adapter!r}: {e}") from e
            if is_episodic(loaded):
                raise ConfigError(f"{where}.adapter = {adapter!r} is episodic; a mixture takes single-turn tasks only")
            self._adapters[name] = loaded
            self.mix.append({"adapter": adapter, "weight": float(weight), "options": dict(options), "name": name})
        self.names = [p["name"] for p in self.mix]
        self.weights = [p["weight"] for p in self.mix]

    def spec(self) -> tuple[str, dict[str, Any]]:
        """(adapter name, options) that rebuild an equal adapter: `load_adapter(*adapter.spec())`."""
        return MIXTURE, {"mix": [dict(p) for p in self.mix]}

    def __repr__(self) -> str:
        total = sum(self.weights)
        return "MixtureAdapter(" + ", ".join(f"{n}: {w / total:.2f}" for n, w in zip(self.names, self.weights)) + ")"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MixtureAdapter) and self.spec() == other.spec()

    def tasks(self, seed: int) -> Iterator[Task]:
        """Endless while every component is: a component whose stream ends stops being drawn; the mixture ends
        when all have."""
        rng = random.Random(f"mixture:{seed}")
        streams = {name: iter(a.tasks(seed)) for name, a in self._adapters.items()}
        names, weights = list(self.names), list(self.weights)
        while names:
            name = rng.choices(names, weights)[0]
            try:
                task = next(streams[name])
            except StopIteration:
                k = names.index(name)
                del names[k], weights[k]
                continue
            if "task" in task.info:
                raise AdapterError(f"task.mix component {name!r}: its task {task.id!r} has info['task'] already, "
                                   "the key a mixture names its component with")
            yield Task(id=f"{name}/{task.id}", messages=task.messages, answer=task.answer,
                       info={**task.info, "task": name})

    def score(self, task: Task, response: str) -> Score:
        """The component's score, on the component's own task (its id and info as it made them)."""
        name = task.info.get("task")
        adapter = self._adapters.get(name) if isinstance(name, str) else None
        if adapter is None:
            raise ValueError(f"task {task.id!r} names no component of this mixture: info['task'] = {name!r}")
        info = {k: v for k, v in task.info.items() if k != "task"}
        own = Task(id=task.id.partition("/")[2], messages=task.messages, answer=task.answer, info=info)
        score = adapter.score(own, response)
        if isinstance(score, Score) and isinstance(score.info, dict) and "task" in score.info:  # the name stays ours
            info = {("component_task" if k == "task" else k): v for k, v in score.info.items()}
            score = Score(reward=score.reward, correct=score.correct, info=info)
        return score
