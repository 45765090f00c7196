"""The third-party path end to end: install examples/third_party_adapter (its own pyproject.toml, entry
point `echo2sdk.adapters: reverse`) into this environment, pass the conformance suite, then train two
learner steps with it chosen by config alone. And the appendix-F script form, run as written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    'model.policy="tiny-random"',
    "learner.steps=2",
    "learner.trajectories_per_step=8",
    "rollout.max_new_tokens=8",
    "rollout.nice=0",
    "rollout.workers=1",
    "run.worker_timeout_s=120",  # a loaded CI machine can starve a worker's heartbeats for a while
    "run.progress=false",
    "learner.data_timeout_s=300",
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    import shutil

    src = tmp_path_factory.mktemp("pkg") / "third_party_adapter"  # setuptools writes build/ next to the sources
    shutil.copytree(ROOT / "examples/third_party_adapter", src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", str(src)], check=True, capture_output=True)
    from echo2sdk.plugins import registered

    registered.cache_clear()
    yield
    subprocess.run([*pip, "uninstall", "-y", "echo2-reverse"], capture_output=True)
    registered.cache_clear()


def test_installed_adapter_loads_by_name_and_passes_conformance(installed):
    from echo2sdk.backends.hf import HFBackend
    from echo2sdk.weights import resolve_model
    from echo2sdk.plugins import load_adapter
    from echo2sdk.testing import check_adapter

    adapter = load_adapter("reverse")
    assert type(adapter).__module__ == "echo2_reverse" and "site-packages" in sys.modules["echo2_reverse"].__file__
    with HFBackend(resolve_model("tiny-random")) as backend:
        report = check_adapter(adapter, backend=backend, n=2, groups=2)
    assert report["records"] == 4 and not report["episodic"]


def test_two_training_steps_with_the_third_party_adapter_chosen_by_config(installed, tmp_path):
    cmd = [sys.executable, "-m", "echo2sdk.cli", "run", str(ROOT / "examples/math_smollm2.toml"), "--out", str(tmp_path)]
    for kv in [*SMALL, 'task.adapter="reverse"', "task.options={}"]:
        cmd += ["--set", kv]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["config"]["task"]["adapter"] == "reverse"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["trajectories"] for row in rows] == [8, 8]


def test_appendix_f_script_runs_as_written(tmp_path):
    pytest.importorskip("echo2_poker")
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples/poker_sandbox.py"), "--policy", "tiny-random", "--steps", "2", "--workers", "1", "--nice", "0",
         "--worker-timeout", "120", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["config"]["task"]["adapter"] == "sandbox"
    assert summary["config"]["task"]["options"]["env"] == "poker://nlhe_6max_v1"
    assert summary["config"]["task"]["options"]["mode"] == "offline_or_live"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(row["task"]["turns"] >= 1 and "chips" in row["task"] for row in rows)
