"""Shared fixtures of the runtime tests."""

from __future__ import annotations

import importlib.util
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class TinyRun:
    tr: Any  # the Trainer, closed
    summary: dict
    out: Path  # run.out
    killed_at_step: int  # rows written when local-0 was killed
    token: str  # given in the config: it must appear in no file of the run, config.json holds it redacted
    steps: int  # learner.steps
    R: int  # learner.trajectories_per_step


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """One real run that several tests of test_trainer.py read once it is over: the learner and 2
    local worker processes over TCP, tiny-random on the math task, 8 steps of 8 trajectories, staleness 2; the
    token given in the config; metrics to jsonl and tensorboard, 3 samples logged every 2 steps; local-0 killed
    (SIGKILL) once 2 steps are done, the run going on with local-1."""
    pytest.importorskip("torch")
    pytest.importorskip("echo2_math")
    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.recipe import Trainer

    out, token, steps, R = tmp_path_factory.mktemp("tiny-run"), "tok-7f3a9c1e5b2d4f6a8c0e1b3d5f7a9c2e", 8, 8
    sinks = '"jsonl", "tensorboard"' if importlib.util.find_spec("tensorboard") else '"jsonl"'
    cfg = load_config(None, [
        'model.policy="tiny-random"', "rollout.workers=2", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "rollout.nice=0", f"learner.steps={steps}", f"learner.trajectories_per_step={R}", "learner.staleness=2",
        "learner.lr=1e-4", "learner.data_timeout_s=120", "run.progress=false", "run.heartbeat_s=0.5",
        f'run.token="{token}"', f"run.log_to=[{sinks}]", "run.log_samples_every=2", "run.log_samples=3",
        f'run.out="{out}"',
    ])
    tr = Trainer(cfg)
    killed: dict[str, int] = {}

    def killer() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(tr.rows) < 2:
            time.sleep(0.1)
        tr.procs[0].kill()
        killed["at_step"] = len(tr.rows)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        summary = tr.run()
    finally:
        tr.close()
    t.join(5)
    return TinyRun(tr, summary, out, killed["at_step"], token, steps, R)
