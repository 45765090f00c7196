"""`echo2 eval --task`: accuracy and mean reward of policies on held-out single-turn tasks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from echo2sdk.adapters.evaluate import (
    HELD_OUT_SEED,
    Cell,
    differences,
    evaluate_tasks,
    format_table,
    held_out_tasks,
    paired_difference,
)
from echo2sdk.errors import ConfigError
from echo2sdk.testing import ToyAdapter


def test_accuracy_and_reward_are_the_share_of_correct_answers():
    """The mock backend always answers "alpha": accuracy is the share of held-out toy tasks asking for it."""
    tasks = held_out_tasks(ToyAdapter(), 40)
    expected = sum(t.answer == "alpha" for t in tasks) / 40
    assert 0 < expected < 1
    table = evaluate_tasks("toy", {"alpha": "mock"}, tasks=40, backend="mock", backend_options={"answer": "alpha"},
                           batch=7)
    row = table["alpha"]
    assert (row.tasks, row.accuracy, row.reward_mean) == (40, expected, expected)
    assert row.reward_ci95 > 0


def test_paired_difference_is_the_mean_of_per_item_differences_with_their_interval():
    d = paired_difference([1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 5.0, 4.0])  # differences 1, 0, 2, 0
    sd = (((1 - 0.75) ** 2 + 0.75**2 + (2 - 0.75) ** 2 + 0.75**2) / 3) ** 0.5
    assert (d.n, d.mean) == (4, 0.75) and d.ci95 == pytest.approx(1.96 * sd / 2)
    assert paired_difference([3.0, -7.0, 11.0], [3.0, -7.0, 11.0]).ci95 == 0.0
    with pytest.raises(ValueError, match="3 values against 2"):
        paired_difference([1.0, 2.0, 3.0], [1.0, 2.0])


def test_pairing_cancels_the_luck_two_rows_share():
    """Each hand's luck (+-20) is the same in both rows; the second row is 1 better on every hand: its own interval
    is about 20 wide, the paired one is 0, and the extra per-hand metric is paired the same way."""
    luck = [20.0 * (-1) ** i for i in range(50)]
    base = Cell(50, 0.0, 0.0, 0.0, luck, paired={"expected_chips": [x / 2 for x in luck]})
    better = Cell(50, 1.0, 0.0, 0.0, [x + 1 for x in luck], paired={"expected_chips": [x / 2 - 3 for x in luck]})
    diffs = differences({"base": {"station": base}, "trained": {"station": better}}, "chips")["trained"]
    assert (diffs["chips"]["station"].mean, diffs["chips"]["station"].ci95) == (1.0, 0.0)
    assert (diffs["expected_chips"]["station"].mean, diffs["expected_chips"]["station"].ci95) == (-3.0, 0.0)
    assert paired_difference([0.0] * 50, luck).ci95 > 5
    text = format_table({"base": {"station": base}, "trained": {"station": better}}, env="poker://x", hands=50, seed=0)
    assert "trained minus base, chips per hand, paired over the same hands (mean ± 95% CI): station +1.000 ± 0.000" in text
    assert "trained minus base, expected_chips per hand, paired over the same hands (mean ± 95% CI): station -3.000" in text


def test_differences_refuse_other_hands_and_pair_a_partly_recorded_value_where_both_have_it():
    base = Cell(3, 0.0, 0.0, 0.0, [1.0, 2.0, 3.0], ids=["a", "b", "c"], paired={"ev": [1.0, None, 5.0]})
    other = Cell(3, 0.0, 0.0, 0.0, [2.0, 2.0, 2.0], ids=["a", "b", "c"], paired={"ev": [2.0, 9.0, None]})
    diffs = differences({"base": {"x": base}, "trained": {"x": other}})["trained"]
    assert (diffs["ev"]["x"].n, diffs["ev"]["x"].mean) == (1, 1.0)  # only hand a holds both numbers
    text = format_table({"base": {"x": base}, "trained": {"x": other}}, env="e", hands=3, seed=0)
    assert "ev per hand, paired over the same hands (mean ± 95% CI): x +1.000 ± nan (the 1 of 3 hands both rows" in text
    shuffled = Cell(3, 0.0, 0.0, 0.0, [2.0, 2.0, 2.0], ids=["b", "a", "c"])
    with pytest.raises(ValueError, match="trained vs x played other hands than base"):
        differences({"base": {"x": base}, "trained": {"x": shuffled}})
    unrecorded = Cell(3, 0.0, 0.0, 0.0, [2.0, 2.0, 2.0], ids=["a", "b", "c"], paired={"ev": [None, None, None]})
    assert set(differences({"base": {"x": base}, "trained": {"x": unrecorded}})["trained"]) == {"chips"}


def test_json_gets_null_for_nan():
    from echo2sdk.adapters.evaluate import finite

    data = finite({"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf"), "e": "x"}})
    assert data == {"a": None, "b": [1.5, None], "c": {"d": None, "e": "x"}}
    assert json.loads(json.dumps(data, allow_nan=False)) == data


def test_held_out_tasks_are_not_the_training_stream():
    held = held_out_tasks(ToyAdapter(), 5, seed=2)
    assert all(t.id.startswith(f"t{HELD_OUT_SEED + 2}-") for t in held)  # ToyAdapter ids are prefix + seed
    with pytest.raises(ConfigError, match="tasks = 1 must be >= 2"):
        held_out_tasks(ToyAdapter(), 1)


def test_cli_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "eval.json"
    r = subprocess.run([sys.executable, "-m", "echo2sdk.cli", "eval", "--task", "toy", "--backend", "mock",
                        "--base", "mock", "--trained", "mock-2", "--tasks", "6", "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"toy: accuracy and mean reward over 6 held-out tasks (adapter.tasks({HELD_OUT_SEED} + 0))")
    assert [c.strip() for c in lines[1].split("|")[1:5]] == ["policy", "accuracy", "reward (mean ± 95% CI)", "failed"]
    assert lines[3].startswith("| base (mock) ") and lines[4].startswith("| trained (mock-2) ")
    data = json.loads(out.read_text())
    assert data["held_out_seed"] == HELD_OUT_SEED and data["tasks"] == 6
    assert data["table"]["base (mock)"] == {"tasks": 6, "accuracy": 0.0, "reward_mean": 0.0, "reward_ci95": 0.0,
                                            "failed": 0, "errors": [], "by_task": {}}
    assert lines[5] == "trained (mock-2) minus base (mock), reward paired over the same tasks (mean ± 95% CI): +0.000 ± 0.000"
    assert data["reward_differences_from_first_row"] == {"trained (mock-2)": {"n": 6, "mean": 0.0, "ci95": 0.0}}


def test_cli_refuses_task_and_env_together():
    r = subprocess.run([sys.executable, "-m", "echo2sdk.cli", "eval", "--task", "toy", "--env", "gym://FrozenLake-v1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "give --task or --env, not both" in r.stderr
    r = subprocess.run([sys.executable, "-m", "echo2sdk.cli", "eval", "--task", "toy", "--env-option", "free_fold=false"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--env-option is for --env sandboxes" in r.stderr


@pytest.mark.integration
def test_math_on_the_tiny_model_is_reproducible():
    """Base and "trained" are the same tiny-random folder: the same tasks and sampling seeds give the same row."""
    pytest.importorskip("torch")
    pytest.importorskip("echo2_math")
    from echo2sdk.weights import resolve_model

    folder = resolve_model("tiny-random")
    table = evaluate_tasks("math", {"base": "tiny-random", "trained": folder}, options={"difficulty": 1}, tasks=6,
                           max_new_tokens=6, batch=3)
    base, trained = table["base"], table["trained"]
    assert base.tasks == trained.tasks == 6
    assert base.rewards == trained.rewards and base.accuracy == trained.accuracy
    assert base.accuracy is not None and 0.0 <= base.accuracy <= 1.0  # math scores say whether each is correct


def flaky(response: str, answer: str):
    """A scorer (dataset:// "scorer" option) that raises on answers ending in 7 and scores NaN on those ending in 3."""
    from echo2sdk.core.contracts import Score

    if answer.endswith("7"):
        raise KeyError("no rule for " + answer)
    return Score(reward=float("nan") if answer.endswith("3") else float(response.strip() == answer))


def test_eval_counts_and_names_failed_tasks_instead_of_aborting(tmp_path):
    from echo2sdk.adapters.evaluate import format_task_table, task_scores_json

    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": f"say {i}", "answer": str(i)}) + "\n" for i in range(40)))
    table = evaluate_tasks(f"dataset://{path}", {"a": "mock"}, options={"scorer": "test_evaluate_tasks:flaky"}, tasks=40,
                           backend="mock", backend_options={"answer": "alpha"})
    row = table["a"]
    assert (row.tasks, row.failed) == (40, 8)  # 7, 17, 27, 37 raise; 3, 13, 23, 33 score NaN
    assert sum(r is None for r in row.rewards) == 8 and row.reward_mean == 0.0 and len(row.errors) == 5
    assert all(e.startswith("task '") and ("KeyError: 'no rule for" in e or "is not finite" in e) for e in row.errors)
    assert task_scores_json(row)["failed"] == 8
    text = format_task_table(table, task="dataset", tasks=40, seed=0)
    assert "| 8 of 40" in text and "a: 8 task(s) failed to score, left out of its means: task '" in text


def test_eval_of_a_mixture_has_a_row_per_component(tmp_path):
    from echo2sdk.adapters.evaluate import format_task_table

    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": "say alpha", "answer": "alpha"}) + "\n" for _ in range(3)))
    mix = [{"adapter": "toy", "weight": 1}, {"adapter": f"dataset://{path}", "weight": 1}]
    table = evaluate_tasks("mixture", {"a": "mock"}, options={"mix": mix}, tasks=60, backend="mock",
                           backend_options={"answer": "alpha"})
    parts = table["a"].by_task
    assert set(parts) == {"toy", "qa"} and parts["qa"].accuracy == 1.0 and parts["toy"].accuracy < 1.0
    assert parts["qa"].tasks + parts["toy"].tasks == 60
    assert "|   a: qa " in format_task_table(table, task="mixture", tasks=60, seed=0)
