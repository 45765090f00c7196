"""The worker audit (core/audit.py), the buffer's drop_worker, and the learner's per-record sampler gap."""

from __future__ import annotations

import math

import pytest

from echo2sdk.core.audit import SamplerAudit, Screen, TokenSums, WorkerStat, audit_items, replay_stats, worker_stats
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.records import Meta, Trajectory
from echo2sdk.errors import ConfigError, TrajectoryRejected


def _rec(worker: str, version: int = 0, group: str = "g", off_policy: bool = False, logprobs=(-1.0, -2.0)):
    meta = Meta(group_id=group, prompt_ids=(1, 2), response_ids=tuple(range(3, 3 + len(logprobs))),
                logprobs=tuple(logprobs), worker=worker, off_policy=off_policy)
    return Trajectory(prompt="p", response="r", reward=1.0, version=version, meta=meta)


def _sums(claims, truth) -> TokenSums:
    """TokenSums of a record whose sampler claimed `claims` where pi_old says `truth`."""
    d = [t - c for c, t in zip(claims, truth)]
    return TokenSums(len(d), sum(map(abs, d)), sum(d), sum(x * x for x in d), sum(truth), sum(x * x for x in truth))


TRUTH = [-0.01, -1.2, -0.3, -0.05, -0.8, -0.02, -0.4, -0.01] * 3  # 24 tokens: a confident model's log-probs


def test_token_sums_gap_and_unexplained_variance():
    honest = _sums([t + 0.01 * (-1) ** i for i, t in enumerate(TRUTH)], TRUTH)
    assert honest.gap == pytest.approx(0.01) and honest.unexplained < 0.002
    constant = _sums([-0.01] * len(TRUTH), TRUTH)
    assert constant.unexplained == pytest.approx(1.0)  # a constant claim explains none of pi_old's variance
    assert constant.gap == pytest.approx(sum(abs(t + 0.01) for t in TRUTH) / len(TRUTH))
    shuffled = _sums(TRUTH[1:] + TRUTH[:1], TRUTH)  # plausible values, not the sampled tokens' own
    assert shuffled.unexplained > 1.0
    from dataclasses import astuple

    parts = _sums(TRUTH[:8], TRUTH[:8]) + _sums(TRUTH[8:], TRUTH[8:])
    assert astuple(parts) == pytest.approx(astuple(_sums(TRUTH, TRUTH)))
    assert math.isnan(_sums([-0.01] * 8, TRUTH[:8]).unexplained)  # under MIN_TOKENS
    assert math.isnan(_sums([-0.5] * 24, [-0.01, -0.5] * 12).unexplained)  # pi_old hardly varies (0.06)
    assert math.isnan(TokenSums().gap)


def test_worker_stats_divide_by_one_plus_lag_and_skip_records_without_tokens():
    a0, a2 = _sums([t + 0.2 for t in TRUTH], TRUTH), _sums([t + 0.6 for t in TRUTH], TRUTH)
    stats = worker_stats([("a", 0, a0), ("a", 2, a2), ("b", 0, TokenSums())])
    assert list(stats) == ["a"]
    assert stats["a"].gap == pytest.approx((0.2 + 0.6 / 3) / 2)
    assert stats["a"].var == pytest.approx(a0.unexplained)  # var: the records at lag 0 only (pooled)
    assert math.isnan(worker_stats([("a", 2, a2)])["a"].var)  # against a later policy var says nothing
    assert replay_stats([("a", a2), ("a", a0)])["a"] == worker_stats([("a", 0, a2), ("a", 0, a0)])["a"]


def test_audit_items_skip_off_policy_and_need_one_sum_per_record():
    records = [_rec("a", version=5), _rec("b", version=3, off_policy=True), _rec("c", version=2)]
    s = [TokenSums(1, 1, 1, 1, 1, 1)] * 3
    assert audit_items(records, s, v_t=5) == [("a", 0, s[0]), ("c", 3, s[2])]
    with pytest.raises(ValueError, match="1 token sums for 2 records"):
        audit_items(records[:2], s[:1], v_t=0)


LIE, FAKE, FINE = (_sums([t + 2.0 for t in TRUTH], TRUTH), _sums([-0.01] * len(TRUTH), TRUTH),
                   _sums([t + 0.01 for t in TRUTH], TRUTH))


