"""The GRPO objective's pure functions (core/grpo.py) and the learning-rate schedule against hand-computed values."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from echo2sdk.core.grpo import group_advantages, grpo_loss, sequence_weights, token_terms  # noqa: E402
from echo2sdk.core.lr_schedule import lr_factor, partial_factor, warmup_steps  # noqa: E402

# Two sequences, 2 and 3 loss tokens (the third position of the first is padding), pi_theta = pi_old = pi_sampler:
# r_t = w_t = 1, so l_t = -A_i on every loss token.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
LOGP = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.2, 0.4]]))
ADV = torch.tensor([1.0, -0.5])


def _loss(loss_type: str, **kw) -> float:
    return grpo_loss(LOGP, LOGP, LOGP, ADV, MASK, loss_type=loss_type, epsilon=0.2, is_cap=2.0, **kw).item()


def test_dapo_is_the_token_mean_over_the_batch():
    assert _loss("dapo") == pytest.approx((2 * -1.0 + 3 * 0.5) / 5)  # -0.1


def test_grpo_is_the_mean_over_sequences_of_their_token_means():
    assert _loss("grpo") == pytest.approx((-1.0 + 0.5) / 2)  # -0.25


def test_dr_grpo_divides_the_sum_by_sequences_times_max_completion_length():
    assert _loss("dr_grpo", max_completion_length=4) == pytest.approx((2 * -1.0 + 3 * 0.5) / (2 * 4))  # -0.0625
    with pytest.raises(ValueError, match="max_completion_length"):
        _loss("dr_grpo")


def test_sequence_weights_leave_sequences_without_loss_tokens_out():
    assert sequence_weights([2, 0, 3], "grpo") == pytest.approx([1 / 4, 0.0, 1 / 6])  # G = 2
    assert sequence_weights([2, 0, 3], "dapo") == pytest.approx([1 / 5, 0.0, 1 / 5])
    assert sequence_weights([2, 0, 3], "dr_grpo", 8) == pytest.approx([1 / 16, 0.0, 1 / 16])
    with pytest.raises(ValueError, match="loss_type"):
        sequence_weights([1], "bnpo")


def _one_token(ratio: float, adv: float, **kw):
    logp = torch.tensor([math.log(ratio)], requires_grad=True)  # pi_old = 1 (log 0): r_t = ratio
    t = token_terms(logp, torch.zeros(1), torch.zeros(1), torch.tensor([adv]), epsilon=0.2, is_cap=2.0, **kw)
    t.loss.sum().backward()
    return t, float(logp.grad)


def test_clip_higher_bounds_the_ratio_at_1_plus_epsilon_high():
    t, grad = _one_token(1.5, 1.0, epsilon_high=0.28)
    assert t.loss.item() == pytest.approx(-1.28) and t.clipped.item() == 1.0 and grad == 0.0
    t, _ = _one_token(1.5, 1.0)  # epsilon_high defaults to epsilon
    assert t.loss.item() == pytest.approx(-1.2)
    t, grad = _one_token(0.5, -1.0, epsilon_high=0.28)  # the lower bound stays 1 - epsilon
    assert t.loss.item() == pytest.approx(0.8) and t.clipped.item() == 1.0 and grad == 0.0
    t, grad = _one_token(1.1, 1.0, epsilon_high=0.28)  # inside: d(-r A)/d log pi = -r A
    assert t.loss.item() == pytest.approx(-1.1) and t.clipped.item() == 0.0 and grad == pytest.approx(-1.1)


def test_importance_weight_is_truncated_and_multiplies_the_kl_term():
    old = torch.zeros(1)
    sampler = old - math.log(4.0)  # pi_old / pi_sampler = 4, truncated at C = 2
    ref = old + math.log(2.0)  # pi_ref / pi_theta = 2: k3 = 2 - log 2 - 1
    t = token_terms(old.clone(), old, sampler, torch.zeros(1), ref, epsilon=0.2, is_cap=2.0, beta=0.5)
    k3 = 1.0 - math.log(2.0)
    assert t.kl.item() == pytest.approx(k3)
    assert (t.weight.item(), t.truncated.item()) == (2.0, 1.0)
    assert t.loss.item() == pytest.approx(2.0 * 0.5 * k3)  # w_t * beta * KL_t (A = 0)


def test_without_the_importance_weight_w_is_1_whatever_the_sampler():
    """importance_weight=False: l_t = -min(r_t A, clip(r_t) A) + beta KL_t, as with pi_sampler = pi_old."""
    logp = torch.tensor([math.log(1.1), math.log(0.5)], requires_grad=True)  # pi_old = 1: r_t = 1.1, 0.5
    old, adv = torch.zeros(2), torch.tensor([1.0, -1.0])
    sampler = old - math.log(4.0)  # pi_old / pi_sampler = 4: w_t = C = 2 with the weight
    on = token_terms(logp, old, sampler, adv, epsilon=0.2, is_cap=2.0)
    off = token_terms(logp, old, sampler, adv, epsilon=0.2, is_cap=2.0, importance_weight=False)
    same = token_terms(logp, old, old, adv, epsilon=0.2, is_cap=2.0)  # pi_sampler = pi_old: w_t = 1
    assert on.weight.tolist() == [2.0, 2.0] and on.truncated.tolist() == [1.0, 1.0]
    assert off.weight.tolist() == [1.0, 1.0] and off.truncated.tolist() == [0.0, 0.0]
    assert off.loss.tolist() == pytest.approx([-1.1, 0.8])  # -r A inside the clip; -(0.8)(-1) clipped below
    assert on.loss.tolist() == pytest.approx([-2.2, 1.6])
    (g_off,) = torch.autograd.grad(off.loss.sum(), logp)
    (g_same,) = torch.autograd.grad(same.loss.sum(), logp)
    assert torch.equal(g_off, g_same) and g_off.tolist() == pytest.approx([-1.1, 0.0])
    a = torch.tensor([1.0, -0.5])
    kw = dict(loss_type="dapo", epsilon=0.2, is_cap=2.0)
    assert grpo_loss(LOGP, LOGP, LOGP - 3.0, a, MASK, importance_weight=False, **kw).item() == pytest.approx(
        grpo_loss(LOGP, LOGP, LOGP, a, MASK, **kw).item())  # -0.1, the dapo value above
    assert grpo_loss(LOGP, LOGP, LOGP - 3.0, a, MASK, **kw).item() == pytest.approx(2 * -0.1)  # w_t = C = 2


def test_group_advantages_with_and_without_std_scaling():
    assert group_advantages([1.0, 0.0, 0.0, 1.0], eps=1e-6) == pytest.approx([1, -1, -1, 1], abs=1e-5)
    assert group_advantages([1.0, 0.0, 0.0, 1.0], eps=1e-6, scale=False) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([3.0, 3.0], eps=1e-4, scale=False) == [0.0, 0.0]


def test_lr_schedules_with_warmup():
    assert [lr_factor("constant", s, 10, 2) for s in range(3)] == [0.5, 1.0, 1.0]
    assert [lr_factor("linear", s, 10) for s in (0, 5, 9)] == pytest.approx([1.0, 0.5, 0.1])
    assert [lr_factor("cosine", s, 10, 2) for s in (0, 2, 6, 10)] == pytest.approx([0.5, 1.0, 0.5, 0.0])
    assert warmup_steps(30, ratio=0.1) == 3 and warmup_steps(30, steps=5, ratio=0.1) == 5
    with pytest.raises(ValueError, match="lr_scheduler"):
        lr_factor("step", 0, 10)


def test_a_partial_batch_scales_the_rate_by_its_share_of_the_groups():
    assert [partial_factor("sqrt", m, 4) for m in (1, 2, 4, 6)] == pytest.approx([0.5, 0.5 ** 0.5, 1.0, 1.0])
    assert [partial_factor("linear", m, 4) for m in (1, 3)] == pytest.approx([0.25, 0.75])
    assert partial_factor("none", 1, 4) == 1.0
    with pytest.raises(ValueError, match="partial_lr.*'cube'"):
        partial_factor("cube", 1, 4)
    with pytest.raises(ValueError, match="m=0"):
        partial_factor("sqrt", 0, 4)
