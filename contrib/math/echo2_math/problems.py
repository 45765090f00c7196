"""Procedural arithmetic problems, one generator per difficulty level.

Level 1 is meant to be within reach of a 135M instruct model ("What is 3 + 5?"), so that GRPO
groups have non-zero reward variance from the first step; each level above adds one idea.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Problem", "LEVELS", "generate", "format_fraction"]

LEVELS = range(1, 6)


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # canonical form: "8", "-3", "5/6"
    working: str = ""  # one line of working that ends at the answer, for worked examples


def format_fraction(value: Fraction) -> str:
    """Reduced fraction "p/q", or the integer when q == 1 (Fraction is always reduced)."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _level1(rng: random.Random) -> Problem:
    # single-digit addition
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return Problem(f"What is {a} + {b}?", str(a + b), f"{a} + {b} = {a + b}")


def _level2(rng: random.Random) -> Problem:
    # two-digit addition or subtraction; subtraction never goes below zero
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if rng.random() < 0.5:
        return Problem(f"What is {a} + {b}?", str(a + b), f"{a} + {b} = {a + b}")
    a, b = max(a, b), min(a, b)
    return Problem(f"What is {a} - {b}?", str(a - b), f"{a} - {b} = {a - b}")


def _level3(rng: random.Random) -> Problem:
    # a 1-2 digit number times a small factor
    a, b = rng.randint(2, 99), rng.randint(2, 12)
    if rng.random() < 0.5:
        a, b = b, a
    return Problem(f"What is {a} × {b}?", str(a * b), f"{a} × {b} = {a * b}")


def _level4(rng: random.Random) -> Problem:
    # one-step linear equation with a positive integer solution
    form = rng.randrange(4)
    if form == 0:
        x, a = rng.randint(1, 20), rng.randint(1, 20)
        equation = f"x + {a} = {x + a}"
    elif form == 1:
        x = rng.randint(2, 30)
        a = rng.randint(1, x - 1)
        equation = f"x - {a} = {x - a}"
    elif form == 2:
        x, a = rng.randint(1, 12), rng.randint(2, 9)
        equation = f"{a}x = {a * x}"
    else:
        b, a = rng.randint(1, 12), rng.randint(2, 9)
        x = a * b
        equation = f"x / {a} = {b}"
    return Problem(f"Solve for x: {equation}", str(x), f"From {equation}, x = {x}")


def _level5(rng: random.Random) -> Problem:
    # two proper fractions with one-digit denominators, one operation
    def fraction() -> Fraction:
        q = rng.randint(2, 9)
        return Fraction(rng.randint(1, q - 1), q)

    p, q = fraction(), fraction()
    op = rng.choice("+-×÷")
    value = {"+": p + q, "-": p - q, "×": p * q, "÷": p / q}[op]
    return Problem(
        f"What is {format_fraction(p)} {op} {format_fraction(q)}? Give the answer as a reduced fraction.",
        format_fraction(value),
        f"{format_fraction(p)} {op} {format_fraction(q)} = {format_fraction(value)}",
    )


_GENERATORS = {1: _level1, 2: _level2, 3: _level3, 4: _level4, 5: _level5}


def generate(rng: random.Random, difficulty: int) -> Problem:
    """One problem at `difficulty` (1..5), drawing only from `rng` (so a seeded rng gives a fixed stream)."""
    return _GENERATORS[difficulty](rng)
