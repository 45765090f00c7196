"""echo2-math: a math task adapter for echo2sdk.

    from echo2_math import MathAdapter
    adapter = MathAdapter(difficulty=1)
    task = next(adapter.tasks(seed=0))
    adapter.score(task, "3 + 5 = 8, so \\boxed{8}")

Importing this package is cheap: math-verify (and sympy) load on the first score, pyarrow on the
first Parquet file.
"""

from __future__ import annotations

from .adapter import DEFAULT_SYSTEM_PROMPT, MathAdapter
from .problems import Problem

__all__ = ["MathAdapter", "Problem", "DEFAULT_SYSTEM_PROMPT"]
__version__ = "0.1.0"
