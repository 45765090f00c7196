"""core/prompt_filter.py: which prompts are skipped before rollout, how often, and what survives a checkpoint."""

from __future__ import annotations

import json

import pytest

from echo2sdk.core.prompt_filter import REASONS, PromptFilter, outcome_of, prompt_key
from echo2sdk.core.records import Meta, Trajectory
from echo2sdk.errors import ConfigError


def skip_share(f: PromptFilter, key: str, draws: int = 4000) -> float:
    return sum(f.decide(key)[0] is not None for _ in range(draws)) / draws


def group(rewards: list[float], correct: list[object]) -> list[Trajectory]:
    return [Trajectory(prompt="p", response=f"r{k}", reward=r, version=0,
                       meta=Meta(group_id="g", prompt_ids=(1,), response_ids=(2,), logprobs=(-0.1,), extra={"correct": c}))
            for k, (r, c) in enumerate(zip(rewards, correct, strict=True))]


def test_a_groups_outcome_says_why_its_prompt_may_not_teach():
    assert outcome_of(group([1.0, 0.0, 1.0], [True, False, True])) == "mixed"
    assert outcome_of(group([1.1, 1.1], [True, True])) == "all_correct"
    assert outcome_of(group([0.0, 0.0], [False, False])) == "all_wrong"
    assert outcome_of(group([0.5, 0.5], [None, None])) == "all_same"
    assert outcome_of(group([0.0, 0.0], [True, False])) == "all_same"  # one reward, verdicts differ: no signal all the same
    assert outcome_of(group([1.0, 1.1], [True, True])) == "mixed"  # all right but the format reward differs: it teaches


def test_a_prompt_is_known_by_its_content_not_its_task_id():
    q = ({"role": "user", "content": "What is 3 + 5?"},)
    assert prompt_key(q, "8") == prompt_key(tuple(dict(m) for m in q), "8", {"epoch": 1})  # a dataset read again
    assert prompt_key((), "", {"seed": 1}) != prompt_key((), "", {"seed": 2})  # an env task known by its info
    assert prompt_key((), "", {}) is None  # nothing tells it apart: never judged
    assert prompt_key(q, "8") != prompt_key(q, "9")
    assert prompt_key(q, "8") != prompt_key(({"role": "user", "content": "What is 3 + 6?"},), "8")


def test_unknown_and_mixed_prompts_are_always_handed_out():
    f = PromptFilter(seed=1)
    assert skip_share(f, "new") == 0.0
    f.observe("m", "all_wrong")
    f.observe("m", "mixed")  # a mixed group resets the streak
    assert f.streak("m") == 0 and skip_share(f, "m") == 0.0


@pytest.mark.parametrize("z", [1, 2, 3])
def test_the_skip_probability_is_one_minus_explore_to_the_streak(z):
    f = PromptFilter(explore=0.5, eta=0.0, seed=z)  # eta 0: p_explore stays 0.5
    for _ in range(z):
        f.observe("x", "all_correct")
    assert f.streak("x") == z
    assert skip_share(f, "x") == pytest.approx(1 - 0.5 ** z, abs=0.03)
    assert f.stats()["skipped_by_reason"]["all_correct"] > 0 and set(f.stats()["skipped_by_reason"]) == set(REASONS)


def test_explore_adapts_toward_the_target_and_never_reaches_zero():
    f = PromptFilter(target=0.25, explore=0.5, min_explore=0.05, eta=0.02, seed=0)
    for i in range(200):
        f.observe(f"p{i}", "all_wrong")  # every group zero-variance: far above the target, skip more
    assert f.explore == pytest.approx(0.05)
    f.observe("x", "all_wrong")
    assert 0.93 < skip_share(f, "x") < 0.97  # 1 - 0.05: still explored
    for i in range(200):
        f.observe(f"q{i}", "mixed")  # none zero-variance: below the target, skip less
    assert f.explore == pytest.approx(1.0)
    assert skip_share(f, "x") == 0.0


def test_explore_settles_where_the_measured_share_meets_the_target():
    """Closed loop on a toy population: 60 % of the prompts always give zero-variance groups, 40 % never. Without
    skipping f = 0.6; the filter must bring the share of zero-variance groups generated down to the target."""
    f = PromptFilter(target=0.25, eta=0.01, seed=3)
    prompts = [(f"p{i}", i % 5 < 3) for i in range(200)]
    generated = zero = 0
    for rnd in range(40):
        for key, dull in prompts:
            skipped, z = f.decide(key)
            if skipped is None:
                f.observe(key, "all_correct" if dull else "mixed", explored=z > 0)
                if rnd >= 20:
                    generated += 1
                    zero += dull
    assert zero / generated == pytest.approx(0.25, abs=0.05)
    s = f.stats()
    assert s["precision"] == 1.0  # a prompt with a streak was zero-variance again every time
    assert s["f_unskipped"] == pytest.approx(0.6, abs=0.05)  # what f would have been without skipping


def test_memory_is_bounded_and_forgets_the_least_recently_seen():
    f = PromptFilter(max_prompts=10, explore=0.05, min_explore=0.05, eta=0.0, seed=0)
    for i in range(100):
        f.observe(f"p{i}", "all_wrong")
    assert f.stats()["prompts_tracked"] == 10
    assert f.streak("p0") == 0 and f.streak("p99") == 1


def test_a_restored_filter_decides_as_the_original_would_have():
    a = PromptFilter(seed=7)
    for i in range(50):
        a.observe(f"p{i % 20}", "all_correct" if i % 3 else "mixed")
    for i in range(10):
        a.decide(f"p{i}")
    state = json.loads(json.dumps(a.state_dict()))  # what state.json holds
    b = PromptFilter(seed=999)
    b.load_state_dict(state)
    assert b.stats() == a.stats()
    keys = [f"p{i % 20}" for i in range(300)]
    assert [b.decide(k) for k in keys] == [a.decide(k) for k in keys]


def test_every_prompt_goes_out_with_probability_at_least_min_explore_however_long_its_streak():
    f = PromptFilter(explore=0.05, min_explore=0.05, eta=0.0, seed=4)
    for _ in range(20):
        f.observe("x", "all_correct")
    assert f.streak("x") == 20
    assert 0.93 < skip_share(f, "x", draws=8000) < 0.97  # 1 - 0.05, not 1 - 0.05 ** 20


def test_a_quarantined_workers_streaks_are_cleared_and_no_one_elses():
    f = PromptFilter(explore=0.05, min_explore=0.05, eta=0.0, seed=5)
    f.observe("a", "all_wrong", worker="liar")
    f.observe("b", "all_wrong", worker="liar")
    f.observe("b", "all_wrong", worker="honest")  # b's streak was set last by an honest worker
    f.observe("c", "all_correct", worker="honest")
    assert f.forget_worker("liar") == 1
    assert (f.streak("a"), f.streak("b"), f.streak("c")) == (0, 2, 1)


def test_a_checkpoint_sets_only_the_filters_counters():
    f = PromptFilter(seed=0)
    state = {**f.state_dict(), "counts": {"handed": 3, "_lock": 1, "max_prompts": 1, "explore": 0.9}}
    f.load_state_dict(state)
    assert f.handed == 3 and f.max_prompts == 100_000 and f.explore == 0.5


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"min_explore": 0.0}, "prompt_filter.min_explore"),
    ({"target": 1.5}, "prompt_filter.target"),
    ({"explore": 0.01, "min_explore": 0.05}, "prompt_filter.explore"),
    ({"max_prompts": 0}, "prompt_filter.max_prompts"),
])
def test_bad_settings_are_refused_by_name(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        PromptFilter(**kwargs)
