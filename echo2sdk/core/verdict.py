"""The capacity rule judged in useful rollouts, and the filter rate it is judged with.

Dynamic sampling drops the groups whose rewards are all one value, so only (1 - f) of the rollouts are useful. This
module measures f between two readings of the buffer's counters (`rollout_means`), predicts it two ways (from
accuracy for binary rewards, from the values the reward took for any discrete one: `rollout_means`,
`reward_prediction`, over a run: `prediction`; for a plan: `predicted_filter_rate`, from a run's summary:
`plan_inputs`), and judges the pool by it (`verdict`). The learner writes its numbers (metrics.jsonl, summary.json's
"capacity"), `echo2 plan` predicts from them and `echo2 plot` draws them (`FILTER_RATES`): one owner for all three.
The formulas themselves are core/capacity.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from echo2sdk.core import capacity
from echo2sdk.core.buffer import Completed
from echo2sdk.errors import ConfigError

__all__ = ["WAIT_CAUSES", "FILTER_RATES", "NO_VALUES", "rollout_means", "concentration", "reward_prediction", "prediction",
           "filtered_share", "sizing_filter_rate", "wait_by_cause", "verdict", "predicted_filter_rate", "shares_of",
           "plan_inputs"]

log = logging.getLogger("echo2sdk.capacity")

#: what the learner's wait for a batch was spent on (learner_wait_<cause>_s in metrics.jsonl): the pool produced
#: groups dynamic sampling filtered, groups generated on a snapshot older than v_t - S, or nothing the learner could
#: take yet
WAIT_CAUSES = ("filtered", "snapshot", "empty")

#: the filter rate's columns (metrics.jsonl per step, summary.json's capacity for the run): the measured one and its
#: two predictions, each with its label and a short name
FILTER_RATES = (("filter_rate", "measured", "measured"),
                ("filter_rate_predicted_reward", "predicted from the reward's values", "by values"),
                ("filter_rate_predicted", "predicted from accuracy (binary)", "binary"))

NO_VALUES = {"groups": 0, "values": []}  # the buffer's reward_values before anything completed


def rollout_means(before: Completed, now: Completed, *, group_size: int = 0, seconds: float = 0.0,
                  spread_from: Completed | None = None) -> dict[str, float | None]:
    """What the workers delivered between two readings of the buffer's Completed counts, `seconds` apart:
    rollout_reward_mean and rollout_accuracy of the groups completed; filter_rate, the share of them dynamic
    sampling dropped (zero reward variance); prompt_concentration nu, how alike the prompts are (from the spread of
    the correct counts of the groups completed since `spread_from`, an earlier reading, default `before`; None where
    they look alike), and filter_rate_predicted, the binary-reward filter rate at their accuracy p, group size G and
    nu (capacity.filter_rate: p^G + (1 - p)^G where alike); rollouts_per_s and useful_rollouts_per_s (those of
    groups not filtered); rollouts_per_useful, rollouts generated per rollout of a group not filtered, 1 / (1 - f).
    None where none (or no scored record) completed."""
    d = now.since(before)
    acc = d.correct / d.scored if d.scored > 0 else None
    rate = d.filtered_groups / d.groups if d.groups > 0 else None
    nu = concentration(before if spread_from is None else spread_from, now, group_size)
    return {
        "rollouts": d.records,
        "rollout_reward_mean": d.reward_sum / d.records if d.records > 0 else None,
        "rollout_accuracy": acc,
        "filter_rate": None if rate is None else round(rate, 4),
        "filter_rate_predicted": (round(capacity.filter_rate(acc, group_size, nu), 4)
                                  if acc is not None and group_size else None),
        "prompt_concentration": None if nu is None else round(nu, 4),
        "rollouts_per_s": round(d.records / seconds, 4) if seconds > 0 else None,
        "useful_rollouts_per_s": round(d.records * (1 - rate) / seconds, 4) if seconds > 0 and rate is not None
        else None,
        "rollouts_per_useful": round(1 / (1 - rate), 4) if rate is not None and rate < 1 else None,
    }


def concentration(before: Completed, now: Completed, group_size: int) -> float | None:
    """capacity.prompt_concentration of the groups scored whole that completed between two readings (None where
    too few, or alike)."""
    d = now.since(before)
    return capacity.prompt_concentration(d.scored_groups, group_size, d.scored_groups_correct,
                                         d.scored_groups_pairs) if group_size else None


def _values_between(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> tuple | None:
    """(m groups, {value: (records, pairs)}) of the groups tallied between two readings of the buffer's
    reward_values (core/buffer.RewardValues); None once the reward took too many values to tally."""
    if before is None or now is None:
        return None
    old = {v: (n, pairs) for v, n, pairs in before["values"]}
    return now["groups"] - before["groups"], {
        v: (n - old.get(v, (0, 0))[0], pairs - old.get(v, (0, 0))[1]) for v, n, pairs in now["values"]}


def reward_prediction(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None, group_size: int,
                      spread_from: Mapping[str, Any] | None = None) -> dict[str, float | None]:
    """The filter's own prediction, from the values the reward took (any discrete reward: math's 0, 0.1 and 1.1,
    not only right or wrong): reward_concentration nu (capacity.value_concentration of the groups completed
    since `spread_from`, default `before`; None where they look alike) and filter_rate_predicted_reward,
    capacity.value_filter_rate of the shares of the values among the groups completed between `before` and `now`
    with that nu. Readings are the buffer's reward_values; None where none completed or the reward is continuous."""
    step, spread = _values_between(before, now), _values_between(before if spread_from is None else spread_from, now)
    if step is None or spread is None or not step[0] or not group_size:
        return {"reward_concentration": None, "filter_rate_predicted_reward": None}
    m, values = spread
    nu = capacity.value_concentration(m, group_size, [n for n, _ in values.values()],
                                      [pairs for _, pairs in values.values()]) if m else None
    shares = list(_shares(step, group_size).values())
    return {"reward_concentration": None if nu is None else round(nu, 4),
            "filter_rate_predicted_reward": round(capacity.value_filter_rate(shares, group_size, nu), 4)}


