"""Faults injected into a simulated run, and the worker a fault's role names when it fires."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from echo2sdk.core.broadcast.planner import ChainPlan

__all__ = ["Fault", "pick_worker"]


@dataclass(frozen=True)
class Fault:
    """A fault injected at virtual time `at_s`. `worker` is a worker name or a role picked when the
    fault fires: "forwarder" (the active relay with the longest downstream tail in the current plan)
    or "rollout" (an active worker that forwards to nobody). `kind`: "slow" (rollout rate, or relay
    link for a forwarder, times `factor`) or "drop" (the worker dies)."""

    at_s: float
    worker: str
    kind: Literal["slow", "drop"]
    factor: float = 0.5


def pick_worker(role: str, active: Sequence[str], plan: ChainPlan | None, names: Collection[str]) -> str | None:
    """The worker a fault's `role` names now (`active`: the active workers in pool order, `plan`: the current
    publication's chains, `names`: the pool): for "forwarder" the active relay with the longest tail, for
    "rollout" the last active worker that relays nothing (the last active one when all relay), else the
    worker called `role`. None when there is no such worker."""
    if role == "forwarder":
        if plan is None:
            return None
        best, tail = None, -1
        for chain in plan.chains:
            for i, w in enumerate(chain[:-1]):
                if w in active and len(chain) - 1 - i > tail:
                    best, tail = w, len(chain) - 1 - i
        return best
    if role == "rollout":
        relays = set()
        if plan is not None:
            relays = {w for c in plan.chains for w in c[:-1]} | {p for _, p in plan.leaves}
        pick = [w for w in active if w not in relays]
        return pick[-1] if pick else (active[-1] if active else None)
    return role if role in names else None
