"""`ToyAdapter`: a torch-free task adapter for protocol tests (registered as the `toy` adapter)."""

from __future__ import annotations

import random
from itertools import count

from echo2sdk.core.contracts import Score, Task

__all__ = ["ToyAdapter"]


class ToyAdapter:
    """A torch-free task for protocol tests: "repeat the word"; reward 1 if the response is the word."""

    WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")

    def __init__(self, prefix: str = "t"):
        self.prefix = prefix

    def tasks(self, seed: int):
        rng = random.Random(seed)
        for i in count():
            word = rng.choice(self.WORDS)
            yield Task(id=f"{self.prefix}{seed}-{i}", messages=({"role": "user", "content": f"Say {word}."},), answer=word)

    def score(self, task, response: str):
        ok = response.strip() == task.answer
        return Score(reward=1.0 if ok else 0.0, correct=ok)