def _shares(tallied: tuple, group_size: int) -> dict[float, float]:
    """{value: its share of the rollouts} of groups tallied as _values_between gives them (m groups, {value:
    (records, pairs)})."""
    m, values = tallied
    return {v: n / (m * group_size) for v, (n, _) in values.items()}


def prediction(buffer: Mapping[str, Any], group_size: int) -> dict[str, float | None]:
    """The filter rate predicted over every group completed since the run (or its resume) began, two ways. Of
    binary rewards: `accuracy` p, `prompt_concentration` nu (None: alike), `filter_rate_predicted`
    (capacity.filter_rate(p, G, nu): what `echo2 plan --accuracy P --group-size G --prompt-concentration NU` plans
    for) and `filter_rate_binary`, the share of the groups scored whole that were all right or all wrong, which a
    binary reward's filter would drop. Of the values the reward took (reward_prediction): `reward_shares` ([value,
    share of the rollouts] of each), `reward_concentration` and `filter_rate_predicted_reward` (what `echo2 plan
    --reward-shares Q1,Q2,... --group-size G --prompt-concentration NU` plans for), the prediction of the run's own
    filter_rate where the reward pays more than right or wrong (math: 0.1 for a boxed wrong answer sets apart groups
    whose answers are all wrong). None where nothing was scored (or, for the second, the reward is continuous).
    Both nus pool the whole run: a policy that moved spreads the prompts' rates further (a smaller nu, a higher
    prediction) than any one moment did. `buffer`: StalenessBuffer.stats()."""
    values = buffer.get("reward_values", NO_VALUES)
    whole = _values_between(NO_VALUES, values)
    shares = [[v, round(q, 4)] for v, q in _shares(whole, group_size).items()] if whole and whole[0] and group_size \
        else None
    by_reward = {**reward_prediction(NO_VALUES, values, group_size), "reward_shares": shares}
    scored, groups = buffer.get("completed_scored", 0), buffer.get("scored_groups", 0)
    if not scored or not groups or not group_size:
        return {"accuracy": None, "prompt_concentration": None, "filter_rate_predicted": None,
                "filter_rate_binary": None, **by_reward}
    p = buffer["completed_correct"] / scored
    nu = capacity.prompt_concentration(groups, group_size, buffer["scored_groups_correct"], buffer["scored_groups_pairs"])
    return {"accuracy": round(p, 4), "prompt_concentration": None if nu is None else round(nu, 4),
            "filter_rate_predicted": round(capacity.filter_rate(p, group_size, nu), 4),
            "filter_rate_binary": round(buffer.get("scored_groups_all_or_none", 0) / groups, 4), **by_reward}


