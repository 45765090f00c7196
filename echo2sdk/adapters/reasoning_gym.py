"""reasoning-gym://NAME: one of reasoning-gym's procedural generators as a single-turn task adapter.

    [task]
    adapter = "reasoning-gym://chain_sum"
    options = { config = { min_terms = 2, max_terms = 3, max_digits = 2 }, fewshot = 1 }

reasoning-gym (PyPI `reasoning-gym`, the optional extra `reasoning-gym`) ships 100+ generators, each with
its own verifier. The stream of `tasks(seed)` is made of chunks of `chunk_size` items, each chunk a
generator seeded from (seed, chunk number): endless, deterministic for a seed, never the same item twice
by construction of the seeds. A task carries only (dataset seed, index) in `Task.info`; the worker that
scores it rebuilds the same generator and item (generation is deterministic; an item whose answer differs from
the task's is a failed rollout, not a wrong score), so the item's metadata never crosses the wire. A config value
naming a file (data_file) must be a plain file name of reasoning-gym's data folder.

Some generators' verifiers evaluate the model's answer as Python or with sympy (EVALUATES_ANSWER): a remote
worker loads them only with --allow-plugin reasoning-gym://NAME (the learner's own local workers are started
with it when the config names them).

The reward is the generator's own `score_answer` of the text inside the response's last
<answer>...</answer> (reasoning-gym's convention, which its system prompts ask for); 0 without one.
`correct` is a score of 1. `Score.info`: answered (an <answer> tag was found), verifier_error (the exception's
name, when the generator's verifier raised on the answer: scored 0, a malformed answer is data).

Offline: nothing is downloaded (the generators that read files read them from the installed package).
"""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from echo2sdk.adapters.scorers import tagged_answer
from echo2sdk.core import checks
from echo2sdk.core.contracts import Score, Task
from echo2sdk.errors import ConfigError, DependencyNotInstalled, NameNotFound

__all__ = ["ReasoningGymAdapter", "SCHEME", "EVALUATES_ANSWER", "evaluates_answer"]

SCHEME = "reasoning-gym"
#: Generators whose verifier (reasoning-gym 0.1.25's score_answer) runs the model's answer through Python's eval or
#: sympy's parse_expr (which evals it): code execution wherever it is scored. A rollout worker loads them only when
#: its operator allows it (echo2 worker --allow-plugin reasoning-gym://NAME; runtime/trust/plugin_policy.py);
#: composite can hold any generator. tests/adapters/test_tasks_people_have.py checks the list against the package.
EVALUATES_ANSWER = frozenset({
    "binary_matrix", "composite", "countdown", "intermediate_integration", "n_queens", "polynomial_multiplication",
    "puzzle24", "simple_integration", "spiral_matrix", "string_insertion",
})
_PATH_KEYS = ("file", "path", "dir")  # config keys whose values name files: only plain names of the package's own


def evaluates_answer(adapter: str) -> bool:
    """Whether `adapter` ("reasoning-gym://NAME") is a generator in EVALUATES_ANSWER."""
    scheme, _, name = adapter.partition("://")
    return scheme == SCHEME and name in EVALUATES_ANSWER


def _path_values(config: Any, where: str = "config") -> Iterator[tuple[str, str]]:
    """(key path, value) of every string under a file-naming key (data_file, ...) that is not a plain file name:
    reasoning-gym joins it onto its package folder, so a separator or '..' would read any file of the machine."""
    items = config.items() if isinstance(config, Mapping) else enumerate(config) if isinstance(config, list) else ()
    for key, value in items:
        here = f"{where}.{key}"
        if isinstance(value, (Mapping, list)):
            yield from _path_values(value, here)
        elif isinstance(value, str) and any(k in str(key).lower() for k in _PATH_KEYS) and (
                "/" in value or "\\" in value or value.startswith(".") or ":" in value):
            yield here, value


_CACHED = 8  # generators kept per adapter (one per chunk seed); a worker scores the chunks of a few steps


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise DependencyNotInstalled("reasoning-gym (reasoning-gym:// tasks)", "reasoning-gym") from None
    return reasoning_gym


