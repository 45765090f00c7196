"""Lying-worker detection (core/audit.py) in one real run: the learner, two honest local worker processes and
three lying worker processes (tests/security/_liar.py) over TCP, tiny model, side by side. Each liar is
quarantined for its own lie, at the second learner step it contributes to (or at once for a version it never
installed); the honest workers never are. The run is long enough (16 steps of 4 groups) that each liar's groups,
which compete with the honest workers' and the other liars' for the batch, reach it twice. The tests below read
that one run (a module fixture): per-worker statistics are independent, so the liars do not mask each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("echo2_math")

from _liar import peaked_model  # noqa: E402
from _peers import finish, spawn_worker  # noqa: E402

from echo2sdk.config import load_config  # noqa: E402
from echo2sdk.core.audit import AT_ONCE  # noqa: E402
from echo2sdk.runtime.learner.recipe import Trainer  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LIAR = Path(__file__).with_name("_liar.py")
FABRICATOR, OTHER_MODEL, CLAIMANT = "fabricator", "other-model", "claimant"  # the liars' worker ids
GAP_LIARS = (FABRICATOR, OTHER_MODEL)  # caught by the gap statistic
HONEST = ("local-0", "local-1")


@dataclass
class Run:
    tr: Trainer  # closed
    summary: dict
    rows: list[dict]  # metrics.jsonl
    rejoin: dict[str, tuple[int, str]]  # liar id -> (exit code, output) of a process joining under its id after the run


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    """A tiny run with 2 honest local workers and the three liars; after the run, a new process asking to join
    under each liar's id is started (its exit code and output kept for the tests)."""
    tmp = tmp_path_factory.mktemp("lying")
    lies = {
        FABRICATOR: ["--fabricate", "-0.01"],  # every sampler log-prob -0.01, real responses
        OTHER_MODEL: ["--model", str(peaked_model(tmp / "other")), "--keep-model"],  # another model's responses
        CLAIMANT: ["--claim-newest"],  # labels its records with a version it never installed
    }
    cfg = load_config(None, [
        'model.policy="tiny-random"', "rollout.workers=2", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "rollout.nice=0", "learner.steps=16", "learner.trajectories_per_step=16", "learner.staleness=2",
        "learner.lr=1e-4", "learner.data_timeout_s=120", "run.progress=false", "run.heartbeat_s=0.5",
        "learner.filter_zero_variance=false",  # tiny-random's rewards are all 0: train on every group
        f'run.out="{tmp / "run"}"',
    ])
    tr = Trainer(cfg)
    liars: list[subprocess.Popen] = []
    try:
        tr.setup()
        c = tr.coordinator
        for wid, lie in lies.items():
            liars.append(subprocess.Popen(
                [sys.executable, str(LIAR), "--connect", f"{c.host}:{c.port}", "--id", wid, *lie],
                env=dict(os.environ, ECHO2_TOKEN=c.token), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True,
            ))
        summary = tr.run()
        again = {wid: spawn_worker(c.port, c.token, wid=wid) for wid in lies}  # the coordinator is still up
        rejoin = {wid: finish(p, timeout=60) for wid, p in again.items()}
    finally:
        tr.close()
        for p in liars:
            finish(p, timeout=30)
    rows = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((tmp / "run" / "summary.json").read_text())["quarantined"] == summary["quarantined"]
    return Run(tr, summary, rows, rejoin)


def test_every_liar_and_no_honest_worker_is_quarantined_and_refused_after(run):
    assert set(run.summary["quarantined"]) == {FABRICATOR, OTHER_MODEL, CLAIMANT}
    assert run.rows[-1]["workers_quarantined"] == 3
    for wid, (code, out) in run.rejoin.items():
        assert code == 2 and "quarantined" in out, (wid, out)


def test_honest_workers_stay_under_the_thresholds_and_are_never_withheld(run):
    tr, summary, rows = run.tr, run.summary, run.rows
    threshold, var_threshold = tr.cfg.learner.lie_threshold, tr.cfg.learner.lie_var_threshold
    honest = [s for h in tr.audit.history for w, s in h.items() if w not in GAP_LIARS]  # the claimant's v0 ones too
    assert {w for h in tr.audit.history for w in h} >= set(HONEST)
    assert honest and max(s.gap for s in honest) < threshold
    assert not var_threshold or not any(s.var > var_threshold for s in honest)
    # the screen withheld every record of a gap liar before its gradient was taken, and no honest record
    assert set(summary["records_withheld_by_worker"]) == set(GAP_LIARS)
    assert summary["batches_withheld"] == rows[-1]["batches_withheld"]
    assert rows[-1]["records_withheld_total"] == sum(summary["records_withheld_by_worker"].values())
    assert all(g < threshold for r in rows for w, g in r["sampler_gap"].items() if w not in GAP_LIARS)
    # the replay (a group per worker from an older version, under the version it claims): honest d is rounding
    replayed = [g for r in rows for w, g in r["sampler_replay_gap"].items() if w not in GAP_LIARS]
    assert replayed and max(replayed) < 0.05 and any(r["t_audit_replay_s"] > 0 for r in rows)


def _check_gap_detection(run: Run, liar: str) -> None:
    tr, summary = run.tr, run.summary
    threshold = tr.cfg.learner.lie_threshold
    assert "gap statistic" in summary["quarantined"][liar]
    history = tr.audit.history  # every audited batch: the stepped ones and those withheld whole
    with_liar = [h for h in history if liar in h]
    # flagged at its 2nd step, or at its 1st when its batch's or its replayed records' statistic is past 4 x the
    # threshold (which of the two depends on how old its records are when they are taken, i.e. on timing); none of
    # its records reached a batch after
    first = history.index(with_liar[0])
    stats = [with_liar[0][liar], tr.audit.replays[first].get(liar)]
    at_once = f"> {AT_ONCE:g} x threshold" in summary["quarantined"][liar]
    assert at_once == any(st is not None and st.gap > AT_ONCE * threshold for st in stats), (summary, stats)
    assert len(with_liar) == (1 if at_once else 2)
    assert all(h[liar].gap > threshold for h in with_liar)
    assert summary["records_withheld_by_worker"][liar] >= 4 * len(with_liar)  # a group of 4 in each of its steps


def test_fabricated_logprobs_are_quarantined_within_two_steps(run):
    _check_gap_detection(run, FABRICATOR)


def test_another_models_responses_are_quarantined_within_two_steps(run):
    _check_gap_detection(run, OTHER_MODEL)


def test_a_version_never_installed_is_quarantined_at_once(run):
    assert "never reported installed" in run.summary["quarantined"][CLAIMANT]
    threshold = run.tr.cfg.learner.lie_threshold
    mine = [h[CLAIMANT].gap for h in run.tr.audit.history if CLAIMANT in h]
    assert all(g < threshold for g in mine)  # its v0 records (if any reached a batch) were honest
    assert CLAIMANT not in run.summary["records_withheld_by_worker"]