def filtered_share(buffer: Mapping[str, Any]) -> float:
    """The share of the completed groups that dynamic sampling filtered so far (StalenessBuffer.stats())."""
    return buffer.get("filtered_groups", 0) / max(buffer.get("completed_groups", 0), 1)


def sizing_filter_rate(f: float, cap: float) -> float:
    """The filter rate the pool is sized on (R / (1 - f) rollouts a step): the measured `f` up to `cap`
    (scheduler.max_filter_rate). Above it a warning says that the task, not the pool, is short: almost every group
    has one reward for all its members, and more machines would mostly make more of those."""
    if f > cap:
        log.warning("%.0f%% of the groups have one reward for all their members (zero variance, filtered): the pool is "
                    "sized as for %.0f%% (scheduler.max_filter_rate); check the task's rewards and difficulty",
                    100 * f, 100 * cap)
        return cap
    return f


def wait_by_cause(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The learner's wait over metrics rows by cause (WAIT_CAUSES: learner_wait_<cause>_s summed), in seconds."""
    return {c: sum(r.get(f"learner_wait_{c}_s", 0.0) for r in rows) for c in WAIT_CAUSES}


def verdict(mu_pool: float, f: float, mu_min: float | str, rows: list[dict[str, Any]],
            buffer: Mapping[str, Any] | None = None, group_size: int = 0,
            rule: tuple[float, float, int, int] | None = None) -> dict[str, Any]:
    """summary.json's "capacity": the capacity rule judged in useful rollouts. The pool's raw rate, the run's filter
    rate f (groups dropped for zero reward variance), the useful rate mu_pool * (1 - f) against mu_min, and what the
    learner's wait was spent on (its metrics `rows`); `enough` is None when mu_min could not be computed. With the
    buffer's counters (`buffer`, StalenessBuffer.stats()) and G, the whole run's predictions beside it
    (`prediction`). With the rule's inputs (`rule`: T_train, T_bcast, R, kappa), what the broadcast costs:
    `mu_min_without_broadcast`, mu_min at T_bcast = 0 (R / T_train), and `short_because_of_broadcast` when the
    useful rate meets that but not mu_min (or no pool could: kappa T_train <= T_bcast): the broadcast, not the pool,
    is the bottleneck (shorten T_bcast or raise S; a pool as fast as a finite mu_min would also do)."""
    useful = mu_pool * (1 - f)
    enough = None if isinstance(mu_min, str) else useful >= mu_min
    causes = wait_by_cause(rows)
    T_train, T_bcast, R, kappa = rule or (0.0, 0.0, 0, 1)
    free = capacity.mu_min(T_train, 0.0, R, kappa) if T_train > 0 and R > 0 else None
    out = {
        "mu_pool_raw": mu_pool, "filter_rate": round(f, 4), **prediction(buffer or {}, group_size),
        "mu_pool_useful": useful, "mu_min": mu_min, "mu_min_without_broadcast": free,
        "enough": enough,
        "short_because_of_filtering": bool(not enough and enough is not None and mu_pool >= mu_min),
        "short_because_of_broadcast": bool(free is not None and not enough and (enough is None or useful >= free)),
        "learner_wait_s": round(sum(r["learner_wait_s"] for r in rows), 3),
        "learner_wait_filtered_s": round(causes["filtered"], 3),
        "learner_wait_empty_s": round(causes["empty"], 3),
        "learner_wait_snapshot_s": round(causes["snapshot"], 3),
    }
    broadcast = (f"the broadcast (T_bcast {T_bcast:.3g} s of kappa T_train {kappa * T_train:.3g} s) leaves the "
                 f"pool too little time: at T_bcast = 0 mu_min would be {free:.3g}/s"
                 if out["short_because_of_broadcast"] else "")
    if enough is False:
        out["why"] = (f"useful rollouts {useful:.3g}/s < mu_min {mu_min:.3g}/s" +
                      (f": {100 * f:.0f}% of the groups were filtered (zero reward variance), so the raw "
                       f"{mu_pool:.3g}/s was not enough" if out["short_because_of_filtering"] else "") +
                      (f"; {broadcast}, which the pool met" if broadcast else ""))
    elif enough is None and broadcast:
        out["why"] = f"no pool is enough: {broadcast}"
    return out


def predicted_filter_rate(group_size: int, *, accuracy: float | None = None, shares: Sequence[float] | None = None,
                          nu: float | None = None, of: object = None) -> tuple[float, str]:
    """The filter rate a plan takes, predicted at group size G from the policy's accuracy p (binary rewards:
    capacity.filter_rate) or from the shares of the values a reward takes (capacity.value_filter_rate), with the
    prompts' concentration nu (None: alike); and the words saying so (`of`: where p or the shares came from)."""
    how = "alike prompts" if nu is None else f"prompt concentration nu = {nu:g}"
    if accuracy is not None:
        f, source = capacity.filter_rate(accuracy, group_size, nu), f"accuracy p = {accuracy:g}"
    elif shares is not None:
        f = capacity.value_filter_rate(shares, group_size, nu)
        source = f"reward shares {', '.join(f'{q:g}' for q in shares)}"
    else:
        raise ValueError("predicted_filter_rate needs an accuracy or reward shares")
    if of is not None:
        source = f"{source} of {of}"
    return f, f"predicted from {source}, G = {group_size}: {how}"


def shares_of(text: str, flag: str = "--reward-shares") -> list[float]:
    """Reward shares written as Q1,Q2,... as fractions of 1: shares rounded to a few digits (summary.json's
    reward_shares, 4) may sum to 1 within 1e-3 and are rescaled; any other sum is an error (naming `flag`)."""
    try:
        shares = [float(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"{flag} must be numbers separated by commas, got {text!r}") from None
    if any(not 0 <= q <= 1 for q in shares):
        raise ConfigError(f"{flag} must each be in [0, 1], got {text!r}")
    if abs(sum(shares) - 1) > 1e-3:
        raise ConfigError(f"{flag} must sum to 1, got {sum(shares):g} ({text!r})")
    return [q / sum(shares) for q in shares]


def plan_inputs(summary: Mapping[str, Any], where: str) -> dict[str, Any]:
    """What a run's summary.json (`summary`, read from `where`) gives a plan's filter prediction: its reward shares
    (as text, as --reward-shares takes them) and their concentration, or, for a reward of more values than the buffer
    tallies, its accuracy and the prompts' concentration; and its group size. ConfigError where it has neither."""
    cap = summary.get("capacity") or {}
    G = ((summary.get("config") or {}).get("rollout") or {}).get("group_size")
    if cap.get("reward_shares"):
        return {"reward_shares": ",".join(str(q) for _, q in cap["reward_shares"]),
                "prompt_concentration": cap.get("reward_concentration"), "group_size": G}
    if cap.get("accuracy") is not None:
        return {"accuracy": cap["accuracy"], "prompt_concentration": cap.get("prompt_concentration"), "group_size": G}
    raise ConfigError(f"--filter-from: {where} has neither capacity.reward_shares nor capacity.accuracy (a run "
                      "without dynamic sampling's counts, or from before them)")