class ReasoningGymAdapter:
    """env:           "reasoning-gym://NAME", NAME a registered reasoning-gym dataset (e.g. chain_sum, leg_counting)
    config:        the generator's configuration fields (its dataclass, e.g. {min_terms = 2}); `seed` and `size`
                   are this adapter's to set
    system_prompt: a name of reasoning-gym's SYSTEM_PROMPTS ("default", "simple", "direct", "DeepSeekZero",
                   "chain_of_draft") or the prompt itself
    fewshot:       0-8 worked examples shown before the question (the first items of the same generator under a
                   seed of their own, the same for every task, answered as <answer>ANSWER</answer>): small models
                   follow a shown format far better
    chunk_size:    items per seeded generator instance (reasoning-gym's `size`)
    """

    def __init__(
        self,
        env: str,
        config: Mapping[str, Any] | None = None,
        system_prompt: str = "default",
        fewshot: int = 0,
        chunk_size: int = 500,
    ):
        scheme, _, name = env.partition("://") if isinstance(env, str) else ("", "", "")
        if scheme != SCHEME or not name:
            raise ConfigError(f"env = {env!r}: expected 'reasoning-gym://NAME', e.g. 'reasoning-gym://chain_sum'")
        if config is None:
            config = {}
        if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
            raise ConfigError(f"reasoning-gym://{name}: config = {config!r}: expected a table of the generator's fields")
        for key in ("seed", "size"):
            if key in config:
                raise ConfigError(f"reasoning-gym://{name}: config.{key} is set by the adapter (tasks(seed), chunk_size)")
        for key, value in _path_values(config):
            raise ConfigError(f"reasoning-gym://{name}: {key} = {value!r}: a file of reasoning-gym's own data folder is "
                              "named by its plain file name (no folder, no '..')")
        if not isinstance(system_prompt, str) or not system_prompt.strip():
            raise ConfigError(f"reasoning-gym://{name}: system_prompt = {system_prompt!r}: expected a name or a prompt")
        checks.integer("fewshot", fewshot, lo=0, hi=8, error=ConfigError)
        checks.integer("chunk_size", chunk_size, lo=1, hi=1_000_000, error=ConfigError)
        rg = _reasoning_gym()
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS

        if name not in DATASETS:
            raise NameNotFound("reasoning-gym dataset", name, DATASETS)
        self.name, self.config, self.fewshot, self.chunk_size = name, dict(config), fewshot, chunk_size
        self.system_prompt = system_prompt
        if system_prompt not in SYSTEM_PROMPTS and not any(c.isspace() for c in system_prompt.strip()):
            raise NameNotFound("reasoning-gym system_prompt (a name; a prompt of your own is a sentence)",
                               system_prompt, SYSTEM_PROMPTS)
        self._system = SYSTEM_PROMPTS.get(system_prompt, system_prompt)
        self._rg = rg
        self._datasets: OrderedDict[int, Any] = OrderedDict()
        self._examples = self._worked_examples()  # builds one generator: bad config fails here, with its field

    # -- identity -------------------------------------------------------------------------------------------
    def spec(self) -> tuple[str, dict[str, Any]]:
        """(adapter name, options) that rebuild an equal adapter: `load_adapter(*adapter.spec())`."""
        return f"{SCHEME}://{self.name}", {"config": dict(self.config), "system_prompt": self.system_prompt,
                                           "fewshot": self.fewshot, "chunk_size": self.chunk_size}

    def __repr__(self) -> str:
        return f"ReasoningGymAdapter({self.name!r}, config={self.config!r}, fewshot={self.fewshot})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReasoningGymAdapter) and self.spec() == other.spec()

    # -- generators -----------------------------------------------------------------------------------------
    def _dataset(self, seed: int) -> Any:
        """The generator instance for a chunk seed (kept for the next few calls)."""
        if seed in self._datasets:
            self._datasets.move_to_end(seed)
            return self._datasets[seed]
        try:
            ds = self._rg.create_dataset(self.name, **self.config, seed=seed, size=self.chunk_size)
        except (TypeError, ValueError, AssertionError) as e:
            raise ConfigError(f"reasoning-gym://{self.name}: config = {self.config!r} is refused by the generator: "
                              f"{type(e).__name__}: {e}") from None
        self._datasets[seed] = ds
        if len(self._datasets) > _CACHED:
            self._datasets.popitem(last=False)
        return ds

    @staticmethod
    def chunk_seed(seed: int, chunk: int) -> int:
        """The generator seed of chunk `chunk` of tasks(seed): spread out (reasoning-gym seeds item i with
        seed + i, so neighbouring seeds would repeat items)."""
        return random.Random(f"reasoning-gym:{seed}:{chunk}").getrandbits(48)

    def _worked_examples(self) -> tuple[dict[str, str], ...]:
        ds = self._dataset(self.chunk_seed(-1, 0))
        turns: list[dict[str, str]] = []
        for i in range(self.fewshot):
            item = ds[i]
            turns += [{"role": "user", "content": item["question"]},
                      {"role": "assistant", "content": f"<answer>{item['answer']}</answer>"}]
        return tuple(turns)

    # -- the adapter ----------------------------------------------------------------------------------------
    def tasks(self, seed: int) -> Iterator[Task]:
        """Endless: chunk after chunk of seeded items. Task ids are f"{seed}-{chunk}-{index}"."""
        for chunk in itertools.count():
            ds_seed = self.chunk_seed(seed, chunk)
            ds = self._dataset(ds_seed)
            for index in range(self.chunk_size):
                item = ds[index]
                messages = ({"role": "system", "content": self._system}, *self._examples,
                            {"role": "user", "content": item["question"]})
                yield Task(id=f"{seed}-{chunk}-{index}", messages=messages, answer=str(item["answer"]),
                           info={"dataset": self.name, "dataset_seed": ds_seed, "index": index})

    def score(self, task: Task, response: str) -> Score:
        """The generator's verifier on the answer inside the last <answer> tag (0 without one)."""
        try:
            ds_seed, index = int(task.info["dataset_seed"]), int(task.info["index"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"task {task.id!r} was not made by reasoning-gym://{self.name}: info = {task.info!r}") from None
        answer = tagged_answer(response)
        if answer is None:
            return Score(reward=0.0, correct=False, info={"answered": False})
        ds = self._dataset(ds_seed)
        entry = ds[index]
        if str(entry["answer"]) != task.answer:  # another reasoning-gym version, or a generator not seeded alone
            raise ValueError(f"task {task.id!r}: reasoning-gym://{self.name} regenerated item {index} of seed {ds_seed} "
                             f"with answer {str(entry['answer'])[:80]!r}, not the task's {task.answer[:80]!r}")
        try:
            reward = float(ds.score_answer(answer, entry))
        except Exception as e:  # noqa: BLE001 - a verifier that chokes on a malformed answer scores it 0
            return Score(reward=0.0, correct=False, info={"answered": True, "verifier_error": type(e).__name__})
        return Score(reward=reward, correct=reward >= 1.0, info={"answered": True})
