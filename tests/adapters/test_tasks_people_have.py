"""Issue 33: tasks people already have, one line of config away: reasoning-gym://NAME, dataset://PATH with a
choice of scorer, and the conformance suite that a task author runs on them (check_adapter, check-adapter)."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import pytest

from echo2sdk.core.contracts import Score, Task
from echo2sdk.errors import AdapterError, ConfigError, NameNotFound
from echo2sdk.plugins import load_adapter
from echo2sdk.testing import MockBackend, check_adapter

reasoning_gym = pytest.importorskip("reasoning_gym", reason='reasoning-gym is not installed (pip install -e ".[reasoning-gym]")')

EASY = {
    "chain_sum": {"min_terms": 2, "max_terms": 2, "max_digits": 1},
    "leg_counting": {"min_animals": 1, "max_animals": 2},
    "letter_counting": {"min_words": 3, "max_words": 5},
    "gcd": {"min_numbers": 2, "max_numbers": 2, "max_value": 50},
    "spell_backward": {},
}


# -- reasoning-gym:// -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(EASY))
def test_check_adapter_passes_for_reasoning_gym_tasks(name):
    adapter = load_adapter(f"reasoning-gym://{name}", {"config": EASY[name], "fewshot": 1})
    report = check_adapter(adapter)
    assert report["tasks_checked"] == 100 and report["episodic"] is False
    assert report["scored"] >= 100 * 4  # each task: its answer as given, boxed, tagged, and a malformed reply
    first = next(adapter.tasks(0))
    assert adapter.score(first, f"<answer>{first.answer}</answer>") == Score(1.0, True, {"answered": True})
    assert adapter.score(first, first.answer).reward == 0.0  # no <answer> tag: reasoning-gym's format is the task


def test_reasoning_gym_through_the_worker_rollout_path():
    report = check_adapter(load_adapter("reasoning-gym://chain_sum", {"config": EASY["chain_sum"]}),
                           backend=MockBackend(), n=2, groups=2, tasks=10)
    assert report["records"] == 4 and all(r == 0.0 for r in report["rewards"])  # random bytes answer nothing


def test_reasoning_gym_streams_are_seeded_endless_and_never_repeat_an_item():
    adapter = load_adapter("reasoning-gym://chain_sum", {"config": EASY["chain_sum"], "chunk_size": 5})
    a = list(itertools.islice(adapter.tasks(0), 12))
    assert [t.id for t in a][:6] == ["0-0-0", "0-0-1", "0-0-2", "0-0-3", "0-0-4", "0-1-0"]
    assert a == list(itertools.islice(adapter.tasks(0), 12))
    b = list(itertools.islice(adapter.tasks(1), 12))
    assert [t.info["dataset_seed"] for t in a] != [t.info["dataset_seed"] for t in b]
    seeds = {t.info["dataset_seed"] for t in a}
    assert len(seeds) == 3 and min(abs(x - y) for x in seeds for y in seeds if x != y) > 1000  # items seed + index
    # a worker rebuilds the item from (dataset seed, index): a fresh adapter scores what the learner's made
    fresh = load_adapter(*adapter.spec())
    assert all(fresh.score(t, f"<answer>{t.answer}</answer>").correct for t in a)


def test_reasoning_gym_errors_name_the_field_and_the_value():
    with pytest.raises(NameNotFound, match="chain_sum"):
        load_adapter("reasoning-gym://chain_summ")
    with pytest.raises(ConfigError, match="max_terms"):
        load_adapter("reasoning-gym://chain_sum", {"config": {"max_terms": 0}})
    with pytest.raises(ConfigError, match="no_such_field"):
        load_adapter("reasoning-gym://chain_sum", {"config": {"no_such_field": 1}})
    with pytest.raises(ConfigError, match="config.seed is set by the adapter"):
        load_adapter("reasoning-gym://chain_sum", {"config": {"seed": 3}})
    with pytest.raises(ConfigError, match="fewshot"):
        load_adapter("reasoning-gym://chain_sum", {"fewshot": -1})


# -- dataset:// -----------------------------------------------------------------------------------------------
ROWS = [
    {"question": "What is 2 + 3?", "answer": "Two and three make five.\n#### 5", "level": 1, "subject": "add"},
    {"question": "What is 7 * 6?", "answer": "\\boxed{42}", "level": 2, "subject": "mul"},
    {"question": "Capital of France?", "answer": "Paris", "level": 1, "subject": "geo"},
]


def _jsonl(path, rows=ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_dataset_jsonl_rows_become_tasks_with_final_answers_and_info_columns(tmp_path):
    path = _jsonl(tmp_path / "qa.jsonl")
    adapter = load_adapter(f"dataset://{path}", {"info": ["level", "subject"], "system_prompt": "Be brief."})
    tasks = list(itertools.islice(adapter.tasks(0), 6))
    assert {t.answer for t in tasks[:3]} == {"5", "42", "Paris"}  # worked solutions keep their final answer
    assert {t.id for t in tasks[:3]} == {"0@0", "1@0", "2@0"} and {t.id for t in tasks[3:]} == {"0@1", "1@1", "2@1"}
    by_row = {t.info["row"]: t for t in tasks[:3]}
    assert by_row[1].info == {"row": 1, "level": 2, "subject": "mul", "epoch": 0}
    assert by_row[0].messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"})
    assert adapter.score(by_row[1], "so \\boxed{42}").correct
    assert adapter.score(by_row[2], "<answer>paris.</answer>").correct  # exact, normalised
    assert not adapter.score(by_row[2], "London").correct
    assert check_adapter(adapter)["tasks_checked"] == 100


def test_dataset_parquet_and_a_datasets_folder_with_a_split(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "qa.parquet")
    adapter = load_adapter(f"dataset://{tmp_path / 'qa.parquet'}", {"shuffle": False})
    assert [t.answer for t in itertools.islice(adapter.tasks(0), 3)] == ["5", "42", "Paris"]
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}) \
        .save_to_disk(str(folder))
    test = load_adapter(f"dataset://{folder}", {"split": "test"})
    assert [t.answer for t in itertools.islice(test.tasks(0), 2)] == ["5", "5"]
    with pytest.raises(ConfigError, match=r"split = 'dev'; the folder holds \['test', 'train'\]"):
        next(load_adapter(f"dataset://{folder}", {"split": "dev"}).tasks(0))


def test_dataset_column_mapping_template_messages_and_ids(tmp_path):
    rows = [{"q": "2+2", "gold": 4, "uid": "a"}, {"q": "3+3", "gold": 6, "uid": "b"}]
    path = _jsonl(tmp_path / "m.jsonl", rows)
    adapter = load_adapter(f"dataset://{path}", {"question": "q", "answer": "gold", "id": "uid",
                                                  "template": "Compute {q}. Reply in \\boxed{{}}.", "shuffle": False})
    t = next(adapter.tasks(0))
    assert t.id == "a@0" and t.answer == "4" and t.messages[-1]["content"] == "Compute 2+2. Reply in \\boxed{}."
    chats = _jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "hi"}], "answer": "hello"}])
    assert next(load_adapter(f"dataset://{chats}", {"question": "messages"}).tasks(0)).messages == (
        {"role": "user", "content": "hi"},)
    with pytest.raises(AdapterError, match=r"no column 'prompt' \(question = 'prompt'\); columns: \['gold', 'q', 'uid'\]"):
        next(load_adapter(f"dataset://{path}", {"question": "prompt"}).tasks(0))
    with pytest.raises(AdapterError, match="no question column; name one with"):
        next(load_adapter(f"dataset://{path}").tasks(0))
    twice = _jsonl(tmp_path / "twice.jsonl", [{"q": "x", "gold": 1, "uid": "a"}, {"q": "y", "gold": 2, "uid": "a"}])
    with pytest.raises(AdapterError, match="id column 'uid' repeats 'a'"):
        next(load_adapter(f"dataset://{twice}", {"question": "q", "answer": "gold", "id": "uid"}).tasks(0))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x", "answer": "1"}\n{not json\n')
    with pytest.raises(AdapterError, match=r"bad.jsonl:2: invalid JSON"):
        next(load_adapter(f"dataset://{bad}").tasks(0))


def test_a_worker_scores_from_the_task_and_never_reads_the_file():
    adapter = load_adapter("dataset://no/such/file.jsonl", {"scorer": "contains"})  # what a worker builds
    task = Task(id="0@0", messages=({"role": "user", "content": "?"},), answer="blue")
    assert adapter.score(task, "<answer>deep blue sea</answer>").correct
    with pytest.raises(AdapterError, match="does not exist"):
        next(adapter.tasks(0))  # the learner side reads it


def test_dataset_scorers_by_name_registered_and_referenced(tmp_path):
    pytest.importorskip("echo2_math")
    path = _jsonl(tmp_path / "qa.jsonl", [{"question": "Half of 1?", "answer": "\\frac{1}{2}"}])
    math_ = load_adapter(f"dataset://{path}", {"scorer": "math"})  # registered by echo2-math (math-verify)
    task = next(math_.tasks(0))
    assert math_.score(task, "\\boxed{0.5}").correct and not math_.score(task, "\\boxed{2}").correct
    ref = load_adapter(f"dataset://{path}", {"scorer": "echo2sdk.adapters.scorers:exact"})
    assert ref.score(task, "<answer>\\frac{1}{2}</answer>").correct
    with pytest.raises(NameNotFound, match="Did you mean 'exact'"):
        load_adapter(f"dataset://{path}", {"scorer": "exakt"})
    assert check_adapter(math_, tasks=5)["tasks_checked"] == 5  # a finite stream's tasks cycle


# -- check_adapter: failures on a few tasks, named ------------------------------------------------------------
class _OneIn20:
    """A single-turn task whose score fails on tasks 7, 27, 47, ...: raising, or a NaN reward."""

    def __init__(self, how: str = "raise"):
        self.how = how

    def tasks(self, seed):
        for i in itertools.count():
            yield Task(id=f"t{i}", messages=({"role": "user", "content": f"say {i}"},), answer=str(i),
                       info={"kind": "bad" if i % 20 == 7 else "good"})

    def score(self, task, response):
        if task.info["kind"] == "bad":
            if self.how == "raise":
                return {"a": 1}["missing"]
            return Score(reward=math.nan)
        return Score(reward=float(response.strip() == task.answer))

    def __repr__(self):
        return f"_OneIn20({self.how!r})"


def test_check_adapter_catches_a_failure_on_one_task_in_20_and_names_the_task():
    assert check_adapter(_OneIn20(), tasks=2)["tasks_checked"] == 2  # the old default (2 tasks) passed it
    with pytest.raises(AdapterError, match=r"check_adapter\(_OneIn20\('raise'\)\): score: task 't7' \(task 8 of 100 "
                                           r"drawn\): score\(\) raised KeyError: 'missing' on the response '7'"):
        check_adapter(_OneIn20())
    with pytest.raises(AdapterError, match=r"task 't7' \(task 8 of 100 drawn\): score\(\) gave .*nan.* finite"):
        check_adapter(_OneIn20("nan"))


class _BrokenStream:
    def tasks(self, seed):
        for i in range(5):
            yield Task(id=f"t{i}", messages=({"role": "user", "content": "x"},))
        raise RuntimeError("row 5 is corrupt")

    def score(self, task, response):
        return Score(0.0)


def test_check_adapter_names_where_the_task_stream_broke():
    with pytest.raises(AdapterError, match=r"tasks: tasks\(0\) raised RuntimeError: row 5 is corrupt after 5 task\(s\)"):
        check_adapter(_BrokenStream())


def test_check_adapter_command_prints_the_report_and_fails_with_exit_1(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "echo2sdk.testing", "check-adapter", "reasoning-gym://chain_sum",
                         "--option", json.dumps({"max_terms": 2}, separators=(",", ":")).join(["config=", ""]),
                         "--tasks", "20", "--backend", "mock"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    line = json.loads(ok.stdout.strip().splitlines()[-1])
    assert line["check"] == "pass" and line["tasks_checked"] == 20 and line["records"] == 4
    bad = subprocess.run([sys.executable, "-m", "echo2sdk.testing", "check-adapter", f"dataset://{tmp_path}/none.jsonl"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    line = json.loads(bad.stdout.strip().splitlines()[-1])
    assert line["check"] == "fail" and "none.jsonl' does not exist" in line["error"]


def test_the_reasoning_gym_mixture_example_loads_and_passes_check_adapter():
    from pathlib import Path

    from echo2sdk.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "reasoning_gym_mix.toml")
    adapter = load_adapter(cfg.task.adapter, cfg.task.options)
    assert adapter.names == ["basic_arithmetic", "leg_counting", "products"] and adapter.weights == [2.0, 1.0, 1.0]
    assert check_adapter(adapter, backend=MockBackend(), tasks=60)["tasks_checked"] == 60
