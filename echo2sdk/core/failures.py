"""Rollout failures: an adapter's bad score is data, not a crash ("a failed rollout is recorded and counted").

A reward is a real number: an int or a float, finite, not a bool (True is an int in Python) and not a string
("0.1" is not silently converted). `as_reward` returns it as a float or raises RewardError with its reason;
`failure_reason` names any exception an adapter raised. The reasons are short counter keys:

    adapter_error:TYPE   the adapter's score / start / step / result raised TYPE (e.g. adapter_error:KeyError)
    adapter_nan          the reward is NaN or infinite
    adapter_type         the reward is not a number (a str, a bool, None, a missing Score)

`Failures` counts them with a bounded number of distinct keys (a worker reports them in its heartbeat).
"""

from __future__ import annotations

import math
from collections import Counter

from echo2sdk.errors import AdapterError

__all__ = ["RewardError", "as_reward", "failure_reason", "Failures", "MAX_REASONS", "MAX_REASON_CHARS"]

MAX_REASONS = 64  # distinct reasons counted; later new ones go under OTHER
MAX_REASON_CHARS = 128
OTHER = "adapter_error:other"


class RewardError(AdapterError):
    """An adapter's reward that is not a finite real number; `reason` is adapter_nan or adapter_type."""

    def __init__(self, reason: str, value: object, what: str = "reward"):
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        kind = "not finite" if reason == "adapter_nan" else f"a {type(value).__name__}, not a real number"
        super().__init__(f"{what} = {shown} is {kind}")
        self.reason, self.value = reason, value


def as_reward(value: object, what: str = "reward") -> float:
    """`value` as a float when it is a finite int or float (not a bool); RewardError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardError("adapter_type", value, what)
    try:
        reward = float(value)  # an int beyond the float range overflows: not finite either
    except OverflowError:
        raise RewardError("adapter_nan", value, what) from None
    if not math.isfinite(reward):
        raise RewardError("adapter_nan", value, what)
    return reward


def failure_reason(exc: BaseException) -> str:
    """The counter key of an adapter failure: RewardError's reason, else adapter_error:TYPE."""
    if isinstance(exc, RewardError):
        return exc.reason
    return f"adapter_error:{type(exc).__name__}"[:MAX_REASON_CHARS]


class Failures:
    """Failure counts by reason, at most MAX_REASONS distinct keys (the rest are counted under OTHER)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, reason: str, n: int = 1) -> None:
        reason = reason[:MAX_REASON_CHARS]
        if reason not in self.counts and len(self.counts) >= MAX_REASONS - 1:
            reason = OTHER
        self.counts[reason] += n

    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)
