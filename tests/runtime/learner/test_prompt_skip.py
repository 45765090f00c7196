"""learner.prompt_skip end to end: a real run (learner, coordinator over TCP, a local worker process) on a task of
three problems, which tiny-random never solves: every group is all wrong, so after its first group a prompt is
skipped with probability 1 - p_explore ** z. The run reports it in metrics.jsonl and summary.json, and a resumed run
carries the filter's history on."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def _cfg(out, problems, steps, extra=()):
    from echo2sdk.config import load_config

    return load_config(None, [
        'model.policy="tiny-random"', 'task.adapter="math"', f'task.options={{files=["{problems}"], fewshot=0}}',
        "rollout.workers=1", "rollout.group_size=2", "rollout.max_new_tokens=4", "rollout.nice=0",
        "rollout.tasks_per_request=2", f"learner.steps={steps}", "learner.trajectories_per_step=4",
        "learner.staleness=2", "learner.data_timeout_s=120", "learner.prompt_skip=true", "run.progress=false",
        "run.heartbeat_s=0.5", "run.save_every=0", f'run.out="{out}"', *extra,
    ])


def test_a_run_skips_prompts_that_gave_zero_variance_groups_and_a_resume_keeps_their_history(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("echo2_math")
    from echo2sdk.runtime.learner.recipe import Trainer

    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"question": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n"
                                for a in (3, 4, 5)))
    out = tmp_path / "run"
    tr = Trainer(_cfg(out, problems, steps=3))
    try:
        summary = tr.run()
    finally:
        tr.close()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    pf = summary["prompt_filter"]
    assert pf["enabled"] and pf["prompts_tracked"] == 3  # three prompts, however many tasks went out
    assert pf["skipped"] > 0 and pf["skipped"] == pf["skipped_by_reason"]["all_wrong"]  # tiny-random: never right
    assert pf["repeat_share"] > 0.5 and pf["precision"] in (None, 1.0)
    assert pf["explore"] < 0.5  # every group zero-variance, far above the target: p_explore went down
    assert sum(r["prompts_skipped"] for r in rows) <= pf["skipped"]  # skips after the last row are in the summary only
    assert all(r["prompts_skipped"] == sum(r["prompts_skipped_by_reason"].values()) for r in rows)
    assert all(isinstance(r["prompt_explore"], float) for r in rows)
    assert any(isinstance(r["filter_rate_unskipped"], float) for r in rows)
    state = json.loads(next((out / "checkpoints").glob("step-*/state.json")).read_text())["handout"]
    assert len(state["prompt_filter"]["history"]) == 3 and state["prompt_filter"]["explore"] == pytest.approx(
        tr.coordinator.handout.filter.explore, abs=0.05)  # the checkpoint was written before the last groups came

    resumed = Trainer(_cfg(out, problems, steps=5), resume=out)
    try:
        resumed.setup()
        restored = resumed.coordinator.handout.filter
        assert restored.explore == state["prompt_filter"]["explore"]  # as checkpointed, not the default 0.5
        assert restored.stats()["prompts_tracked"] == 3 and restored.handed == state["prompt_filter"]["counts"]["handed"]
        assert all(restored.streak(k) == z for k, z, *_ in state["prompt_filter"]["history"])
        summary2 = resumed.run()
    finally:
        resumed.close()
    assert summary2["steps"] == 5 and summary2["prompt_filter"]["skipped"] > sum(state["prompt_filter"]["skipped"].values())
    resumed_rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][3:]
    assert resumed_rows[0]["prompts_handed"] < state["handed"]  # counted from the checkpoint, not from 0