def test_flagged_after_two_consecutive_steps_it_contributed_to():
    audit = SamplerAudit(gap_threshold=0.5)
    assert audit.observe([("liar", 0, LIE), ("honest", 0, FINE)]) == []
    assert audit.observe([("honest", 0, FINE)]) == []  # a step without its records neither counts nor resets
    assert audit.observe([("liar", 0, LIE), ("honest", 0, FINE)]) == ["liar"]
    assert audit.observe([("liar", 0, LIE)]) == []  # flagged once
    assert list(audit.flagged) == ["liar"] and "gap statistic 2 > threshold 0.5 in 2 consecutive" in audit.flagged["liar"]
    assert audit.history[1]["honest"].gap == pytest.approx(0.01)


def test_constant_logprobs_are_flagged_by_the_variance_statistic_and_not_the_gap():
    audit = SamplerAudit(gap_threshold=0.5, var_threshold=0.5)
    assert FAKE.gap < 0.5
    assert audit.observe([("fake", 0, FAKE)]) == [] and audit.observe([("fake", 0, FAKE)]) == ["fake"]
    assert "var statistic 1 > threshold 0.5" in audit.flagged["fake"]
    off = SamplerAudit(gap_threshold=0.5, var_threshold=0)  # 0: the variance check is off
    assert off.observe([("fake", 0, FAKE)]) == [] and off.observe([("fake", 0, FAKE)]) == []


def test_a_statistic_four_times_the_threshold_flags_at_once():
    audit = SamplerAudit(gap_threshold=0.5, var_threshold=0.5)
    far = _sums([t + 2.01 for t in TRUTH], TRUTH)  # gap 2.01 > 4 x 0.5
    assert audit.observe([("far", 0, far), ("liar", 0, LIE), ("fake", 0, FAKE)]) == ["far"]  # LIE: gap 2.0, not > 2
    assert "statistic 2.01 > 4 x threshold 0.5" in audit.flagged["far"]
    assert audit.observe([("far", 0, far), ("liar", 0, LIE), ("fake", 0, FAKE)]) == ["liar", "fake"]  # 2nd strikes


def test_a_step_where_var_is_undefined_neither_counts_nor_resets():
    """A constant liar whose records in one step are all nearly deterministic (log pi varying < 0.1: var
    undefined, its claims nearly right) is not cleared by that step; an honest step with var defined does."""
    audit = SamplerAudit(gap_threshold=0.5, var_threshold=0.5)
    certain = _sums([-0.01] * 24, [-0.01, -0.02] * 12)  # gap 0.005, var NaN
    assert math.isnan(certain.unexplained)
    assert audit.observe([("fake", 0, FAKE)]) == [] and audit.observe([("fake", 0, certain)]) == []
    assert audit.observe([("fake", 0, FAKE)]) == ["fake"]
    clears = SamplerAudit(gap_threshold=0.5, var_threshold=0.5)
    for s in (FAKE, FINE, FAKE):
        assert clears.observe([("w", 0, s)]) == []
    expires = SamplerAudit(gap_threshold=0.5, var_threshold=0.5)  # 3 silent steps in a row clear a strike
    for s in (FAKE, certain, certain, certain, FAKE):
        assert expires.observe([("w", 0, s)]) == []
    gap_only = SamplerAudit(gap_threshold=0.5)  # var not checked: every step under the gap clears
    for s in (LIE, certain, LIE):
        assert gap_only.observe([("w", 0, s)]) == []


def test_a_step_below_the_threshold_resets_the_count():
    audit = SamplerAudit(gap_threshold=0.5)
    for s in (LIE, FINE, LIE, FINE, LIE):
        assert audit.observe([("w", 0, s)]) == []
    assert audit.observe([("w", 0, LIE)]) == ["w"]


def test_lag_allowance_keeps_a_stale_record_under_the_threshold():
    audit = SamplerAudit(gap_threshold=0.5)
    stale = _sums([t + 1.6 for t in TRUTH], TRUTH)
    for _ in range(3):
        assert audit.observe([("w", 3, stale)]) == []  # 1.6 / (1 + 3) = 0.4


