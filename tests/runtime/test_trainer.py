"""The whole loop on a tiny random Llama: learner + real worker processes over TCP, math task."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("echo2_math")

from echo2sdk.config import load_config  # noqa: E402
from echo2sdk.runtime.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.integration

FIELDS = {
    "step", "version", "time_s", "t_train_s", "reward_mean", "reward_std", "accuracy", "staleness_max",
    "staleness_mean", "trajectories", "rejected", "learner_wait_s", "t_bcast_s", "t_bcast_all_s", "broadcast_repairs",
}


def _cfg(tmp_path, steps=6, workers=2, S=2):
    return load_config(
        None,
        [
            'model.policy="tiny-random"',
            f"rollout.workers={workers}",
            "rollout.group_size=4",
            "rollout.max_new_tokens=12",
            "rollout.nice=0",
            f"learner.steps={steps}",
            "learner.trajectories_per_step=8",
            f"learner.staleness={S}",
            "learner.lr=1e-4",
            "learner.data_timeout_s=120",
            "run.progress=false",
            "run.heartbeat_s=0.5",
            f'run.out="{tmp_path}"',
        ],
    )


def test_run_writes_metrics_summary_and_checkpoint(tmp_path):
    tr = Trainer(_cfg(tmp_path))
    try:
        summary = tr.run()
    finally:
        tr.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    for r in rows:
        assert FIELDS <= r.keys()
        assert 0 <= r["staleness_max"] <= 2  # S
        assert r["trajectories"] == 8 and r["version"] == r["step"]
    assert any(r["t_bcast_s"] is not None for r in rows)  # snapshots reached the workers (kappa = 1)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 6 == summary["steps"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint")
    assert all(p.poll() is not None for p in tr.procs) or not tr.procs


def test_killing_a_worker_does_not_stop_training(tmp_path):
    tr = Trainer(_cfg(tmp_path, steps=8))
    killed = {}

    def killer():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(tr.rows) < 2:
            time.sleep(0.1)
        tr.procs[0].kill()
        killed["at_step"] = len(tr.rows)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        tr.run()
    finally:
        tr.close()
    t.join(5)
    assert killed["at_step"] >= 2 and len(tr.rows) == 8
    assert tr.rows[-1]["workers_alive"] == 1
    assert "local-0" in (tmp_path / "run.log").read_text()
