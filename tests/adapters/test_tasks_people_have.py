"""Issue 33: tasks people already have, one line of config away: reasoning-gym://NAME, dataset://PATH with a
choice of scorer, and the conformance suite that a task author runs on them (check_adapter, check-adapter)."""

from __future__ import annotations

import itertools
import json
import math
import os
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


# -- what a coordinator's task options may make a worker do (an attacker-minded review) -------------------------
def test_the_generators_whose_verifier_evaluates_answers_are_all_listed():
    """reasoning-gym verifiers that eval the model's answer (or hand it to sympy's parse_expr, which evals): each is
    in EVALUATES_ANSWER, so a worker takes it only with --allow-plugin. number_sorting evals its own answer only."""
    import inspect
    import re

    from reasoning_gym.factory import DATASETS

    from echo2sdk.adapters.reasoning_gym import EVALUATES_ANSWER

    found = set()
    for name, (cls, _) in DATASETS.items():
        src = inspect.getsource(cls.score_answer) if "score_answer" in vars(cls) else ""
        if re.search(r"\beval\(|\bexec\(|parse_expr|sympify", src) and name != "number_sorting":
            found.add(name)
    assert found and found <= EVALUATES_ANSWER, found - EVALUATES_ANSWER
    assert EVALUATES_ANSWER <= set(DATASETS)


def test_a_worker_takes_an_answer_evaluating_generator_only_when_allowed():
    from echo2sdk.runtime.protocol.messages import WorkerConfig
    from echo2sdk.runtime.trust.plugin_policy import allowances, check_plugins

    cfg = WorkerConfig.from_mapping({"adapter": "reasoning-gym://countdown", "backend": "mock"})
    with pytest.raises(ConfigError, match="evaluating them as Python.*--allow-plugin reasoning-gym://countdown"):
        check_plugins(cfg)
    check_plugins(cfg, ["reasoning-gym://countdown"])
    assert allowances(cfg) == ["reasoning-gym://countdown"]  # the run's own local workers are started with it
    check_plugins(WorkerConfig.from_mapping({"adapter": "reasoning-gym://chain_sum", "backend": "mock"}))
    mixed = WorkerConfig.from_mapping({"adapter": "mixture", "backend": "mock", "adapter_options": {
        "mix": [{"adapter": "toy"}, {"adapter": "reasoning-gym://puzzle24"}]}})
    with pytest.raises(ConfigError, match="reasoning-gym://puzzle24"):
        check_plugins(mixed)


def test_a_file_naming_config_value_must_be_a_plain_name_of_the_package_data():
    for value in ("/etc/passwd", "../../x.txt", "sub/words.txt", "C:\\x"):
        with pytest.raises(ConfigError, match=r"config.data_file = .*plain file name"):
            load_adapter("reasoning-gym://spell_backward", {"config": {"data_file": value}})
    with pytest.raises(ConfigError, match=r"config.datasets.0.config.data_file"):
        load_adapter("reasoning-gym://composite", {"config": {"datasets": [{"config": {"data_file": "/etc/x"}}]}})
    assert next(load_adapter("reasoning-gym://spell_backward", {"config": {"data_file": "words3to10.txt"}}).tasks(0))


def test_an_item_regenerated_with_another_answer_is_a_failure_not_a_wrong_score():
    adapter = load_adapter("reasoning-gym://chain_sum", {"config": EASY["chain_sum"]})
    task = next(adapter.tasks(0))
    forged = Task(id=task.id, messages=task.messages, answer=task.answer + "1", info=task.info)
    with pytest.raises(ValueError, match="regenerated item 0 of seed .* not the task's"):
        adapter.score(forged, "<answer>1</answer>")


def test_scorer_options_are_checked_when_the_adapter_is_built(tmp_path):
    with pytest.raises(ConfigError, match=r"scorer_options = \{'tolerance': 0.1\} do not fit scorer 'exact'"):
        load_adapter(f"dataset://{tmp_path}/qa.jsonl", {"scorer_options": {"tolerance": 0.1}})


def test_import_reference_imports_nothing_that_is_not_a_reference():
    from echo2sdk.plugins import import_reference

    for ref in ("json:", "json:a-b", "os.path :join", "json"):
        with pytest.raises(ImportError, match="is not a 'package.module:attribute' reference"):
            import_reference(ref)
    assert import_reference("json:dumps") is json.dumps


def zero(response: str, answer: str):
    """A scorer that never rewards: what a wrong scorer for a task looks like to check-adapter."""
    return Score(reward=0.0, correct=False)


def test_check_adapter_command_takes_a_config_and_flags_a_task_whose_own_answers_score_zero(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    ok = subprocess.run([sys.executable, "-m", "echo2sdk.testing", "check-adapter", "--config",
                         str(root / "examples" / "reasoning_gym_mix.toml"), "--tasks", "30"],
                        capture_output=True, text=True, timeout=120)
    line = json.loads(ok.stdout.strip().splitlines()[-1])
    assert ok.returncode == 0 and line["adapter"] == "mixture" and line["reference_reward_mean"] == 1.0, ok.stderr
    path = tmp_path / "qa.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    flat = subprocess.run([sys.executable, "-m", "echo2sdk.testing", "check-adapter", f"dataset://{path}", "--option",
                           "scorer=test_tasks_people_have:zero", "--tasks", "5"], capture_output=True, text=True,
                          timeout=120, env=env)
    line = json.loads(flat.stdout.strip().splitlines()[-1])
    assert line["check"] == "pass" and line["reference_reward_mean"] == 0.0 and "scores 0" in line["warning"]


def test_typos_in_a_scheme_or_a_prompt_name_get_suggestions():
    with pytest.raises(NameNotFound, match=r"unknown URL scheme .*'reasoning_gym'.*Did you mean 'reasoning-gym'"):
        load_adapter("reasoning_gym://chain_sum")
    with pytest.raises(NameNotFound, match=r"system_prompt .*'Direct'.*Did you mean 'direct'"):
        load_adapter("reasoning-gym://chain_sum", {"system_prompt": "Direct"})
    assert load_adapter("reasoning-gym://chain_sum", {"system_prompt": "Answer in <answer> tags."})
