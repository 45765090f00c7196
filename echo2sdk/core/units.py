"""The units of a learner step: one row per record (its tokens, loss mask and advantage A_i), the units that
run through the decoder together (rows sharing a prompt, at most `micro_batch` of them and `token_budget`
tokens), their round-robin deal over the FSDP ranks (unit_plan) and how each slot of units runs (pass_plan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from echo2sdk.core.audit import TokenSums
from echo2sdk.core.grpo import group_advantages
from echo2sdk.core.records import Trajectory

__all__ = ["Row", "rows_of", "unit_tokens", "units_of", "unit_plan", "SHARED", "ONE_PASS", "RECOMPUTE", "pass_plan"]


@dataclass
class Row:
    """One record of a step's batch: its prompt + response ids, per-response-token loss mask and sampler
    log-probs, and its advantage A_i."""

    ids: list[int]
    start: int  # index of the first response token in ids
    mask: list[float]  # per response token
    sampler_logprobs: list[float]
    advantage: float
    off_policy: bool = False  # replayed from a log: no sampler log-probs, w_t = 1
    worker: str = ""
    version: int = 0
    sums: TokenSums = TokenSums()  # the audit's sums over loss tokens, noted at the step's first pass (pi_old)
    withheld: bool = False  # by the step's screen: the row carries no loss in any of the step's updates


def unit_tokens(rows: Sequence[Row], unit: Sequence[int]) -> int:
    """Tokens the decoder runs for `unit` with the shared prefix: the prompt once, and every response padded
    to the unit's longest (the memory a unit's activations take grows with this)."""
    P = rows[unit[0]].start
    return P + len(unit) * max(len(rows[i].ids) - P for i in unit)


def units_of(rows: Sequence[Row], micro_batch: int, token_budget: int | None) -> list[list[int]]:
    """All units, in order: rows sharing a prompt, at most `micro_batch` of them and, as long as more than one
    row is in it, at most `token_budget` unit_tokens (a longer row is a unit of its own). Rows without a
    loss-carrying token are left out."""
    buckets: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rows):
        if any(r.mask):
            buckets.setdefault(tuple(r.ids[: r.start]), []).append(i)
    units: list[list[int]] = []
    for idx in buckets.values():
        unit: list[int] = []
        for i in idx:
            fits = token_budget is None or unit_tokens(rows, [*unit, i]) <= token_budget
            if unit and (len(unit) == micro_batch or not fits):
                units.append(unit)
                unit = []
            unit.append(i)
        units.append(unit)
    return units


def unit_plan(
    rows: Sequence[Row], micro_batch: int, rank: int = 0, world: int = 1, token_budget: int | None = None
) -> list[list[int] | None]:
    """This rank's units (`units_of`: rows sharing a prompt, at most `micro_batch` rows and `token_budget`
    tokens each), dealt round-robin over `world` ranks and padded with None (a zero-weight dummy unit) to the
    same count on every rank. Rows without a loss-carrying token are left out."""
    units = units_of(rows, micro_batch, token_budget)
    mine: list[list[int] | None] = list(units[rank::world])
    return mine + [None] * (-(-len(units) // world) - len(mine))


SHARED, ONE_PASS, RECOMPUTE = "shared", "one_pass", "recompute"  # how UnitForward runs a unit (core/forward.py)


def pass_plan(rows: Sequence[Row], micro_batch: int, world: int = 1, token_budget: int | None = None) -> list[str]:
    """Per slot of unit_plan, the same on every rank, how its units run (UnitForward): RECOMPUTE where some rank's
    unit in the slot is a row longer than `token_budget` (gradient checkpointing), else ONE_PASS where every
    rank's unit in it is a single row (a prompt shared by one row saves nothing, and one causal pass skips the
    masked attention over the cached prefix: 1.4x less CPU on a 2000-token episode), else SHARED. Every rank,
    its dummy units included, runs a slot the same way, so that all issue the same collectives."""
    units = units_of(rows, micro_batch, token_budget)
    plan = []
    for k in range(0, len(units), world):
        slot = units[k : k + world]
        if token_budget is not None and any(unit_tokens(rows, u) > token_budget for u in slot):
            plan.append(RECOMPUTE)
        else:
            plan.append(ONE_PASS if all(len(u) == 1 for u in slot) else SHARED)
    return plan


def rows_of(groups: Sequence[Sequence[Trajectory]], adv_eps: float, scale_rewards: bool) -> list[Row]:
    """One row per record of `groups`, in order, A_i from group_advantages(`adv_eps`, `scale_rewards`). A record
    whose loss mask is all zero (a failed episode) gets advantage 0 and stays out of its group's mean and std:
    the group is normalized over the records that learn."""
    rows = []
    for group in groups:
        masks = [
            [float(x) for x in t.meta.loss_mask] if t.meta.loss_mask is not None else [1.0] * len(t.meta.response_ids)
            for t in group
        ]
        live = [i for i, m in enumerate(masks) if any(m)]
        adv = [0.0] * len(group)
        if live:
            for i, a in zip(live, group_advantages([group[i].reward for i in live], adv_eps, scale_rewards)):
                adv[i] = a
        for t, mask, a in zip(group, masks, adv):
            m = t.meta
            ids = list(m.prompt_ids) + list(m.response_ids)
            rows.append(Row(ids, len(m.prompt_ids), mask, list(m.logprobs), a, m.off_policy, m.worker, t.version))
    return rows
