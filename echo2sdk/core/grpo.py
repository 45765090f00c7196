"""The GRPO objective as small pure functions of tensors; `Learner.step` (core/learner.py) calls them.

For response token t of sequence i in a batch of G sequences (docs/recipes.md has the whole recipe):

    A_i    = (R_i - mean_G) / (std_G + eps)          scale_rewards (Dr. GRPO: A_i = R_i - mean_G)
    r_t    = pi_theta / pi_old                       pi_old: the policy at the start of the learner step
    w_t    = min(pi_old / pi_sampler, C)             truncated importance weight (C = is_cap); 1 without it
    l_t    = w_t * ( -min(r_t A_i, clip(r_t, 1 - eps_low, 1 + eps_high) A_i) + beta * KL_t )
    KL_t   = pi_ref / pi_theta - log(pi_ref / pi_theta) - 1        (k3 estimator, >= 0)

and the loss type says how the l_t are averaged (|o_i|: loss-carrying tokens of sequence i):

    grpo     L = 1/G sum_i 1/|o_i| sum_t l_t         per-sequence mean, then mean over sequences
    dr_grpo  L = 1/(G L_max) sum_i sum_t l_t         L_max = max_completion_length, a constant
    dapo     L = 1/(sum_i |o_i|) sum_i sum_t l_t     token-level mean over the batch

Every variant is a weighted token sum, L = sum_i c_i sum_t l_t with the per-sequence weight c_i of
`sequence_weights`, so a batch split into units (and over FSDP ranks) adds up to the same L.
Sequences without a loss-carrying token (failed episodes) have weight 0 and do not count in G.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = ["LOSS_TYPES", "TokenTerms", "group_advantages", "token_terms", "sequence_weights", "grpo_loss"]

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")


def group_advantages(rewards: Sequence[float], eps: float, scale: bool = True) -> list[float]:
    """A_i = (R_i - mean_G) / (std_G + eps) for one GRPO group (population std); R_i - mean_G if not `scale`."""
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards) if scale else 0.0
    return [(r - mean) / (std + eps) if scale else r - mean for r in rewards]


class TokenTerms(NamedTuple):
    """Per-token tensors, all of the input's shape."""

    loss: torch.Tensor  # l_t
    kl: torch.Tensor  # KL_t (zeros without a reference)
    clipped: torch.Tensor  # 1.0 where the clip acts (the min takes the clipped branch, whose gradient is 0)
    weight: torch.Tensor  # w_t
    truncated: torch.Tensor  # 1.0 where pi_old / pi_sampler > C


def token_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    advantages: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    *,
    epsilon: float,
    epsilon_high: float | None = None,
    is_cap: float,
    beta: float = 0.0,
    importance_weight: bool = True,
) -> TokenTerms:
    """l_t and its parts from log pi_theta (`logp`, carries the gradient), log pi_old, log pi_sampler,
    A (broadcast against `logp`) and log pi_ref (None: no KL term). `importance_weight=False`: w_t = 1 on every
    token (no correction for the sampler's staleness; `sampler_logp` is then unused)."""
    eps_low, eps_high = epsilon, epsilon if epsilon_high is None else epsilon_high
    old_logp = old_logp.detach()
    ratio = torch.exp(logp - old_logp)  # r_t
    w, truncated = torch.ones_like(old_logp), torch.zeros_like(old_logp)  # w_t = 1 without the weight
    if importance_weight:
        raw_w = torch.exp(old_logp - sampler_logp)  # pi_old / pi_sampler
        w, truncated = raw_w.clamp(max=is_cap), (raw_w > is_cap).float()  # w_t
    clipped_ratio = ratio.clamp(1 - eps_low, 1 + eps_high)
    surr = torch.minimum(ratio * advantages, clipped_ratio * advantages)
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        d = ref_logp.detach() - logp
        kl = torch.exp(d) - d - 1  # k3 estimator of KL(pi_theta || pi_ref)
    loss = w * (-surr + beta * kl)
    with torch.no_grad():
        clipped = ((ratio < 1 - eps_low) & (advantages < 0)) | ((ratio > 1 + eps_high) & (advantages > 0))
    return TokenTerms(loss, kl, clipped.float(), w, truncated)


def sequence_weights(lengths: Sequence[float], loss_type: str, max_completion_length: int | None = None) -> list[float]:
    """c_i for sequences with |o_i| = lengths[i] loss-carrying tokens (see the module docstring)."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got loss_type={loss_type!r}")
    live = [n for n in lengths if n > 0]
    if not live:
        return [0.0] * len(lengths)
    G = len(live)
    if loss_type == "dapo":
        return [1.0 / sum(live) if n > 0 else 0.0 for n in lengths]
    if loss_type == "grpo":
        return [1.0 / (G * n) if n > 0 else 0.0 for n in lengths]
    if not max_completion_length or max_completion_length < 1:
        raise ValueError(f"loss_type='dr_grpo' needs max_completion_length >= 1, got {max_completion_length!r}")
    return [1.0 / (G * max_completion_length) if n > 0 else 0.0 for n in lengths]


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    *,
    loss_type: str,
    epsilon: float,
    epsilon_high: float | None = None,
    is_cap: float,
    beta: float = 0.0,
    importance_weight: bool = True,
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """L for a padded batch: (B, T) log-prob tensors, `advantages` (B,), `mask` (B, T) 1.0 on loss tokens."""
    terms = token_terms(logp, old_logp, sampler_logp, advantages[:, None], ref_logp,
                        epsilon=epsilon, epsilon_high=epsilon_high, is_cap=is_cap, beta=beta,
                        importance_weight=importance_weight)
    c = sequence_weights(mask.sum(-1).tolist(), loss_type, max_completion_length)
    return (terms.loss * mask * torch.tensor(c, dtype=terms.loss.dtype)[:, None]).sum()
