"""PokerSandbox: one no-limit hold'em hand on pettingzoo's texas_holdem_no_limit_v6 (rlcard), seen from
the model's seat. Other seats play the configured opponents inside `reset` and `step`.

Rewards are chips (blinds 1/2, 100-chip stacks): the seat's net chip change for the hand arrives as the
last step's reward, read from AEC `last()` when the hand is over. A hand that ends before the model's
seat acts (everyone folds to its big blind) is re-dealt from a seed derived from the episode seed, so
every episode has at least one decision and one seed always gives the same hand.

env_options.reward = "allin_ev" swaps luck for its expectation where no decision is left: when the hand went
to showdown after an all-in before the river, the seat's reward is its mean result over the boards that could
have come (all of them after a flop all-in, `ALLIN_EV_SAMPLES` drawn ones after a preflop all-in), split by
rlcard's own judge; the dealt board would be one of them. The expectation is the same as the chips' (the
remaining cards are drawn from the same deck either way), the variance far lower: a call with the worst hand
no longer pays because this deal's river did. `summary()` keeps the dealt result as "chips".

env_options.postflop = "tight_aggressive" (or another rule-based policy) is a curriculum of preflop decisions:
the model's seat decides before the flop only, and that rule plays its hand from the flop on (inside `step`, as
the opponents play theirs). The default "model" leaves every decision to the model. env_options.preflop =
"push_fold" narrows the seat's preflop choices to fold or check (whichever rlcard and free_fold allow) and all in
(call when all in is not legal: the other seat already is): the short-stack game where the only question is which
hands to play.
"""

from __future__ import annotations

import itertools
import math
import random
import warnings
from collections.abc import Mapping
from typing import Any

from echo2sdk.adapters.contracts import Observation, Transition
from echo2sdk.errors import AdapterError, DependencyNotInstalled

from .cards import card_text, describe_hand, preflop_band
from .opponents import RULE_BASED, fallback, make_opponent

__all__ = ["PokerSandbox", "ACTIONS"]

ACTIONS = ("fold", "check_call", "raise_half_pot", "raise_pot", "all_in")  # rlcard Action values 0..4
_REDEALS = 64
ALLIN_EV_SAMPLES = 400  # boards drawn for a preflop all-in (C(48, 5) is too many)
_ENUMERATE_UP_TO = 1000  # runouts enumerated: a heads-up flop all-in's C(45, 2) = 990, any turn all-in's
_BOARD_KNOWN = {"preflop": 0, "flop": 3, "turn": 4}  # cards on the board while that street's betting went on
REWARDS = ("chips", "allin_ev")
POSTFLOP = ("model", *RULE_BASED)  # who plays the model's seat from the flop on
PREFLOP = ("all", "push_fold")  # the model's seat's preflop choices: rlcard's, or fold/check and all in
_PUSH_FOLD = ("fold", "check", "all_in")


def _example(stage, position, hand, board, pot, to_call, stack, other_stack, history, names, action):
    you, other = ("P1", "P0") if position == "big blind" else ("P0", "P1")
    state = {"you": you, "position": position, "stage": stage, "hand": hand, "board": board, "pot": pot,
             "to_call": to_call, "stack": stack, "in_pot": 100 - stack,
             "opponents": [{"seat": other, "stack": other_stack, "in_pot": 100 - other_stack, "folded": False}],
             "history": history}
    return state, names, action


_EXAMPLE_FOLD = _example("preflop", "big blind", ["9c", "4d"], [], 8, 4, 98, 94, ["[preflop]", "P0 raise_pot 6"],
                         ("fold", "call", "raise_pot", "all_in"), "fold")
_EXAMPLE_RAISE = _example("flop", "small blind", ["Kh", "Qh"], ["Ks", "7d", "2h"], 4, 0, 98, 98,
                          ["[preflop]", "you call 2", "P1 check"],
                          ("fold", "check", "raise_half_pot", "raise_pot", "all_in"), "raise_half_pot")
