"""The learning-rate schedule: a factor of the base rate as a pure function of the learner step.

Counted in learner steps (every optimizer update of one step uses the same rate), 0-based `step` of
`total` steps, with `warmup` steps of linear warm-up first:

    warm-up   factor = (step + 1) / warmup                     for step < warmup (the first step is not lr 0)
    constant  factor = 1
    linear    factor = (total - step) / (total - warmup)       from 1 down to 1 / (total - warmup)
    cosine    factor = (1 + cos(pi * (step - warmup) / (total - warmup))) / 2
"""

from __future__ import annotations

import math

__all__ = ["SCHEDULES", "lr_factor", "warmup_steps"]

SCHEDULES = ("constant", "linear", "cosine")


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