def test_screen_withholds_the_rows_of_the_worker_over_a_threshold_only():
    screen = Screen(v_t=4, gap_threshold=0.5, var_threshold=0.5)
    rows = [("honest", 4, FINE), ("liar", 4, LIE), ("fake", 3, FAKE), ("honest", 3, FINE), ("liar", 4, FINE)]
    assert screen.withhold(rows) == [False, True, False, False, True]  # fake at lag 1: var not taken
    rows[2] = ("fake", 4, FAKE)
    assert screen.withhold(rows) == [False, True, True, False, True]  # at lag 0: var 1.0
    assert Screen(4, 0.5, 0).withhold(rows) == [False, True, False, False, True]  # the var check off
    condemned = Screen(4, 0.5, 0.5, condemned=("honest",))  # by the step's replay: every row of it
    assert condemned.withhold(rows) == [True, True, True, True, True]


def test_the_replay_condemns_and_strikes_a_worker_whose_lagged_claims_are_made_up():
    """A liar labelling its records with an older version gets no var check from pi_old (lag > 0) and hides
    under the gap's lag allowance; the replay at the claimed version reads var 1.0: condemned each step, flagged
    at the second; an honest worker's replay (d: rounding) neither."""
    audit = SamplerAudit(gap_threshold=0.5, var_threshold=0.5)
    items = [("fake", 2, FAKE), ("honest", 2, FINE)]
    assert worker_stats(items)["fake"].over(0.5, 0.5) is None  # nothing the step's pi_old sees
    replay = replay_stats([("fake", FAKE), ("honest", FINE)])
    assert audit.screen(7, replay).condemned == ("fake",)
    assert audit.observe(items, replay) == [] and audit.observe(items, replay) == ["fake"]
    assert "replayed var statistic 1 > threshold 0.5 in 2 consecutive steps" in audit.flagged["fake"]
    assert audit.replays[0]["honest"].var < 0.002
    # a replay entry for a worker without records in the batch is not counted
    other = SamplerAudit(gap_threshold=0.5, var_threshold=0.5)
    for _ in range(3):
        assert other.observe([("honest", 0, FINE)], {"ghost": WorkerStat(5.0, 1.0)}) == []


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True])
def test_threshold_must_be_a_finite_positive_number(bad):
    with pytest.raises(ConfigError, match="lie_threshold"):
        SamplerAudit(gap_threshold=bad)


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


def _learner(**kw):
    from echo2sdk.core.learner import Learner
    from echo2sdk.weights import resolve_model

    return Learner(resolve_model("tiny-random"), lr=1e-3, precision="fp32", threads=1, seed=0, **kw)


def _group(worker: str, prompt: tuple[int, ...], rewards, logprobs):
    def meta(i):
        return Meta(group_id=worker, prompt_ids=prompt, response_ids=tuple(range(5 + i, 25 + i)),
                    logprobs=tuple(logprobs[i]), worker=worker)

    return [Trajectory(prompt="p", response="r", reward=r, version=0, meta=meta(i)) for i, r in enumerate(rewards)]


def test_learner_sums_are_zero_for_its_own_logprobs_large_for_fabricated_and_empty_off_policy():
    pytest.importorskip("torch")
    learner = _learner()
    own = learner._token_logprobs(learner._rows([[_rec("h", logprobs=(-1.0,) * 4)]])).tolist()  # pi_old's
    lie = (-0.01,) * 4
    group = [_rec("h", logprobs=own), _rec("h", logprobs=lie), _rec("h", logprobs=lie, off_policy=True)]
    sums = learner.step([group]).audit_sums
    assert sums[0].n == 4 and sums[0].gap < 1e-4  # an honest sampler's log-probs: pi_old's own
    assert sums[1].gap == pytest.approx(sum(abs(lp + 0.01) for lp in own) / 4, rel=1e-4)
    assert sums[1].lp == pytest.approx(sum(own), rel=1e-4)
    assert sums[2] == TokenSums()


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_a_screened_step_equals_a_step_on_the_honest_rows_alone(loss_type):
    """The liar's rows are withheld before their gradient is taken: the update (two of them) is the same as
    one without the liar's group at all, and the step reports which records it withheld."""
    pytest.importorskip("torch")
    import torch

    kw = dict(loss_type=loss_type, max_completion_length=20, updates_per_step=2)
    a, b = _learner(**kw), _learner(**kw)
    probe = _group("honest", (1, 2, 3), [0.0, 1.0, 0.5, 1.0], [[-1.0] * 20] * 4)
    own = [a._token_logprobs(a._rows([[t]])).tolist() for t in probe]  # pi_old's: an honest sampler's
    honest = _group("honest", (1, 2, 3), [0.0, 1.0, 0.5, 1.0], own)
    liar = _group("liar", (4, 5), [1.0, 0.0, 1.0, 0.0], [[-0.01] * 20] * 4)
    screen = Screen(v_t=0, gap_threshold=0.5, var_threshold=0.5)
    st = a.step([honest, liar], screen=screen)
    assert st.withheld == [False] * 4 + [True] * 4
    assert b.step([honest], screen=screen).withheld == [False] * 4
    fresh = _learner(**kw)
    moved = max(float((pa - p0).abs().max()) for pa, p0 in zip(a.model.parameters(), fresh.model.parameters()))
    assert moved > 1e-5  # the honest rows did train
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=1e-7, msg=name)