_EXAMPLE_SHOVE = _example("preflop", "small blind", ["As", "Ad"], [], 3, 1, 99, 98, [],
                          ("fold", "call", "raise_pot", "all_in"), "all_in")


def _make_env(num_players: int):
    try:
        with warnings.catch_warnings():  # gymnasium warns about float64 Box bounds in pettingzoo's spaces
            warnings.simplefilter("ignore")
            from pettingzoo.classic.rlcard_envs import texas_holdem_no_limit

            return texas_holdem_no_limit.env(num_players=num_players)
    except ImportError as e:
        err = DependencyNotInstalled(e.name or "pettingzoo", "poker")
        Exception.__init__(err, f"{e.name} is not installed: run  pip install \"echo2-poker\" (pettingzoo, rlcard, pygame-ce)")
        raise err from e


class PokerSandbox:
    def __init__(self, num_players: int, options: Mapping[str, Any]):
        self.n = num_players
        self.seat = int(options.get("seat", 0))
        opp = options.get("opponent", "mixed")
        self.opponent_names = list(opp) if isinstance(opp, (list, tuple)) else [opp] * (num_players - 1)
        self.llm_options = {
            k.removeprefix("opponent_"): v
            for k, v in options.items()
            if k in ("opponent_model", "opponent_backend", "opponent_max_tokens", "opponent_temperature")
        }
        if "max_tokens" in self.llm_options:
            self.llm_options["max_new_tokens"] = self.llm_options.pop("max_tokens")
        # false: folding is not a legal action when checking is free (it can only lose what checking keeps)
        self.free_fold = bool(options.get("free_fold", True))
        # true: the state also names the seat's hand ("pair", "weak starting hand"): a small model reads cards badly
        self.describe_hand = bool(options.get("describe_hand", False))
        self.allin_ev = options.get("reward", "chips") == "allin_ev"
        postflop = options.get("postflop", "model")
        self.postflop = None if postflop == "model" else make_opponent(postflop, random.Random(0), {})
        self.push_fold = options.get("preflop", "all") == "push_fold"
        self.env = _make_env(num_players)
        self.agent = f"player_{self.seat}"
        self.chips = 0.0
        self.decisions = 0
        self.hand_seed = 0
        self.over = False

    # -- views -----------------------------------------------------------------------------------
    @property
    def _raw(self):
        return self.env.unwrapped.env

    def _name(self, player: int, viewer: int) -> str:
        return "you" if player == viewer else f"P{player}"

    def _position(self, player: int) -> str:
        g = self._raw.game
        d = g.dealer_id
        sb, bb = (d + 1) % self.n, (d + 2) % self.n
        if player == bb:
            return "big blind"
        if player == sb:
            return "small blind"
        if player == d:
            return "button"
        return f"{(player - bb) % self.n} after the big blind"

    def _view(self, player: int) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The state `player` may see, and its legal action names. Never another seat's hole cards."""
        raw = self._raw.get_state(player)
        obs = raw["raw_obs"]
        to_call = int(max(obs["all_chips"]) - obs["my_chips"])
        names = []
        for a in raw["raw_legal_actions"]:
            name = ACTIONS[int(a.value)]
            names.append(("check" if to_call == 0 else "call") if name == "check_call" else name)
        names = self._narrow(names, to_call, obs["stage"].name == "PREFLOP", player == self.seat)
        players = self._raw.game.players
        state = {
            "you": f"P{player}",
            "position": self._position(player),
            "stage": obs["stage"].name.lower(),
            "hand": [card_text(c) for c in obs["hand"]],
            "board": [card_text(c) for c in obs["public_cards"]],
            "pot": int(obs["pot"]),
            "to_call": to_call,
            "stack": int(obs["stakes"][player]),
            "in_pot": int(obs["my_chips"]),
            "opponents": [
                {
                    "seat": f"P{j}",
                    "stack": int(obs["stakes"][j]),
                    "in_pot": int(obs["all_chips"][j]),
                    "folded": players[j].status.name == "FOLDED",
                }
                for j in range(self.n)
                if j != player
            ],
            "history": self._history(player),
        }
        if self.describe_hand and player == self.seat:  # the model's seat only: the LLM opponent's view is unchanged
            state["hand_strength"] = describe_hand(state["hand"], state["board"])
        return state, tuple(names)

    def _narrow(self, names: list[str], to_call: int, preflop: bool, mine: bool) -> list[str]:
        """rlcard's legal action names as the options narrow them: no fold when checking is free (free_fold =
        false), fold-or-all-in for the model's seat before the flop (preflop = push_fold)."""
        if to_call == 0 and not self.free_fold and "fold" in names:
            names = [a for a in names if a != "fold"]
        if self.push_fold and mine and preflop:
            names = [a for a in names if a in _PUSH_FOLD or (a == "call" and "all_in" not in names)]
        return names

    def example_turns(self) -> list[tuple[Observation, str]]:
        """Two worked turns for the prompt, in this table's view of them: the options that change a state (the
        hand line, the legal actions) change the examples too. A weak hand folded to a raise; then a pair raised
        on the flop, or under push_fold (where the model decides preflop) a premium hand moved all in."""
        out = []
        for state, names, action in (_EXAMPLE_FOLD, _EXAMPLE_SHOVE if self.push_fold else _EXAMPLE_RAISE):
            state = {**state, "opponents": [dict(o) for o in state["opponents"]], "history": list(state["history"])}
            if self.describe_hand:
                state["hand_strength"] = describe_hand(state["hand"], state["board"])
            legal = self._narrow(list(names), state["to_call"], state["stage"] == "preflop", True)
            out.append((Observation(state=state, legal=tuple(legal)), action))
        return out

    def _history(self, viewer: int) -> list[str]:
        out, stage = [], None
        for st, player, action, amount in self.log:
            if st != stage:
                out.append(f"[{st}]")
                stage = st
            word = f"{self._name(player, viewer)} {action}"
            out.append(word + (f" {amount}" if action not in ("fold", "check") else ""))
        return out

    # -- play --------------------------------------------------------------------------------------
    def _act(self, player: int, name: str) -> None:
        stage = self._raw.game.stage.name.lower()
        value = ACTIONS.index("check_call" if name in ("check", "call") else name)
        self.env.step(value)
        self.log.append((stage, player, name, int(self._raw.game.players[player].in_chips)))

    def _advance(self) -> tuple[Observation | None, float]:
        env, reward = self.env, 0.0
        for agent in env.agent_iter():
            _, rew, term, trunc, _ = env.last()
            player = int(agent.rsplit("_", 1)[1])
            if agent == self.agent:
                reward += float(rew)
                if term or trunc:
                    self.over = True
                    return None, reward
                state, legal = self._view(player)
                if self.postflop is not None and state["board"]:  # the curriculum's rule plays the seat's postflop
                    self.ruled.add(len(self.log))  # not the model's decision: summary() leaves it out
                    self._act(player, self.postflop.act(state, legal, self.rng))
                    continue
                return Observation(state=state, legal=legal), reward
            if term or trunc:
                env.step(None)
                continue
            state, legal = self._view(player)
            self._act(player, self.policies[player].act(state, legal, self.rng))
        self.over = True
        return None, reward

    def allin_expectation(self) -> float | None:
        """The seat's expected chips over the boards still to come when the last decision of a finished hand was
        made before the river and the hand went to showdown (an all-in); None otherwise (a fold ended it, or the
        betting reached the river)."""
        game = self._raw.game
        known = _BOARD_KNOWN.get(self.log[-1][0]) if self.log else None
        alive = [p for p in game.players if p.status.name != "FOLDED"]
        if known is None or len(alive) < 2 or game.players[self.seat].status.name == "FOLDED":
            return None
        board, pool = self.unseen(known)
        need = 5 - known
        if math.comb(len(pool), need) <= _ENUMERATE_UP_TO:
            boards = list(itertools.combinations(pool, need))
        else:
            rng = random.Random(f"{self.hand_seed}|allin_ev")
            boards = [rng.sample(pool, need) for _ in range(ALLIN_EV_SAMPLES)]
        total = 0.0
        for rest in boards:
            hands = [p.hand + board + list(rest) if p.status.name != "FOLDED" else None for p in game.players]
            total += game.judger.judge_game(game.players, hands)[self.seat]
        return total / len(boards)

    def unseen(self, known: int) -> tuple[list, list]:
        """The first `known` board cards, and every card neither on them nor in any seat's hand (folded ones
        too: the deck the rest of the board was dealt from). rlcard Card objects."""
        game = self._raw.game
        return list(game.public_cards[:known]), list(game.dealer.deck) + list(game.public_cards[known:])

    def reset(self, seed: int) -> Observation:
        for k in range(_REDEALS):
            s = seed if k == 0 else random.Random(f"{seed}|redeal|{k}").randrange(2**31)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.env.reset(seed=s)
            self.rng, self.hand_seed = random.Random(s), s
            others = [j for j in range(self.n) if j != self.seat]
            self.policies = {
                j: make_opponent(self.opponent_names[i % len(self.opponent_names)], self.rng, self.llm_options)
                for i, j in enumerate(others)
            }
            self.log: list[tuple[str, int, str, int]] = []
            self.ruled: set[int] = set()  # indices into log of the seat's actions env_options.postflop's rule took
            self.chips, self.decisions, self.over = 0.0, 0, False
            self.expected: float | None = None  # allin_expectation() of the finished hand, when computed
            obs, reward = self._advance()
            if obs is not None:
                self.chips += reward
                return obs
        raise AdapterError(f"poker: no deal in {_REDEALS} where seat {self.seat} acts (seed {seed})")

    def step(self, action: str) -> Transition:
        if self.over:
            raise AdapterError("poker: step() after the hand is over")
        self._act(self.seat, action)
        self.decisions += 1
        obs, reward = self._advance()
        self.chips += reward
        if self.over and self.allin_ev:  # the hand's chips (self.chips, all of it in this reward) -> their expectation
            ev = self.allin_expectation()
            if ev is not None:
                reward = reward - self.chips + ev  # the whole hand's chips came in this reward: exactly ev
                self.expected = ev
        return Transition(obs, reward)

    def fallback(self, observation: Observation) -> str:
        return fallback(observation.legal)

    def forfeit(self) -> float:
        """The seat folds now; the hand plays out among the others. Returns the chips that adds."""
        if self.over:
            return 0.0
        return self.step("fold").reward

    def summary(self) -> dict[str, Any]:
        # the model's own actions (a fallback's fold counts; the postflop rule's do not)
        mine = [(stage, name) for i, (stage, player, name, _) in enumerate(self.log) if player == self.seat and i not in self.ruled]
        return {
            "chips": self.chips,
            # with reward = allin_ev: the reward handed out (the all-in expectation, else the chips)
            **({"expected_chips": self.chips if self.expected is None else self.expected} if self.allin_ev else {}),
            "won": self.chips > 0,
            # what the seat played (a fallback's fold counts): the degenerate policy folds preflop every hand
            "fold_preflop": ("preflop", "fold") in mine,
            "folded": any(name == "fold" for _, name in mine),
            "vpip": any(stage == "preflop" and name not in ("fold", "check") for stage, name in mine),
            # the seat's starting hand (whatever the prompt shows): does the policy fold by hand or regardless?
            "preflop_band": preflop_band([card_text(c) for c in self._raw.get_state(self.seat)["raw_obs"]["hand"]]),
            "decisions": self.decisions,
            "hand_seed": self.hand_seed,
            "opponent": ",".join(sorted({p.name for p in self.policies.values()})),
        }

    def close(self) -> None:
        self.env.close()
