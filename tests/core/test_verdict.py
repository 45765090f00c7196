"""The capacity rule judged in useful rollouts and the filter rate it is judged with (core/verdict.py): measured
between two readings of the buffer's counts, predicted from accuracy and from the values the reward took, the
verdict."""

from __future__ import annotations

import pytest


def test_rollout_means_are_those_of_the_groups_completed_between_two_readings():
    from echo2sdk.core import capacity
    from echo2sdk.core.buffer import Completed
    from echo2sdk.core.verdict import rollout_means

    # 8 more records, 4 of them scored, 3 of those correct (one group scored whole: k = 3, k (k - 1) = 6); 2 more
    # groups (of 4), 1 of them filtered
    before, now = Completed(8, 4.4, 8, 4, 2, 0, 2, 4, 12), Completed(16, 10.0, 12, 7, 4, 1, 3, 7, 18)
    got = rollout_means(before, now, group_size=4, seconds=2.0)
    assert got == {"rollouts": 8, "rollout_reward_mean": pytest.approx(5.6 / 8), "rollout_accuracy": 0.75, "filter_rate": 0.5,
                   "filter_rate_predicted": round(0.75**4 + 0.25**4, 4), "prompt_concentration": None,
                   "rollouts_per_s": 4.0, "useful_rollouts_per_s": 2.0, "rollouts_per_useful": 2.0}  # one group: no spread
    none = {"rollouts": 0, "rollout_reward_mean": None, "rollout_accuracy": None, "filter_rate": None, "filter_rate_predicted": None,
            "prompt_concentration": None, "rollouts_per_s": None, "useful_rollouts_per_s": None,
            "rollouts_per_useful": None}
    assert rollout_means(now, now) == none
    assert rollout_means(Completed(), Completed(4, -2.0, 0, 0, 1)) == {
        **none, "rollouts": 4, "rollout_reward_mean": -0.5, "filter_rate": 0.0, "rollouts_per_useful": 1.0}
    # two prompts, one always solved (k = 4: 12 pairs), one never (k = 0): accuracy 0.5 as in 0.5^4 + 0.5^4 = 0.125,
    # but every group is filtered, and the prediction says so (nu at its floor: the widest spread)
    apart = rollout_means(Completed(), Completed(8, 4.0, 8, 4, 2, 2, 2, 4, 12), group_size=4)
    assert apart["rollout_accuracy"] == 0.5 and apart["filter_rate"] == 1.0
    assert apart["prompt_concentration"] == round(capacity.NU_FLOOR, 4) and apart["filter_rate_predicted"] > 0.99


def test_the_verdict_says_when_the_broadcast_not_the_pool_was_short():
    """Level 2 of the main job on a 2-core box: the snapshot reached the workers in 20.8 s while two steps took
    20.9 s, so mu_min was 246/s; at T_bcast = 0 it would be R / T_train = 1.53/s, which the pool's useful 1.70/s
    met: more workers would not have helped. Not so at level 1 (useful 1.31/s < 1.57/s): short of both."""
    from echo2sdk.core import capacity
    from echo2sdk.core.verdict import verdict

    rows = [{"learner_wait_s": 2.0, "learner_wait_filtered_s": 1.0, "learner_wait_empty_s": 1.0,
             "learner_wait_snapshot_s": 0.0}]
    level2 = verdict(3.358, 0.4943, capacity.mu_min(10.45, 20.77, 16, 2), rows, rule=(10.45, 20.77, 16, 2))
    assert level2["enough"] is False and level2["short_because_of_broadcast"]
    assert level2["mu_min_without_broadcast"] == pytest.approx(16 / 10.45)
    assert "T_bcast 20.8 s of kappa T_train 20.9 s" in level2["why"] and "1.53/s, which the pool met" in level2["why"]
    level1 = verdict(4.1, 0.681, capacity.mu_min(10.18, 17.96, 16, 2), rows, rule=(10.18, 17.96, 16, 2))
    assert level1["enough"] is False and not level1["short_because_of_broadcast"] and "broadcast" not in level1["why"]
    from echo2sdk.errors import CapacityError

    with pytest.raises(CapacityError) as e:
        capacity.mu_min(10.0, 25.0, 16, 2)
    none = verdict(4.1, 0.5, str(e.value), rows, rule=(10.0, 25.0, 16, 2))  # kappa T_train <= T_bcast
    assert none["enough"] is None and none["short_because_of_broadcast"] and none["why"].startswith("no pool is enough")
    fine = verdict(40.0, 0.5, capacity.mu_min(10.0, 5.0, 16, 2), rows, rule=(10.0, 5.0, 16, 2))
    assert fine["enough"] and not fine["short_because_of_broadcast"] and "why" not in fine
    assert verdict(4.0, 0.5, 2.0, rows)["mu_min_without_broadcast"] is None  # without the rule's inputs
