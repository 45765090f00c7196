"""check_adapter, the public conformance suite: it passes for math and catches broken adapters;
the config-level task switch; `echo2 eval`'s Table 4 layout; cheap imports."""

from __future__ import annotations

import itertools
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from echo2sdk.config import load_config
from echo2sdk.core.contracts import Score, Task
from echo2sdk.errors import AdapterError
from echo2sdk.testing import check_adapter

ROOT = Path(__file__).resolve().parents[2]


def test_math_conformance_with_a_real_model():
    pytest.importorskip("torch")
    echo2_math = pytest.importorskip("echo2_math")
    from echo2sdk.backends.hf import HFBackend
    from echo2sdk.weights import resolve_model

    with HFBackend(resolve_model("tiny-random")) as backend:
        report = check_adapter(echo2_math.MathAdapter(), backend=backend, n=2, groups=2)
    assert report["records"] == 4 and not report["episodic"]


class _Drifting:
    """tasks() is not deterministic for a seed."""

    def __init__(self):
        self.calls = itertools.count()

    def tasks(self, seed):
        k = next(self.calls)
        return (Task(id=f"{seed}-{k}-{i}", messages=({"role": "user", "content": "q"},)) for i in itertools.count())

    def score(self, task, response):
        return Score(reward=0.0)


class _Fragile(_Drifting):
    def tasks(self, seed):
        return (Task(id=f"{seed}-{i}", messages=({"role": "user", "content": "q"},)) for i in itertools.count())

    def score(self, task, response):
        return Score(reward=float(len(response.split()[0])))  # IndexError on an empty reply


def test_check_adapter_names_the_failed_check():
    with pytest.raises(AdapterError, match=r"tasks: tasks\(0\) is not deterministic"):
        check_adapter(_Drifting())
    with pytest.raises(AdapterError, match=r"score: task '0-0' \(task 1 of 100 drawn\): score\(\) raised IndexError.*on the response ''"):
        check_adapter(_Fragile())


def test_poker_config_differs_from_math_in_the_task_lines_and_the_math_recipe(example_diff):
    # the math example also tunes its recipe for the demo (docs/recipes.md, "The main job"), 4 prompts a request too
    assert example_diff("poker") == ["adapter", "options", "tasks_per_request", "temperature", "steps", "lr"]
    poker_cfg = tomllib.loads((ROOT / "examples/poker.toml").read_text())
    assert poker_cfg["task"]["adapter"] == "poker://nlhe_headsup_v1"
    # each writes its own folder: runs/<file stem>
    assert load_config(ROOT / "examples/poker.toml").run.out == "runs/poker"
    assert load_config(ROOT / "examples/math_smollm2.toml").run.out == "runs/math_smollm2"


def test_eval_prints_table4_layout_and_pairs_the_hands():
    pytest.importorskip("torch")
    pytest.importorskip("echo2_poker")
    from echo2sdk.weights import resolve_model

    tiny = resolve_model("tiny-random")
    cmd = [sys.executable, "-m", "echo2sdk.cli", "eval", "--base", tiny, "--trained", tiny, "--hands", "6",
           "--opponents", "calling_station,tight_aggressive,loose_aggressive,llm", "--max-new-tokens", "4",
           "--env-option", "free_fold=false"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert "over 6 held-out hands (adapter.tasks(1000003 + 0))" in lines[0]
    head = lines[1]
    for col in ("Rule-based1 (calling_station)", "Rule-based2 (tight_aggressive)", "Rule-based3 (loose_aggressive)", "LLM opponent"):
        assert col in head
    base, trained = lines[3], lines[4]
    assert base.startswith("| base") and trained.startswith("| trained") and "±" in base
    assert base.split("|")[2:] == trained.split("|")[2:]  # the same policy on the same seeded hands: the same numbers
    stats = [line for line in lines if line.startswith("base (") and " vs " in line]
    assert len(stats) == 4 and all("fold_preflop_rate" in line and "vpip_rate" in line for line in stats)
    # hand by hand the rows played the same deals with the same seeds: every per-hand difference is 0
    (paired,) = [line for line in lines if " minus base (" in line]
    assert "chips per hand, paired over the same hands" in paired
    assert paired.count("+0.000 ± 0.000") == 4, paired


def test_importing_the_data_plane_is_cheap():
    code = (
        "import echo2sdk, echo2sdk.adapters, sys; echo2sdk.SandboxAdapter; "
        "print(sorted(m for m in ('torch', 'transformers', 'gymnasium', 'pettingzoo', 'rlcard') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
