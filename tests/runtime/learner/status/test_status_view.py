"""What the status page is handed (view.page_state): the prompt filter's last step (issue 44) and the worker prices,
read from a RunView over the recorded 20-step math run's rows (fake_run.py)."""

from __future__ import annotations

import json

import pytest
from fake_run import FILTER_ON, rows, view

from echo2sdk.runtime.learner.status import page_state


def test_the_prompt_filter_of_the_last_step_reaches_the_page():
    run = rows()
    run[-1].update(FILTER_ON)
    state = json.loads(json.dumps(page_state(view(run))))  # as /api/status sends it
    assert state["prompt_filter"] == {
        "enabled": True, "explore": 0.1, "handed": 6, "skipped": 3,
        "skipped_by_reason": {"all_correct": 2, "all_wrong": 1, "all_same": 0},
        "filter_rate": run[-1]["filter_rate"], "filter_rate_unskipped": 0.95,
        "rollouts_per_useful": pytest.approx(4 / 3)}


def test_the_filter_off_an_older_run_and_no_step_yet_are_told_apart():
    run = rows()
    run[-1].update(prompts_handed=8, prompts_skipped=0, prompts_skipped_by_reason={}, prompt_explore=None,
                   filter_rate_unskipped=None, rollouts_per_useful=1.0)
    off = page_state(view(run))["prompt_filter"]
    assert off["enabled"] is False and off["skipped"] == 0 and off["rollouts_per_useful"] == 1.0
    older = page_state(view(rows()))["prompt_filter"]  # rows written before the columns existed
    assert older["enabled"] is False and older["skipped"] is None and older["skipped_by_reason"] == {}
    assert page_state(view([]))["prompt_filter"]["enabled"] is None  # before the first step: not known yet


def test_worker_prices_come_from_the_config_first():
    state = page_state(view(rows(), prices="{local-1 = 2.0}"))
    assert {w["id"]: w["price"] for w in state["workers"]} == {"local-0": 0.5, "local-1": 2.0}
    assert state["cost"]["usd_per_hour"] == pytest.approx(2.5)


def test_the_bill_per_point_gained_so_far_reaches_the_page():
    run = rows()  # the recorded main job: the workers' accuracy rose from its first five steps to its last five
    state = json.loads(json.dumps(page_state(view(run, prices="{local-1 = 2.0}"))))
    b = state["bill"]
    first = [r["rollout_accuracy"] for r in run[:5] if r["rollout_accuracy"] is not None]
    last = [r["rollout_accuracy"] for r in run[-5:] if r["rollout_accuracy"] is not None]
    assert b["measure"] == "accuracy" and b["rollouts_generated"] == sum(r["rollouts"] for r in run)
    assert b["gain_points"] == pytest.approx(100 * (sum(last) / len(last) - sum(first) / len(first)))
    assert b["gain_points"] > 0 and b["rollouts_per_point"] == pytest.approx(b["rollouts_generated"] / b["gain_points"])
    assert b["usd_per_point"] == pytest.approx(b["cost_usd"] / b["gain_points"]) and b["cost_usd"] > 0
    assert page_state(view([]))["bill"]["rollouts_per_point"] is None  # no step yet: no gain, no price per point