def test_a_batch_withheld_whole_raises_and_changes_nothing():
    pytest.importorskip("torch")
    import torch

    from echo2sdk.core.audit import BatchWithheld

    learner = _learner()
    before = [p.detach().clone() for p in learner.model.parameters()]
    liar = _group("liar", (4, 5), [1.0, 0.0, 1.0, 0.0], [[-0.01] * 20] * 4)
    with pytest.raises(BatchWithheld, match="withheld all 4 records") as e:
        learner.step([liar], screen=Screen(v_t=0, gap_threshold=0.5, var_threshold=0.5))
    assert e.value.withheld == [True] * 4 and all(s.gap > 0.5 for s in e.value.audit_sums)
    assert learner.steps_done == 0 and not learner.opt.state
    assert all(torch.equal(p, q) for p, q in zip(learner.model.parameters(), before))


def test_replay_recomputes_each_record_under_the_version_it_claims():
    """Records sampled (by pi_theta itself) at version 0 and replayed after 3 updates: against the kept v0
    snapshot d is rounding (bf16 snapshot), against pi_old now it is the drift; fabricated claims stay off; a
    version without a kept snapshot, an off-policy record and a record without loss tokens are not replayed."""
    pytest.importorskip("torch")
    from echo2sdk.core.audit import TokenSums

    learner = _learner(micro_batch=4)
    v0 = learner.snapshot_state("bfloat16")
    probe = _group("honest", (1, 2, 3), [0.0, 1.0, 0.5, 1.0], [[-1.0] * 20] * 4)
    own = [learner._token_logprobs(learner._rows([[t]])).tolist() for t in probe]  # what a v0 sampler claims
    honest = _group("honest", (1, 2, 3), [0.0, 1.0, 0.5, 1.0], own)
    for _ in range(3):
        learner.step([honest])
    fake = _group("fake", (1, 2, 3), [0.0, 1.0, 0.5, 1.0], [[-0.01] * 20] * 4)
    later = Trajectory(prompt="p", response="r", reward=1.0, version=3, meta=honest[0].meta)
    off = Trajectory(prompt="p", response="r", reward=1.0, version=0, meta=Meta(
        group_id="o", prompt_ids=(1, 2, 3), response_ids=tuple(range(5, 25)), logprobs=(0.0,) * 20, worker="o",
        off_policy=True))
    masked = Trajectory(prompt="p", response="r", reward=1.0, version=0, meta=Meta(
        group_id="m", prompt_ids=(1, 2, 3), response_ids=(5, 6), logprobs=(-1.0, -1.0), worker="m", loss_mask=(0, 0)))
    sums = learner.replay_sums([*honest, *fake, later, off, masked], {0: v0})
    replayed = replay_stats(zip(["honest"] * 4 + ["fake"] * 4, sums[:8]))
    drift = learner.step([honest]).audit_sums  # the same records against pi_old at lag 3
    assert replayed["honest"].gap < 0.01 < sum(s.abs_d for s in drift) / sum(s.n for s in drift)
    assert replayed["fake"].gap > 5  # tiny-random is near uniform: log pi ~ -10.8
    assert sums[8:] == [TokenSums()] * 3
    assert learner.replay_sums([honest[0]], {}) == [TokenSums()]
