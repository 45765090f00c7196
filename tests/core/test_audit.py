"""The worker audit (core/audit.py), the buffer's drop_worker, and the learner's per-record sampler gap."""

from __future__ import annotations

import math

import pytest

from echo2sdk.core.audit import SamplerAudit, worker_gaps
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.records import Meta, Trajectory
from echo2sdk.errors import ConfigError, TrajectoryRejected


def _rec(worker: str, version: int = 0, group: str = "g", off_policy: bool = False, logprobs=(-1.0, -2.0)):
    meta = Meta(group_id=group, prompt_ids=(1, 2), response_ids=tuple(range(3, 3 + len(logprobs))),
                logprobs=tuple(logprobs), worker=worker, off_policy=off_policy)
    return Trajectory(prompt="p", response="r", reward=1.0, version=version, meta=meta)


def test_worker_gaps_divide_by_one_plus_lag_and_skip_off_policy_and_nan():
    records = [_rec("a", version=5), _rec("a", version=3), _rec("b", version=5, off_policy=True), _rec("b", 5)]
    gaps = worker_gaps(records, [0.2, 0.6, 9.0, math.nan], v_t=5)
    assert gaps == {"a": pytest.approx((0.2 / 1 + 0.6 / 3) / 2)}  # b: off-policy and NaN only


def test_worker_gaps_needs_one_gap_per_record():
    with pytest.raises(ValueError, match="1 gaps for 2 records"):
        worker_gaps([_rec("a"), _rec("a")], [0.1], v_t=0)


def test_flagged_after_two_consecutive_steps_it_contributed_to():
    audit = SamplerAudit(threshold=0.5)
    assert audit.observe([_rec("liar"), _rec("honest")], [2.0, 0.01], v_t=0) == []
    assert audit.observe([_rec("honest")], [0.01], v_t=0) == []  # a step without its records neither counts nor resets
    assert audit.observe([_rec("liar"), _rec("honest")], [2.0, 0.01], v_t=0) == ["liar"]
    assert audit.observe([_rec("liar")], [2.0], v_t=0) == []  # flagged once
    assert list(audit.flagged) == ["liar"] and "> threshold 0.5 in 2 consecutive steps" in audit.flagged["liar"]
    assert audit.history[1] == {"honest": 0.01}


def test_a_step_below_the_threshold_resets_the_count():
    audit = SamplerAudit(threshold=0.5)
    for g in (2.0, 0.1, 2.0, 0.1, 2.0):
        assert audit.observe([_rec("w")], [g], v_t=0) == []
    assert audit.observe([_rec("w")], [2.0], v_t=0) == ["w"]


def test_lag_allowance_keeps_a_stale_record_under_the_threshold():
    audit = SamplerAudit(threshold=0.5)
    for v_t in (3, 4):
        assert audit.observe([_rec("w", version=v_t - 3)], [1.6], v_t=v_t) == []  # 1.6 / (1 + 3) = 0.4


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True])
def test_threshold_must_be_a_finite_positive_number(bad):
    with pytest.raises(ConfigError, match="threshold"):
        SamplerAudit(threshold=bad)


def test_drop_worker_drops_its_groups_counts_them_and_refuses_its_records_after():
    buf = StalenessBuffer(staleness=2, group_size=2)
    kw = dict(vocab_size=10, max_len=100)
    buf.add_group([_rec("liar", group="a"), _rec("liar", group="a")], **kw)
    buf.add_group([_rec("honest", group="b"), _rec("honest", group="b")], **kw)
    buf.add(_rec("liar", group="c"), **kw)  # an incomplete group
    assert buf.drop_worker("liar") == 3
    s = buf.stats()
    assert s["evicted_by_reason"] == {"quarantined": 3} and s["held"] == 2 and s["ready_groups"] == 1
    assert s["admitted"] == s["sampled"] + s["evicted"] + s["held"]
    with pytest.raises(TrajectoryRejected, match="quarantined"):
        buf.add_group([_rec("liar", group="d"), _rec("liar", group="d")], **kw)
    assert buf.stats()["rejected"] == {"quarantined": 2}
    assert [t.meta.worker for g in buf.sample(1) for t in g] == ["honest", "honest"]


def test_learner_gap_is_zero_for_its_own_logprobs_large_for_fabricated_and_nan_off_policy():
    pytest.importorskip("torch")
    from echo2sdk.core.learner import Learner
    from echo2sdk.weights import resolve_model

    learner = Learner(resolve_model("tiny-random"), lr=1e-4, precision="fp32", threads=1)
    own = learner._token_logprobs(learner._rows([[_rec("h", logprobs=(-1.0,) * 4)]])).tolist()  # pi_old's
    lie = (-0.01,) * 4
    group = [_rec("h", logprobs=own), _rec("h", logprobs=lie), _rec("h", logprobs=lie, off_policy=True)]
    gaps = learner.step([group]).sampler_gap
    assert gaps[0] < 1e-4  # an honest sampler's log-probs: pi_old's own
    assert gaps[1] == pytest.approx(sum(abs(lp + 0.01) for lp in own) / 4, rel=1e-4)
    assert math.isnan(gaps[2])
