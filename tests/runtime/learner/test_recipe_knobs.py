"""The GRPO recipe knobs (docs/recipes.md) from the config to the learner, the buffer and the workers."""

from __future__ import annotations

import pytest

from echo2sdk.config import load_config
from echo2sdk.runtime.protocol.messages import WorkerConfig
from echo2sdk.runtime.learner.build import buffer_args, learner_args, worker_config
from echo2sdk.runtime.worker.process import RolloutWorker


def _cfg(*sets: str):
    return load_config(None, ['model.policy="tiny-random"', "learner.trajectories_per_step=8", *sets])


def test_defaults_follow_the_paper_and_the_current_token_level_loss():
    args = learner_args(_cfg())
    assert (args["loss_type"], args["updates_per_step"], args["epsilon"], args["epsilon_high"]) == ("dapo", 2, 0.2, None)
    assert (args["scale_rewards"], args["lr_scheduler"], args["warmup_steps"]) == (True, "constant", 0)
    assert (args["is_cap"], args["importance_weight"]) == (2.0, True)
    assert buffer_args(_cfg())["filter_zero_variance"] is True
    assert buffer_args(_cfg())["fallback_after"] == 4 * 2  # filter_patience x R/n


def test_dr_grpo_drops_std_scaling_unless_told_and_divides_by_max_new_tokens():
    args = learner_args(_cfg('learner.loss_type="dr_grpo"', "rollout.max_new_tokens=40"))
    assert (args["scale_rewards"], args["max_completion_length"]) == (False, 40)
    assert learner_args(_cfg('learner.loss_type="dr_grpo"', "learner.scale_rewards=true"))["scale_rewards"] is True


def test_the_importance_weight_can_be_switched_off():
    assert learner_args(_cfg("learner.importance_weight=false"))["importance_weight"] is False


def test_warmup_ratio_and_steps():
    assert learner_args(_cfg("learner.steps=30", "learner.warmup_ratio=0.1"))["warmup_steps"] == 3
    assert learner_args(_cfg("learner.steps=30", "learner.warmup_ratio=0.1", "learner.warmup_steps=5"))["warmup_steps"] == 5


def test_token_budget_reaches_the_learner_and_zero_lifts_it():
    assert learner_args(_cfg())["token_budget"] == 2048
    assert learner_args(_cfg("learner.token_budget=512"))["token_budget"] == 512
    assert learner_args(_cfg("learner.token_budget=0"))["token_budget"] is None


@pytest.mark.parametrize("bad", ['learner.loss_type="bnpo"', "learner.epsilon=1.0", "learner.updates_per_step=0",
                                 'learner.lr_scheduler="step"', "rollout.min_p=1.5", "rollout.top_k=-1",
                                 "learner.token_budget=-1"])
def test_bad_knobs_are_config_errors_naming_the_key(bad):
    from echo2sdk.errors import ConfigError

    with pytest.raises(ConfigError, match=bad.split("=")[0].split(".")[1]):
        _cfg(bad)


def test_sampling_knobs_reach_the_worker_config():
    cfg = _cfg("rollout.top_k=20", "rollout.min_p=0.05", "rollout.max_prompt_length=256")
    wc = WorkerConfig.model_validate(worker_config(cfg, "folder"))
    assert (wc.sampling.top_k, wc.sampling.min_p, wc.max_prompt_length) == (20, 0.05, 256)


def test_worker_truncates_long_prompts_from_the_left_and_counts_them():
    from echo2sdk.core.rollout import truncate_prompt

    w = RolloutWorker("127.0.0.1:1", "tok")  # the worker's counters, as its rollouts count them
    assert truncate_prompt([1, 2, 3, 4, 5], w.max_prompt_length, w.stats) == [1, 2, 3, 4, 5]  # max_prompt_length unset
    w.max_prompt_length = 3
    assert truncate_prompt([1, 2, 3], w.max_prompt_length, w.stats) == [1, 2, 3] and w.stats.prompts_truncated == 0
    assert truncate_prompt([1, 2, 3, 4, 5], w.max_prompt_length, w.stats) == [3, 4, 5] and w.stats.prompts_truncated == 1


def test_max_wait_s_is_off_by_default_and_reaches_the_batches():
    from echo2sdk.errors import ConfigError

    L = _cfg().learner
    assert (L.max_wait_s, L.min_groups, L.partial_lr) == (None, 1, "sqrt")
    L = _cfg("learner.max_wait_s=2.5", "learner.min_groups=2", "learner.partial_lr=linear").learner
    assert (L.max_wait_s, L.min_groups, L.partial_lr) == (2.5, 2, "linear")
    for bad in ("learner.max_wait_s=0", "learner.min_groups=0", "learner.partial_lr=cube"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].split(".")[1]):
            _cfg(bad)
