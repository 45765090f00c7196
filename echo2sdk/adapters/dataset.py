"""dataset://PATH: questions and reference answers from a local file or folder, scored by a chosen scorer.

    [task]
    adapter = "dataset://data/gsm8k_train.parquet"
    options = { question = "question", answer = "answer", scorer = "math", system_prompt = "Put the answer in \\\\boxed{}." }

PATH (relative to the learner's working directory, or absolute as dataset:///abs/path) is a JSONL file
(one JSON object a line), a Parquet file (.parquet, .pq; needs pyarrow), or a folder written by
`datasets`' `save_to_disk` (a Dataset, or a DatasetDict with `split` naming the part). Nothing is
downloaded: a hub name is not a path.

Columns: `question` (default: the first of problem, question, prompt, query, input) is the user message,
or `template` formats the row: its placeholders are the row's own column names (`"{q}\\n\\nOptions: {choices}"`;
the `question` column must exist all the same); a `messages` column holding a chat
list is used as it is when `question = "messages"`. `answer` (default: the first of answer, final_answer,
expected_answer, ground_truth, target, solution, output) is the reference; a worked solution keeps its
final answer (after the last "####", or the last \\boxed{}). `id` names a column of task ids (default:
the row number). `info` lists columns carried in Task.info (e.g. a difficulty or a subject): numeric ones
become per-task metrics, the others are shown in the samples table.

The rows are read when `tasks()` is first called, on the learner: a worker only scores, from the task's
answer, and never needs the file. `scorer` is `exact`, `contains`, a scorer registered in
`echo2sdk.scorers` (`math`, from echo2-math) or "pkg.mod:function" (echo2sdk.adapters.scorers), with
`scorer_options` as its keyword options. The stream cycles the rows with a fresh seeded shuffle each epoch
(`shuffle = false`: file order).
"""

from __future__ import annotations

import inspect
import itertools
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from echo2sdk.adapters.scorers import last_box, load_scorer
from echo2sdk.core.contracts import Score, Task
from echo2sdk.errors import AdapterError, ConfigError, DependencyNotInstalled

__all__ = ["DatasetAdapter", "SCHEME", "read_rows", "jsonl_records", "QUESTION_COLUMNS", "ANSWER_COLUMNS"]

SCHEME = "dataset"
QUESTION_COLUMNS = ("problem", "question", "prompt", "query", "input")
ANSWER_COLUMNS = ("answer", "final_answer", "expected_answer", "ground_truth", "target", "solution", "output")
PARQUET_SUFFIXES = (".parquet", ".pq")


# -- reading ---------------------------------------------------------------------------------------------
def jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number from 1, object) for every non-blank line of a JSONL file; AdapterError naming the file and
    the line for one that is not a JSON object."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise AdapterError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise AdapterError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [row for _, row in jsonl_records(path)]


def _parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DependencyNotInstalled("pyarrow (Parquet files)", "parquet") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow's errors name the problem; this names the file
        raise AdapterError(f"{path}: cannot read as Parquet ({type(e).__name__}: {e})") from None


def _saved(path: Path, split: str | None) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise DependencyNotInstalled("datasets (a folder written by save_to_disk)", "bridges") from None
    try:
        data = datasets.load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001
        raise AdapterError(f"{path}: cannot read as a `datasets` folder ({type(e).__name__}: {e})") from None
    if isinstance(data, datasets.DatasetDict):
        if split is None and len(data) == 1:
            split = next(iter(data))
        if split not in data:
            raise ConfigError(f"dataset://{path}: split = {split!r}; the folder holds {sorted(data)}")
        data = data[split]
    elif split is not None:
        raise ConfigError(f"dataset://{path}: split = {split!r}, but the folder holds one Dataset (no splits)")
    return data.to_list()


