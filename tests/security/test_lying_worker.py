"""Lying-worker detection (core/audit.py) in real runs: the learner, two honest local worker processes and one
lying worker process (tests/security/_liar.py) over TCP, tiny model. The liar is quarantined at the second
learner step it contributes to (or at once for a version it never installed), the honest workers never are.
The runs are long enough (16 steps of 4 groups) that the liar's groups, which compete with two honest workers'
for the batch, reach it twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("echo2_math")

from _liar import peaked_model  # noqa: E402
from _peers import finish, spawn_worker  # noqa: E402

from echo2sdk.config import load_config  # noqa: E402
from echo2sdk.core.audit import AT_ONCE  # noqa: E402
from echo2sdk.runtime.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.integration

LIAR = Path(__file__).with_name("_liar.py")


def _run_with_liar(tmp_path: Path, *lie: str, steps: int = 16) -> tuple[Trainer, dict, list[dict]]:
    """A tiny run with 2 honest local workers and the liar; after the run, a new process asking to join
    under the liar's id must be refused. Returns the trainer (closed), its summary and metrics rows."""
    cfg = load_config(None, [
        'model.policy="tiny-random"', "rollout.workers=2", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "rollout.nice=0", f"learner.steps={steps}", "learner.trajectories_per_step=16", "learner.staleness=2",
        "learner.lr=1e-4", "learner.data_timeout_s=120", "run.progress=false", "run.heartbeat_s=0.5",
        "learner.filter_zero_variance=false",  # tiny-random's rewards are all 0: train on every group
        f'run.out="{tmp_path / "run"}"',
    ])
    tr = Trainer(cfg)
    liar = None
    try:
        tr.setup()
        c = tr.coordinator
        liar = subprocess.Popen(
            [sys.executable, str(LIAR), "--connect", f"{c.host}:{c.port}", "--id", "liar", *lie],
            env=dict(os.environ, ECHO2_TOKEN=c.token), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        summary = tr.run()
        code, out = finish(spawn_worker(c.port, c.token, wid="liar"), timeout=60)  # the coordinator is still up
        assert code == 2 and "quarantined" in out, out
    finally:
        tr.close()
        if liar is not None:
            finish(liar, timeout=30)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["quarantined"] == summary["quarantined"]
    return tr, summary, rows


def _check_gap_detection(tr: Trainer, summary: dict, rows: list[dict]) -> None:
    threshold, var_threshold = tr.cfg.learner.lie_threshold, tr.cfg.learner.lie_var_threshold
    assert list(summary["quarantined"]) == ["liar"] and "gap statistic" in summary["quarantined"]["liar"]
    history = tr.audit.history  # every audited batch: the stepped ones and those withheld whole
    with_liar = [h for h in history if "liar" in h]
    # flagged at its 2nd step, or its 1st when past 4 x the threshold; none of its records reached a batch after
    assert len(with_liar) == (1 if with_liar[0]["liar"].gap > AT_ONCE * threshold else 2)
    assert all(h["liar"].gap > threshold for h in with_liar)
    honest = [s for h in history for w, s in h.items() if w != "liar"]
    assert honest and max(s.gap for s in honest) < threshold
    assert not var_threshold or not any(s.var > var_threshold for s in honest)
    # the screen withheld every record of the liar before its gradient was taken, and no honest record
    assert set(summary["records_withheld_by_worker"]) == {"liar"}
    assert summary["records_withheld_by_worker"]["liar"] >= 4 * len(with_liar)  # a group of 4 in each of its steps
    assert summary["batches_withheld"] == rows[-1]["batches_withheld"]
    assert rows[-1]["records_withheld_total"] == sum(summary["records_withheld_by_worker"].values())
    assert rows[-1]["workers_quarantined"] == 1
    assert all(g < threshold for r in rows for w, g in r["sampler_gap"].items() if w != "liar")
    # the replay (a group per worker from an older version, under the version it claims): honest d is rounding
    replayed = [g for r in rows for w, g in r["sampler_replay_gap"].items() if w != "liar"]
    assert replayed and max(replayed) < 0.05 and any(r["t_audit_replay_s"] > 0 for r in rows)


def test_fabricated_logprobs_are_quarantined_within_two_steps(tmp_path):
    _check_gap_detection(*_run_with_liar(tmp_path, "--fabricate", "-0.01"))


def test_another_models_responses_are_quarantined_within_two_steps(tmp_path):
    other = peaked_model(tmp_path / "other")
    _check_gap_detection(*_run_with_liar(tmp_path, "--model", str(other), "--keep-model"))


def test_a_version_never_installed_is_quarantined_at_once(tmp_path):
    tr, summary, rows = _run_with_liar(tmp_path, "--claim-newest", steps=8)
    assert list(summary["quarantined"]) == ["liar"] and "never reported installed" in summary["quarantined"]["liar"]
    threshold = tr.cfg.learner.lie_threshold
    assert max(s.gap for h in tr.audit.history for s in h.values()) < threshold  # its v0 records were honest
    assert rows[-1]["workers_quarantined"] == 1
