"""Issue 33: docs/adapters.md's two examples, run as written (extracted from the page into a package folder with
its entry points, as `pip install` would register them), through the conformance suite and a real run: the
single-turn task's Score.info per task in metrics.jsonl and per sample in the samples table, and the warning a
run without reward signal prints within 3 steps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from echo2sdk.core.contracts import Task
from echo2sdk.testing import MockBackend, check_adapter

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "adapters.md"
ENTRY_POINTS = """[echo2sdk.adapters]
countdown = echo2_countdown:Countdown

[echo2sdk.envs]
guess = echo2_guess:GuessPlugin
"""


def page_files() -> dict[str, str]:
    """The page's code blocks that start with '# file: NAME', by NAME."""
    blocks = re.findall(r"```python\n# file: (\S+)\n(.*?)```", PAGE.read_text(), re.DOTALL)
    return {name: body for name, body in blocks}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A folder on sys.path holding the page's two modules and a dist-info with their entry points."""
    from echo2sdk.adapters.registry import load_env_plugin
    from echo2sdk.plugins import registered

    folder = tmp_path_factory.mktemp("site")
    files = page_files()
    assert set(files) == {"echo2_countdown.py", "echo2_guess.py"}
    for name, body in files.items():
        assert 40 <= len(body.splitlines()) <= 75, (name, len(body.splitlines()))  # "about 60 lines"
        (folder / name).write_text(body)
    info = folder / "echo2_page_examples-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo2-page-examples\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    sys.path.insert(0, str(folder))
    registered.cache_clear()
    load_env_plugin.cache_clear()
    yield folder
    sys.path.remove(str(folder))
    registered.cache_clear()
    load_env_plugin.cache_clear()


def test_the_single_turn_example_passes_check_adapter_and_scores_as_documented(site):
    from echo2sdk.plugins import load_adapter

    adapter = load_adapter("countdown")
    report = check_adapter(adapter, backend=MockBackend(), n=2, groups=2)
    assert report["tasks_checked"] == 100 and report["records"] == 4
    task = Task(id="x", messages=(), answer="23", info={"numbers": "4 5 3", "target": 23})
    assert adapter.score(task, "<answer>4*5+3</answer>").correct
    assert adapter.score(task, "<answer>4*5+4</answer>").info == {"answered": True, "valid": False}  # 4 used twice
    assert adapter.score(task, "<answer>4*5</answer>").info == {"answered": True, "valid": True, "distance": 3}
    assert adapter.score(task, "<answer>__import__('os')</answer>").info["valid"] is False


def test_the_env_plugin_example_passes_check_adapter_and_plays_one_column_in_eval(site):
    from echo2sdk.adapters import SandboxAdapter
    from echo2sdk.adapters.evaluate import SOLO, default_metric
    from echo2sdk.adapters.registry import load_env_plugin

    report = check_adapter(SandboxAdapter(env="guess://v1", env_options={"top": 8}), backend=MockBackend(), n=2)
    assert report["episodic"] and report["records"] == 4
    plugin = load_env_plugin("guess")
    assert not hasattr(plugin, "eval_opponents") and default_metric("guess", plugin) == "reward" and SOLO == "-"


@pytest.mark.slow
@pytest.mark.integration
def test_a_run_of_the_single_turn_example_keeps_score_info_and_warns_without_reward_signal(site, tmp_path):
    pytest.importorskip("torch")
    cmd = [sys.executable, "-m", "echo2sdk.cli", "run", str(ROOT / "examples/math_smollm2.toml"), "--out", str(tmp_path)]
    for kv in ['model.policy="tiny-random"', "learner.steps=3", "learner.trajectories_per_step=8",
               "rollout.max_new_tokens=8", "rollout.nice=0", "rollout.workers=1", "run.progress=false",
               "run.log_samples_every=1", 'task.adapter="countdown"', "learner.filter_patience=1",
               "run.worker_timeout_s=120", "learner.data_timeout_s=300"]:
        cmd += ["--set", kv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:  # Score.info and Task.info, per step: numbers averaged, the string column not
        assert {"answered", "target"} <= set(row["task"]) and "numbers" not in row["task"]
        assert row["adapter_failures"] == {} and row["adapter_failure_rate"] == 0.0
    tables = [json.loads(line) for line in (tmp_path / "tables.jsonl").read_text().splitlines()]
    samples = [t for t in tables if t["name"] == "samples"]
    assert samples and all({"numbers", "answered", "target"} <= set(row) for t in samples for row in t["rows"])
    # tiny-random never writes <answer>: every reward is 0, no advantage, and the run says so by step 3
    assert all(row["reward_std"] == 0 for row in rows)
    warning = "no reward signal for 3 steps (step 3)"
    assert warning in r.stderr and warning in (tmp_path / "run.log").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert any(w.startswith(warning) for w in summary["warnings"])
