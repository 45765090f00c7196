"""The `poker` env scheme: `poker://nlhe_headsup_v1` (2 seats) and `poker://nlhe_6max_v1` (6 seats).

env_options:
  opponent:             calling_station | tight_aggressive | loose_aggressive | llm | mixed (default:
                        mixed, a rule-based policy drawn per seat and hand), or a list, one per other seat
  seat:                 the model's seat index (default 0; its position moves with the seeded dealer)
  opponent_model:       the LLM opponent's model (default smollm2-135m, the base policy)
  opponent_backend:     its inference backend (default hf)
  opponent_max_tokens:  its reply budget (default 16)
  opponent_temperature: its sampling temperature (default 0.7)
  free_fold:            false: fold is not a legal action when checking is free, for every seat (a reply
                        "fold" there is illegal: the fallback checks, with the penalty); default true, rlcard's
                        rules
  describe_hand:        true: each state also names the seat's hand ("You hold: pair." / "weak starting
                        hand" preflop, by the rule-based opponents' strength bands); default false
  reward:               chips (default: the seat's net chips for the hand) | allin_ev: after an all-in before
                        the river, the seat's expected chips over the boards that could still come (the same
                        expectation, far less luck; see table.py); summaries add "expected_chips"
  postflop:             model (default: the model plays every street) | a rule-based policy name: a curriculum
                        of preflop decisions, that rule plays the model's seat from the flop on
  preflop:              all (default: rlcard's actions) | push_fold: the model's seat chooses between fold or
                        check (as rlcard and free_fold allow) and all in before the flop (call when the other
                        seat is already all in)

Defaults for SandboxAdapter: serializer `envstate->chat_prompt_v2`, penalty 2 chips (one big blind) for a
malformed or illegal reply, whose fallback is check if free, else fold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from echo2sdk.core import checks
from echo2sdk.errors import ConfigError, NameNotFound

from .opponents import OPPONENTS
from .table import POSTFLOP, PREFLOP, REWARDS
from .serializer import ChatPromptV2

__all__ = ["PokerPlugin", "ENV_IDS"]

ENV_IDS = {"nlhe_headsup_v1": 2, "nlhe_6max_v1": 6}
_OPTIONS = ("opponent", "seat", "opponent_model", "opponent_backend", "opponent_max_tokens", "opponent_temperature",
            "free_fold", "describe_hand", "reward", "postflop", "preflop")


class PokerPlugin:
    scheme = "poker"
    default_serializer = "envstate->chat_prompt_v2"
    default_penalty = 2.0
    eval_paired_metrics = ("expected_chips",)  # echo2 eval compares it hand by hand between rows (reward = allin_ev)

    def env_ids(self) -> Sequence[str]:
        return tuple(ENV_IDS)

    def check(self, env_id: str, options: Mapping[str, Any]) -> None:
        if env_id not in ENV_IDS:
            raise NameNotFound("poker env", env_id, ENV_IDS)
        for key in options:
            if key not in _OPTIONS:
                raise ConfigError(f"poker://{env_id}: unknown env_options key {key!r} (known: {', '.join(_OPTIONS)})")
        n = ENV_IDS[env_id]
        opp = options.get("opponent", "mixed")
        names = list(opp) if isinstance(opp, (list, tuple)) else [opp]
        for name in names:
            if name not in OPPONENTS:
                raise NameNotFound("poker opponent", str(name), OPPONENTS)
        if isinstance(opp, (list, tuple)) and len(names) != n - 1:
            raise ConfigError(f"poker://{env_id}: env_options.opponent lists {len(names)} policies for {n - 1} other seats")
        for key in ("free_fold", "describe_hand"):
            if key in options and not isinstance(options[key], bool):
                raise ConfigError(f"poker://{env_id}: env_options.{key} must be true or false, got {options[key]!r}")
        if options.get("reward", "chips") not in REWARDS:
            raise ConfigError(f"poker://{env_id}: env_options.reward must be one of {', '.join(REWARDS)}, got {options['reward']!r}")
        if options.get("postflop", "model") not in POSTFLOP:
            raise ConfigError(f"poker://{env_id}: env_options.postflop must be one of {', '.join(POSTFLOP)}, got {options['postflop']!r}")
        if options.get("preflop", "all") not in PREFLOP:
            raise ConfigError(f"poker://{env_id}: env_options.preflop must be one of {', '.join(PREFLOP)}, got {options['preflop']!r}")
        seat = options.get("seat", 0)
        checks.integer(f"poker://{env_id} env_options.seat", seat, lo=0, hi=n - 1, error=ConfigError)

    def make(self, env_id: str, options: Mapping[str, Any]):
        from .table import PokerSandbox

        self.check(env_id, options)
        return PokerSandbox(ENV_IDS[env_id], options)

    def summarize(self, extras: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Per-cell statistics of evaluated hands (`echo2 eval` prints them under the table): how often the seat
        won chips, folded preflop, folded at all, and put chips in preflop voluntarily (VPIP: a call or a raise);
        and the preflop fold rate of weak and of premium-or-strong starting hands (a policy that reads its hand
        folds the first far more often); with env_options.reward = allin_ev the mean all-in expectation too."""
        def rate(key: str, hands: Sequence[Mapping[str, Any]] = extras) -> float:
            return sum(bool(e.get(key)) for e in hands) / max(1, len(hands))

        out = {"hands": len(extras), "win_rate": rate("won"), "fold_preflop_rate": rate("fold_preflop"),
               "fold_rate": rate("folded"), "vpip_rate": rate("vpip")}
        for label, bands in (("weak", ("weak",)), ("strong", ("premium", "strong"))):  # folds by starting hand
            hands = [e for e in extras if e.get("preflop_band") in bands]
            if hands:
                out[f"fold_preflop_{label}_rate"] = rate("fold_preflop", hands)
        expected = [e["expected_chips"] for e in extras if "expected_chips" in e]  # env_options.reward = allin_ev
        if expected:
            out["expected_chips_mean"] = sum(expected) / len(expected)
        return out

    def components(self) -> Mapping[str, Mapping[str, Any]]:
        return {"serializer": {"envstate->chat_prompt_v2": ChatPromptV2()}}
