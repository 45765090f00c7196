"""vf-echo2-arith: a single-turn verifiers environment. Seeded integer arithmetic; the model answers in
<answer>...</answer>; the rubric is exact match (an async reward function, weight 1) plus a format
reward (weight 0.2). The dataset is built in memory."""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset

SYSTEM = "Solve the arithmetic problem. Reply with the number only, as <answer>NUMBER</answer>."


def _problems(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(2, 30), rng.randint(2, 30), rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        rows.append({"question": f"What is {a} {op} {b}?", "answer": str(value)})
    return rows


def load_environment(num_problems: int = 32, seed: int = 0) -> vf.Environment:
    parser = vf.XMLParser(["answer"], answer_field="answer")

    async def exact_match(completion, answer, **kwargs) -> float:
        guess = parser.parse_answer(completion)
        return 1.0 if guess is not None and guess.strip() == answer else 0.0

    def format_ok(completion, **kwargs) -> float:
        return 1.0 if parser.parse_answer(completion) is not None else 0.0

    rubric = vf.Rubric(funcs=[exact_match, format_ok], weights=[1.0, 0.2], parser=parser)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(_problems(num_problems, seed)),
        system_prompt=SYSTEM,
        parser=parser,
        rubric=rubric,
    )
