"""echo2-reverse: reverse a short word. A minimal third-party echo2sdk TaskAdapter (single-turn)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from echo2sdk import Score, Task
from echo2sdk.errors import ConfigError

__all__ = ["ReverseAdapter", "WORDS"]

WORDS = ("cat", "dog", "sun", "map", "pen", "cup", "hat", "box", "star", "frog", "lamp", "milk")


class ReverseAdapter:
    """tasks(seed): "Reverse the word: cat" prompts; score: 1.0 if exact, else the share of letters in place."""

    def __init__(self, words: list[str] | None = None, system_prompt: str = "Reply with the reversed word only."):
        words = list(WORDS) if words is None else words
        if not isinstance(words, list) or not words or not all(isinstance(w, str) and w.isalpha() for w in words):
            raise ConfigError(f"echo2-reverse: words = {words!r} must be a non-empty list of alphabetic strings")
        self.words, self.system_prompt = words, system_prompt

    def spec(self) -> tuple[str, dict]:
        return "reverse", {"words": self.words, "system_prompt": self.system_prompt}

    def tasks(self, seed: int) -> Iterator[Task]:
        rng = random.Random(seed)
        for i in itertools.count():
            w = rng.choice(self.words)
            messages = ({"role": "system", "content": self.system_prompt}, {"role": "user", "content": f"Reverse the word: {w}"})
            yield Task(id=f"rev-{seed}-{i}", messages=messages, answer=w[::-1])

    def score(self, task: Task, response: str) -> Score:
        guess = response.strip().strip(".").lower() if isinstance(response, str) else ""
        if guess == task.answer:
            return Score(reward=1.0, correct=True)
        hits = sum(a == b for a, b in zip(guess, task.answer))
        return Score(reward=0.5 * hits / len(task.answer), correct=False, info={"hits": hits})
