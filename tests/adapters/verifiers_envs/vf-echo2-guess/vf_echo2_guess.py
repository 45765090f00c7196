"""vf-echo2-guess: a multi-turn verifiers environment. The model guesses a secret number in 1..16; after
each guess the environment answers "higher" or "lower" (env_response), and ends the rollout when the
guess is right (final_env_response) or after max_turns guesses. The rubric: solved (1.0) plus a bonus
for fewer turns. Secrets come from the in-memory dataset, so a row always plays the same game."""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

RULES = (
    "I am thinking of a whole number from 1 to 16. Guess it. After each guess I say 'higher' or 'lower'. "
    "Reply with your guess only, e.g. 8."
)


def _last_number(messages) -> int | None:
    text = ""
    for m in reversed(messages):
        if (m["role"] if isinstance(m, dict) else m.role) == "assistant":
            text = (m["content"] if isinstance(m, dict) else m.content) or ""
            break
    found = re.findall(r"-?\d+", str(text))
    return int(found[-1]) if found else None


class GuessEnv(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        secret, guess = int(state["answer"]), _last_number(messages)
        if guess is None:
            return [vf.UserMessage(content="Please reply with a number from 1 to 16.")]
        if guess == secret:
            state["solved"] = True
            state["final_env_response"] = [vf.UserMessage(content="Correct!")]
            return state["final_env_response"]
        hint = "higher" if guess < secret else "lower"
        return [vf.UserMessage(content=f"{guess} is wrong: the number is {hint}. Guess again.")]


def load_environment(num_games: int = 16, max_turns: int = 5, seed: int = 0) -> vf.Environment:
    rng = random.Random(seed)
    rows = [{"question": RULES, "answer": str(rng.randint(1, 16))} for _ in range(num_games)]

    def solved(state, **kwargs) -> float:
        return 1.0 if state.get("solved") else 0.0

    async def fewer_turns(state, **kwargs) -> float:
        if not state.get("solved"):
            return 0.0
        return (max_turns - len(state["trajectory"]) + 1) / max_turns

    rubric = vf.Rubric(funcs=[solved, fewer_turns], weights=[1.0, 0.5])
    return GuessEnv(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=max_turns)
