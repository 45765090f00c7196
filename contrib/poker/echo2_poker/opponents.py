"""Opponents for the seats the model does not play: three rule-based policies and an LLM.

Each policy sees only its own seat's view (the same state dict the model's serializer gets) and
returns a legal action name. Rule-based policies draw from the episode's seeded RNG, so one seed gives
one game for a given sequence of model actions.

- `calling_station` never folds and never raises: checks, else calls.
- `tight_aggressive` plays strong starting hands, raises made hands (two pair or better), calls a pair,
  and otherwise checks or folds to a bet.
- `loose_aggressive` plays most hands and bets often: raises any pair or a decent preflop hand, bluffs
  with probability 0.3, rarely folds.
- `llm` asks a language model (default: the base SmolLM2-135M-Instruct) through an echo2sdk inference
  backend, with the same prompt and answer format as the model in training; a malformed reply gets the
  sandbox's fallback.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from .cards import hand_category, preflop_strength

__all__ = ["CallingStation", "TightAggressive", "LooseAggressive", "LLMOpponent", "RULE_BASED", "OPPONENTS", "fallback"]


def fallback(legal: Sequence[str]) -> str:
    """The defined action for a malformed or illegal reply: check if free, else fold."""
    return "check" if "check" in legal else "fold"


def _passive(legal: Sequence[str]) -> str:
    return "check" if "check" in legal else "call" if "call" in legal else legal[0]


def _raise(legal: Sequence[str], big: bool) -> str:
    order = ("raise_pot", "raise_half_pot", "all_in") if big else ("raise_half_pot", "raise_pot")
    return next((a for a in order if a in legal), _passive(legal))


def _made(state: Mapping[str, Any]) -> int:
    return hand_category(list(state["hand"]) + list(state["board"]))


def _playable(state: Mapping[str, Any]) -> bool:
    """A pair or better after the flop, a preflop strength of at least 0.5 before it (loose_aggressive's raise)."""
    return _made(state) >= 1 if state["board"] else preflop_strength(state["hand"]) >= 0.5


class CallingStation:
    name = "calling_station"

    def act(self, state: Mapping[str, Any], legal: Sequence[str], rng: random.Random) -> str:
        return _passive(legal)


class TightAggressive:
    name = "tight_aggressive"

    def act(self, state: Mapping[str, Any], legal: Sequence[str], rng: random.Random) -> str:
        if not state["board"]:
            s = preflop_strength(state["hand"])
            if s >= 0.75:
                return _raise(legal, big=True)
            if s >= 0.55 or (state["to_call"] <= 1 and s >= 0.4):
                return _passive(legal)
            return fallback(legal)
        made = _made(state)
        if made >= 2:
            return _raise(legal, big=True)
        if made == 1:
            return _passive(legal)
        return fallback(legal)


class LooseAggressive:
    name = "loose_aggressive"

    def act(self, state: Mapping[str, Any], legal: Sequence[str], rng: random.Random) -> str:
        if _playable(state) or rng.random() < 0.3:
            return _raise(legal, big=rng.random() < 0.4)
        if state["to_call"] > state["pot"] and rng.random() < 0.5:
            return fallback(legal)
        return _passive(legal)


@cache
def _backend(model: str, backend: str):
    from echo2sdk.plugins import load_backend_class

    return load_backend_class(backend)(model)


class LLMOpponent:
    name = "llm"

    def __init__(self, model: str = "smollm2-135m", backend: str = "hf", max_new_tokens: int = 16, temperature: float = 0.7):
        from echo2sdk.adapters.components import AnswerTagRenderer

        from .serializer import ChatPromptV2

        self.model, self.backend_name = model, backend
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.serializer, self.renderer = ChatPromptV2(), AnswerTagRenderer()
        self.replies = 0
        self.fallbacks = 0

    def act(self, state: Mapping[str, Any], legal: Sequence[str], rng: random.Random) -> str:
        from echo2sdk.adapters.contracts import Observation
        from echo2sdk.core.contracts import SamplingParams

        obs = Observation(state=state, legal=tuple(legal))
        messages = [
            {"role": "system", "content": self.serializer.system("poker")},
            {"role": "user", "content": self.serializer.user(obs, 1) + "\n" + self.renderer.instructions(legal)},
        ]
        backend = _backend(self.model, self.backend_name)
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=rng.randrange(2**31))
        (sample,) = backend.generate([backend.encode_chat(messages)], params)
        parsed = self.renderer.parse(sample.text, legal)
        self.replies += 1
        if parsed.status != "ok" or parsed.action is None:
            self.fallbacks += 1
            return fallback(legal)
        return parsed.action


RULE_BASED = ("calling_station", "tight_aggressive", "loose_aggressive")
OPPONENTS = (*RULE_BASED, "llm", "mixed")
_RULES = {"calling_station": CallingStation, "tight_aggressive": TightAggressive, "loose_aggressive": LooseAggressive}


def make_opponent(name: str, seat_rng: random.Random, llm_options: Mapping[str, Any]):
    """A policy by name; "mixed" draws one of the three rule-based policies from `seat_rng`."""
    if name == "mixed":
        name = seat_rng.choice(RULE_BASED)
    if name == "llm":
        return LLMOpponent(**dict(llm_options))
    return _RULES[name]()
