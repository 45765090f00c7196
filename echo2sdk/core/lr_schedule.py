"""The learning-rate schedule: a factor of the base rate as a pure function of the learner step.

Counted in learner steps (every optimizer update of one step uses the same rate), 0-based `step` of
`total` steps, with `warmup` steps of linear warm-up first:

    warm-up   factor = (step + 1) / warmup                     for step < warmup (the first step is not lr 0)
    constant  factor = 1
    linear    factor = (total - step) / (total - warmup)       from 1 down to 1 / (total - warmup)
    cosine    factor = (1 + cos(pi * (step - warmup) / (total - warmup))) / 2

A partial batch (learner.max_wait_s: m of the step's k groups) multiplies that rate by `partial_factor`:
sqrt(m / k) (following Adam's square-root scaling rule: Malladi et al., 2022, "On the SDEs and Scaling Rules for
Adaptive Gradient Algorithms", which is for a batch size fixed through training and also adapts Adam's betas
and eps; here only the rate moves, step by step), m / k (the linear rule) or 1. The schedule counts a partial
step as a step.
"""

from __future__ import annotations

import math

__all__ = ["PARTIAL_RULES", "SCHEDULES", "lr_factor", "partial_factor", "warmup_steps"]

SCHEDULES = ("constant", "linear", "cosine")
PARTIAL_RULES = ("sqrt", "linear", "none")


def warmup_steps(total: int, steps: int = 0, ratio: float = 0.0) -> int:
    """Warm-up length: `steps` if given, else ceil(ratio * total) (transformers' rule)."""
    return steps if steps > 0 else math.ceil(ratio * total)


def lr_factor(kind: str, step: int, total: int, warmup: int = 0) -> float:
    """The factor multiplying the base learning rate at 0-based learner step `step`."""
    if kind not in SCHEDULES:
        raise ValueError(f"lr_scheduler must be one of {SCHEDULES}, got {kind!r}")
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant" or total <= warmup:
        return 1.0
    progress = min(step - warmup, total - warmup) / (total - warmup)
    if kind == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def partial_factor(rule: str, m: int, k: int) -> float:
    """The learning-rate factor of a step on m of its k groups (m >= k: 1): a smaller batch has a noisier
    gradient, and Adam moves the weights about lr per update whatever the batch, so many small steps at the full
    rate walk further than the signal warrants."""
    if rule not in PARTIAL_RULES:
        raise ValueError(f"learner.partial_lr must be one of {PARTIAL_RULES}, got {rule!r}")
    if m < 1 or k < 1:
        raise ValueError(f"a batch of m={m!r} of k={k!r} groups: both must be >= 1")
    if m >= k or rule == "none":
        return 1.0
    return math.sqrt(m / k) if rule == "sqrt" else m / k
