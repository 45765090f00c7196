"""Scripted poker strategies against the rule-based opponents: the ceiling of what a policy can reach with and
without reading its own hand, measured on the same seeded hands `echo2 eval` deals.

    PYTHONPATH=$PWD .venv/bin/python bench/poker_strategies.py [--hands 1000] [--seed 0] [--postflop tight_aggressive]
        [--preflop push_fold [--paired]]

Strategies (a scripted seat in place of the model, the sandbox and opponents unchanged):
  fold         folds whenever it faces a bet, checks when free (what the collapsed GRPO policy learned)
  call         checks or calls everything (a calling station)
  all_in       moves all in at every turn
  -- these three read nothing of their hand; the rest read its strength (cards.preflop_strength, hand_category):
  fit_or_fold  checks or calls a playable hand (preflop strength >= 0.5 or a pair or better), else folds to a bet
  value_raise  raises a playable hand, checks or calls the rest
  tight_aggressive, loose_aggressive: the opponents' own rules from the model's seat
  shove_strong moves all in preflop with a premium or strong starting hand, else folds (checks when free)

Each cell also gives the spread of the hand's chips and of the env_options.reward = allin_ev reward on the same
hands (the all-in expectation: the same mean, what luck it removes shows in allin_ev_sd vs chips_sd).

With --postflop RULE (env_options.postflop, the preflop curriculum) each strategy decides preflop only and RULE
plays the seat from the flop on: the ceiling of each preflop strategy in that curriculum. With --preflop push_fold
(env_options.preflop) only the strategies that choose among fold, check and all in play: fold, all_in, shove_strong.

--paired (with --preflop push_fold) prints instead, per opponent and hand class (premium-or-strong, the rest), how
often moving all in beats folding on the same deal and by how much on average (the all-in expectation): what a
GRPO pair of one shove and one fold sees. With advantages scaled by the group's spread only the sign of each
comparison counts, so a class whose shoves win most deals by a little and lose the rest by a lot is pushed the
wrong way (learner.scale_rewards = false keeps the chips).

The table is built directly (PokerSandbox): no plug-in validation, no max_turns forfeit (heads-up hands of
these strategies end within a few decisions anyway). One JSON line per (opponent, strategy): mean chips per hand with its 95 % interval half-width, fold-preflop
rate; then one line per strategy with the mean over the three opponents (the training mixture `mixed` draws
each with probability 1/3). The baseline is `fold`, the best strategy that does not read its hand (the
measurement behind docs/adapters.md's "no policy blind to its cards beats folding against the mixture").
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from echo2_poker.opponents import RULE_BASED, CallingStation, LooseAggressive, TightAggressive, _passive, _playable, _raise
from echo2_poker.cards import preflop_strength
from echo2_poker.table import POSTFLOP, PREFLOP, PokerSandbox

from echo2sdk.adapters.evaluate import held_out_tasks
from echo2sdk.adapters.sandbox import SandboxAdapter


def fold(state, legal, rng):
    return "fold" if state["to_call"] > 0 and "fold" in legal else _passive(legal)


def all_in(state, legal, rng):
    return "all_in" if "all_in" in legal else _passive(legal)


def fit_or_fold(state, legal, rng):
    return _passive(legal) if _playable(state) or state["to_call"] == 0 else "fold"


def value_raise(state, legal, rng):
    return _raise(legal, big=False) if _playable(state) else _passive(legal)


def shove_strong(state, legal, rng):
    if not state["board"] and preflop_strength(state["hand"]) >= 0.55:
        if "all_in" in legal or "call" in legal:  # call: the other seat is already all in
            return "all_in" if "all_in" in legal else "call"
    return "fold" if state["to_call"] > 0 and "fold" in legal else _passive(legal)


STRATEGIES = {"fold": fold, "call": CallingStation().act, "all_in": all_in, "fit_or_fold": fit_or_fold,
              "value_raise": value_raise,
              "tight_aggressive": TightAggressive().act, "loose_aggressive": LooseAggressive().act,
              "shove_strong": shove_strong}
BLIND = ("fold", "call", "all_in")
PUSH_FOLD = ("fold", "all_in", "shove_strong")  # the strategies legal under env_options.preflop = push_fold


def eval_deals(opponent: str, hands: int, seed: int) -> list[int]:
    """The deal seeds `echo2 eval --hands HANDS --seed SEED` plays against `opponent`."""
    adapter = SandboxAdapter(env="poker://nlhe_headsup_v1", env_options={"opponent": opponent})
    return [task.info["seed"] for task in held_out_tasks(adapter, hands, seed)]


def play(opponent: str, strategy, hands: int, seed: int, postflop: str = "model",
         preflop: str = "all") -> tuple[list[float], list[float], float]:
    """`strategy` in the model's seat for the first `hands` held-out deals: chips per hand, the env_options.reward
    = allin_ev reward per hand (the same hands), fold-preflop rate. None of the strategies folds when checking is
    free, so env_options.free_fold changes nothing here."""
    options = {"opponent": opponent, "reward": "allin_ev", "postflop": postflop, "preflop": preflop}
    deals = eval_deals(opponent, hands, seed)
    table = PokerSandbox(2, options)
    rng, chips, expected, fold_preflop = random.Random(seed), [], [], 0
    try:
        for deal in deals:
            obs = table.reset(deal)
            while obs is not None:
                obs = table.step(strategy(obs.state, obs.legal, rng)).observation
            summary = table.summary()
            chips.append(summary["chips"])
            expected.append(summary["expected_chips"])
            fold_preflop += summary["fold_preflop"]
    finally:
        table.close()
    return chips, expected, fold_preflop / hands


def paired(opponent: str, hands: int, seed: int, postflop: str) -> None:
    """All in against fold on each of the held-out deals, one JSON line per hand class (see --paired)."""
    options = {"opponent": opponent, "reward": "allin_ev", "postflop": postflop, "preflop": "push_fold"}
    table, rng = PokerSandbox(2, options), random.Random(seed)
    diffs: dict[bool, list[float]] = {True: [], False: []}
    try:
        for deal in eval_deals(opponent, hands, seed):
            result = []
            for strategy in (all_in, fold):
                obs = table.reset(deal)
                while obs is not None:
                    obs = table.step(strategy(obs.state, obs.legal, rng)).observation
                result.append(table.summary()["expected_chips"])
            diffs[table.summary()["preflop_band"] in ("premium", "strong")].append(result[0] - result[1])
    finally:
        table.close()
    for strong, d in diffs.items():
        print(json.dumps({"opponent": opponent, "hands": "premium_or_strong" if strong else "playable_or_weak",
                          "deals": len(d), "postflop": postflop, "seed": seed,
                          "shove_beats_fold": round(sum(x > 0 for x in d) / max(1, len(d)), 3),
                          "shove_minus_fold": round(statistics.mean(d), 3) if d else None}), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hands", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--postflop", default="model", choices=POSTFLOP, help="who plays the seat from the flop on")
    p.add_argument("--preflop", default="all", choices=PREFLOP, help="the seat's preflop choices")
    p.add_argument("--paired", action="store_true", help="all in vs fold on the same deals (needs --preflop push_fold)")
    args = p.parse_args(argv)
    if args.paired:
        if args.preflop != "push_fold":
            p.error("--paired compares the two push/fold answers: add --preflop push_fold")
        for opponent in RULE_BASED:
            paired(opponent, args.hands, args.seed, args.postflop)
        return
    if args.hands < 2:
        p.error(f"--hands {args.hands}: at least 2 for a confidence interval")
    names = PUSH_FOLD if args.preflop == "push_fold" else tuple(STRATEGIES)
    means: dict[str, list[float]] = {name: [] for name in names}
    for opponent in RULE_BASED:
        for name in names:
            strategy = STRATEGIES[name]
            t0 = time.perf_counter()
            chips, expected, fp = play(opponent, strategy, args.hands, args.seed, args.postflop, args.preflop)
            m, half = statistics.mean(chips), 1.96 * statistics.stdev(chips) / len(chips) ** 0.5
            means[name].append(m)
            print(json.dumps({"opponent": opponent, "strategy": name, "reads_hand": name not in BLIND,
                              "hands": args.hands, "seed": args.seed, "postflop": args.postflop, "preflop": args.preflop,
                              "chips_per_hand": round(m, 3), "ci95": round(half, 3), "fold_preflop_rate": round(fp, 3),
                              "chips_sd": round(statistics.stdev(chips), 2),
                              "allin_ev_per_hand": round(statistics.mean(expected), 3),
                              "allin_ev_sd": round(statistics.stdev(expected), 2),
                              "wall_s": round(time.perf_counter() - t0, 1)}), flush=True)
    base = statistics.mean(means["fold"])
    for name, per in means.items():
        mix = statistics.mean(per)
        print(json.dumps({"opponent": "mixture", "strategy": name, "reads_hand": name not in BLIND,
                          "postflop": args.postflop, "preflop": args.preflop,
                          "chips_per_hand": round(mix, 3), "vs_fold": round(mix - base, 3)}), flush=True)


if __name__ == "__main__":
    main()
