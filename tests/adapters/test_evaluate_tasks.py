"""`echo2 eval --task`: accuracy and mean reward of policies on held-out single-turn tasks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from echo2sdk.adapters.evaluate import HELD_OUT_SEED, evaluate_tasks, held_out_tasks
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
    assert [c.strip() for c in lines[1].split("|")[1:4]] == ["policy", "accuracy", "reward (mean ± 95% CI)"]
    assert lines[3].startswith("| base (mock) ") and lines[4].startswith("| trained (mock-2) ")
    data = json.loads(out.read_text())
    assert data["held_out_seed"] == HELD_OUT_SEED and data["tasks"] == 6
    assert data["table"]["base (mock)"] == {"tasks": 6, "accuracy": 0.0, "reward_mean": 0.0, "reward_ci95": 0.0}


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