def read_rows(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """The rows of a JSONL or Parquet file or a `datasets` folder, as dicts, in order."""
    path = Path(path)
    if path.is_dir():
        rows = _saved(path, split)
    elif not path.is_file():
        raise AdapterError(f"dataset file {str(path)!r} does not exist (relative paths start at {Path.cwd()})")
    elif split is not None:
        raise ConfigError(f"dataset://{path}: split = {split!r} applies to a `datasets` folder, not a file")
    else:
        rows = _parquet(path) if path.suffix.lower() in PARQUET_SUFFIXES else _jsonl(path)
    if not rows:
        raise AdapterError(f"dataset {str(path)!r} holds no rows")
    return rows


def final_answer(text: str) -> str:
    """The final answer inside a worked solution ("... #### 72", "... \\boxed{72}"), else `text`, stripped."""
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    box = last_box(text)
    return (box if box is not None else text).strip()


# -- the adapter -----------------------------------------------------------------------------------------
def _column(option: str, value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{option} = {value!r}: expected a column name")
    return value


class DatasetAdapter:
    """See the module docstring for every option."""

    def __init__(
        self,
        env: str,
        question: str | None = None,
        answer: str | None = None,
        id: str | None = None,  # noqa: A002 - the column's option name, as users write it
        template: str | None = None,
        system_prompt: str | None = None,
        info: Sequence[str] = (),
        scorer: str = "exact",
        scorer_options: Mapping[str, Any] | None = None,
        split: str | None = None,
        shuffle: bool = True,
    ):
        scheme, _, path = env.partition("://") if isinstance(env, str) else ("", "", "")
        if scheme != SCHEME or not path:
            raise ConfigError(f"env = {env!r}: expected 'dataset://PATH', e.g. 'dataset://data/train.jsonl'")
        self.path = path
        self.question, self.answer, self.id = _column("question", question), _column("answer", answer), _column("id", id)
        if template is not None and (not isinstance(template, str) or "{" not in template):
            raise ConfigError(f"template = {template!r}: expected a format string of the row's columns, e.g. '{{question}}'")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ConfigError(f"system_prompt = {system_prompt!r}: expected a string")
        if isinstance(info, str) or not all(isinstance(c, str) and c for c in info):
            raise ConfigError(f"info = {info!r}: expected a list of column names")
        if scorer_options is None:
            scorer_options = {}
        if not isinstance(scorer_options, Mapping):
            raise ConfigError(f"scorer_options = {scorer_options!r}: expected a table of the scorer's options")
        if split is not None and not isinstance(split, str):
            raise ConfigError(f"split = {split!r}: expected a split name, e.g. 'train'")
        if not isinstance(shuffle, bool):
            raise ConfigError(f"shuffle = {shuffle!r}: expected true or false")
        self.template, self.system_prompt, self.info = template, system_prompt, list(info)
        self.scorer_name, self.scorer_options, self.split, self.shuffle = scorer, dict(scorer_options), split, shuffle
        self._scorer = load_scorer(scorer)
        try:  # the options a scorer takes, checked now rather than failing every rollout
            inspect.signature(self._scorer).bind("", "", **self.scorer_options)
        except TypeError as e:
            raise ConfigError(f"scorer_options = {self.scorer_options!r} do not fit scorer {scorer!r}: {e}") from None
        except ValueError:
            pass  # a callable without an inspectable signature (a C function): its first call tells
        self._tasks: list[tuple[str, tuple[dict[str, str], ...], str, dict[str, Any]]] | None = None

    def spec(self) -> tuple[str, dict[str, Any]]:
        """(adapter name, options) that rebuild an equal adapter: `load_adapter(*adapter.spec())`."""
        return f"{SCHEME}://{self.path}", {
            "question": self.question, "answer": self.answer, "id": self.id, "template": self.template,
            "system_prompt": self.system_prompt, "info": list(self.info), "scorer": self.scorer_name,
            "scorer_options": dict(self.scorer_options), "split": self.split, "shuffle": self.shuffle,
        }

    def __repr__(self) -> str:
        return f"DatasetAdapter({self.path!r}, scorer={self.scorer_name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatasetAdapter) and self.spec() == other.spec()

    # -- rows -> tasks ---------------------------------------------------------------------------------------
    def _pick(self, row: Mapping[str, Any], chosen: str | None, names: tuple[str, ...], kind: str, where: str) -> str:
        if chosen is not None:
            if chosen not in row:
                raise AdapterError(f"{where}: no column {chosen!r} ({kind} = {chosen!r}); columns: {sorted(row)}")
            return chosen
        lowered = {str(k).lower(): k for k in row}
        for name in names:
            if name in lowered:
                return lowered[name]
        raise AdapterError(f"{where}: no {kind} column; name one with  {kind} = \"COLUMN\"  (looked for "
                           f"{', '.join(names)}; columns: {sorted(row)})")

    def _messages(self, row: Mapping[str, Any], column: str, where: str) -> tuple[dict[str, str], ...]:
        value = row[column]
        if column == "messages" or isinstance(value, list):
            if not isinstance(value, list) or not value or not all(
                isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in value
            ):
                raise AdapterError(f"{where}: column {column!r} must hold a chat list of {{role, content}}, got {value!r:.80}")
            messages = tuple({"role": m["role"], "content": m["content"]} for m in value)
        else:
            if self.template is not None:
                try:
                    value = self.template.format_map(row)
                except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
                    raise AdapterError(f"{where}: template = {self.template!r} cannot be filled: {type(e).__name__}: {e}") from None
            if not isinstance(value, str) or not value.strip():
                raise AdapterError(f"{where}: column {column!r} must be a non-empty string, got {value!r:.80}")
            messages = ({"role": "user", "content": value.strip()},)
        if self.system_prompt is not None and messages[0]["role"] != "system":
            messages = ({"role": "system", "content": self.system_prompt}, *messages)
        return messages

    def _task(self, k: int, row: Mapping[str, Any]) -> tuple[str, tuple[dict[str, str], ...], str, dict[str, Any]]:
        where = f"dataset://{self.path} row {k} (from 0)"
        q = self._pick(row, self.question, QUESTION_COLUMNS, "question", where)
        a = self._pick(row, self.answer, ANSWER_COLUMNS, "answer", where)
        answer = row[a]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise AdapterError(f"{where}: column {a!r} must hold a string or a number, got {answer!r:.80}")
        answer = final_answer(str(answer))
        if not answer:
            raise AdapterError(f"{where}: column {a!r} is empty")
        task_id = str(row[self._pick(row, self.id, (), "id", where)]) if self.id is not None else str(k)
        info = {"row": k}
        for c in self.info:
            if c not in row:
                raise AdapterError(f"{where}: no column {c!r} (info = {self.info!r}); columns: {sorted(row)}")
            v = row[c]
            info[c] = v if isinstance(v, (str, int, float, bool)) or v is None else str(v)
        return task_id, self._messages(row, q, where), answer, info

    def _rows(self) -> list[tuple[str, tuple[dict[str, str], ...], str, dict[str, Any]]]:
        if self._tasks is None:
            tasks = [self._task(k, row) for k, row in enumerate(read_rows(self.path, self.split))]
            ids = [t[0] for t in tasks]
            if len(set(ids)) != len(ids):
                seen: set[str] = set()
                twice = next(i for i in ids if i in seen or seen.add(i))
                raise AdapterError(f"dataset://{self.path}: id column {self.id!r} repeats {twice!r}")
            self._tasks = tasks
        return self._tasks

    def tasks(self, seed: int) -> Iterator[Task]:
        """Every row once an epoch (a seeded shuffle each, unless shuffle = false), endlessly. Task ids are
        f"{row id}@{epoch}" (the rows' own ids stay readable in the samples table)."""
        rows = self._rows()
        rng = random.Random(seed)
        for epoch in itertools.count():
            order = list(range(len(rows)))
            if self.shuffle:
                rng.shuffle(order)
            for k in order:
                task_id, messages, answer, info = rows[k]
                yield Task(id=f"{task_id}@{epoch}", messages=messages, answer=answer, info=dict(info, epoch=epoch))

    def score(self, task: Task, response: str) -> Score:
        """The scorer on the response and the task's reference answer (the file is not read here)."""
        score = self._scorer(response, task.answer, **self.scorer_options)
        if isinstance(score, Score):
            return score
        if isinstance(score, bool):
            return Score(reward=float(score), correct=score)
        return Score(reward=score)  # a number; the worker checks it is finite
