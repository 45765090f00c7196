"""A task adapter whose score fails on some tasks: raises (every 5th task from the 2nd), returns NaN (from the
3rd) or the string "0.1" (from the 4th); the rest are scored as ToyAdapter scores them. Loaded by worker
processes as "_flaky_adapter:FlakyAdapter" (tests/security on PYTHONPATH)."""

from __future__ import annotations

import math

from echo2sdk.core.contracts import Score
from echo2sdk.testing import ToyAdapter


class FlakyAdapter(ToyAdapter):
    def score(self, task, response: str):
        kind = int(task.id.rsplit("-", 1)[1]) % 5
        if kind == 1:
            raise KeyError("the grader lost its answer key")
        if kind == 2:
            return Score(reward=math.nan)
        if kind == 3:
            return Score(reward="0.1")  # type: ignore[arg-type] - what a careless adapter returns
        return super().score(task, response)
