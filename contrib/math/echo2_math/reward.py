"""Scoring: a strict format check (exactly one balanced \\boxed{...}) and correctness by math-verify.

R(x, y) = 1.0 * correct + format_reward * format_ok, where `correct` requires `format_ok`.

math-verify bounds its own run time with signal.alarm, which only works on the main thread, and
rollout workers score off it. So parsing and verification run without math-verify's timeout, and
instead a boxed answer reaches sympy only if it passes `unsafe_reason`: a cheap, best-effort screen
for the inputs known to make sympy run for minutes (nested or large powers of symbolic
expressions, huge factorials, big operators). No real answer needs them; a screened answer scores
as wrong, with the reason in Score.info.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from typing import Any

from echo2sdk.core.contracts import Score

__all__ = ["find_boxes", "unsafe_reason", "is_equivalent", "score_response", "math_scorer", "MAX_ANSWER_CHARS"]

BOX = "\\boxed"
MAX_ANSWER_CHARS = 100  # longer boxed answers are never verified (parsing cost grows with length)
_SHOWN_CHARS = 200  # how much of the boxed text Score.info keeps

_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped char, or a brace
_BIG_OPERATORS = re.compile(r"\\(?:sum|prod|coprod|int|iint|iiint|oint|lim|binom|dbinom|tbinom|choose)(?![a-zA-Z])")
_TEXT_GROUPS = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_COMMANDS = re.compile(r"\\[a-zA-Z]+")
_LEADING_ASSIGNMENT = re.compile(r"^\s*[a-zA-Z]\s*=")
_EXPONENT_TOKEN = re.compile(r"\d+|\\[a-zA-Z]+|.", re.DOTALL)
_FACTORIAL_OPERAND = re.compile(r"(\d+|[a-zA-Z])\s*$")

# Budgets, measured on sympy through math-verify. A symbolic answer is screened by an estimate of
# the number of terms its expansion can reach (verify simplifies gold - answer): (x+y+z+1)^{12}
# (455 terms) and (a+b)(c+d)...(o+p) (256) take ~1.5 s each, (a+b+c+d+e+f)^{12} over 20 s,
# (x+1)^{999} and (x+y+z+1)^{30} minutes; 64 terms stay well under a second. A numeric answer is screened by the sum of its exponents: 9^{999} is fast, an
# exact 9^{99999} or 99^{999}^{999} is not worth computing.
_MAX_EXPANSION_TERMS = 64
_SYMBOLIC_EXPONENT_BUDGET = 100
_NUMERIC_EXPONENT_BUDGET = 1000
_MAX_FACTORIAL_DIGITS = 3  # 999! is fast, 1000000! takes seconds
_OPENERS = {"(": ")", "[": "]", "{": "}"}


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the brace closing the one at text[start], skipping escaped chars (\\{ \\} \\\\)."""
    depth = 0
    for m in _BRACE_TOKENS.finditer(text, start):
        token = m.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return m.start()
    return None


def find_boxes(text: str) -> tuple[list[str], str | None]:
    """The contents of the \\boxed{...} groups in `text`, and the first structural problem found
    ("unbraced_box", "unbalanced_box", or None). Stops at the second box: two already fail the format,
    and stopping keeps the scan linear however many boxes a response nests."""
    contents: list[str] = []
    i = text.find(BOX)
    while i != -1:
        j = i + len(BOX)
        if j < len(text) and text[j].isalpha():  # another command, e.g. \boxedsymbol
            i = text.find(BOX, j)
            continue
        while j < len(text) and text[j] in " \t":
            j += 1
        if j >= len(text) or text[j] != "{":
            return contents, "unbraced_box"
        end = _closing_brace(text, j)
        if end is None:
            return contents, "unbalanced_box"
        contents.append(text[j + 1 : end])
        if len(contents) == 2:
            break
        i = text.find(BOX, j + 1)  # from inside the group, so a nested box counts as a second one
    return contents, None


def _exponent_tokens(s: str) -> list[str]:
    tokens = []
    for m in re.finditer(r"\^", s):
        j = m.end()
        while j < len(s) and s[j].isspace():
            j += 1
        if j < len(s) and s[j] == "{":
            end = _closing_brace(s, j)
            tokens.append(s[j + 1 : end] if end is not None else s[j + 1 :])
        else:
            t = _EXPONENT_TOKEN.match(s, j)
            tokens.append(t.group() if t else "")
    return tokens


def _closing_bracket(s: str, start: int) -> int:
    """Index of the bracket closing s[start] (any of ()[]{} counted together), or len(s)."""
    depth = 0
    for j in range(start, len(s)):
        if s[j] in _OPENERS:
            depth += 1
        elif s[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j
    return len(s)


def _expansion_terms(s: str) -> int:
    """Upper-bound-ish estimate of the terms in the full expansion of `s`: the product, over every
    bracketed group, of the monomials of (t terms)^e, C(t + e - 1, e). Stops early past the limit."""
    estimate = 1
    for i, ch in enumerate(s):
        if ch not in _OPENERS:
            continue
        end = _closing_bracket(s, i)
        inner, depth, terms = s[i + 1 : end], 0, 1
        for k, c in enumerate(inner):
            if c in _OPENERS:
                depth += 1
            elif c in ")]}":
                depth -= 1
            elif c in "+-" and depth == 0 and inner[:k].strip():
                terms += 1
        exponent = 1
        rest = s[end + 1 :].lstrip()
        if rest.startswith("^"):
            tokens = _exponent_tokens(rest)
            exponent = max(1, sum(int(d) for d in re.findall(r"\d+", tokens[0]))) if tokens else 1
        estimate *= math.comb(terms + exponent - 1, exponent)
        if estimate > _MAX_EXPANSION_TERMS:
            break
    return estimate


def unsafe_reason(answer: str) -> str | None:
    """Why sympy might take unbounded time on this boxed answer, or None if it looks safe."""
    if len(answer) > MAX_ANSWER_CHARS:
        return "too_long"
    if _BIG_OPERATORS.search(answer):
        return "big_operator"
    if "**" in answer:
        return "nested_power"
    for m in re.finditer("!", answer):
        operand = _FACTORIAL_OPERAND.search(answer, 0, m.start())
        if operand is None or len(operand.group(1)) > _MAX_FACTORIAL_DIGITS:
            return "large_factorial"
    total = 0
    for token in _exponent_tokens(answer):
        if "^" in token or "!" in token:
            return "nested_power"
        total += sum(int(d) for d in re.findall(r"\d+", token))
    bare = _COMMANDS.sub(" ", _TEXT_GROUPS.sub(" ", _LEADING_ASSIGNMENT.sub(" ", answer)))
    if re.search(r"[a-zA-Z]", bare):  # free symbols
        if total > _SYMBOLIC_EXPONENT_BUDGET or _expansion_terms(answer) > _MAX_EXPANSION_TERMS:
            return "large_expansion"
    elif total > _NUMERIC_EXPONENT_BUDGET:
        return "large_power"
    return None


def _drop_timeout_notice(record: logging.LogRecord) -> bool:
    """math-verify warns once per process that its timeout is off and the caller must bound run time;
    `unsafe_reason` is that bound, so the notice would only alarm users (it reached `echo2 eval`'s console)."""
    return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):  # getLogger does not import math_verify
    logging.getLogger(_name).addFilter(_drop_timeout_notice)


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> tuple[Any, ...]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    text = answer if BOX in answer else f"$\\boxed{{{answer}}}$"
    parsed = parse(text, extraction_config=[LatexExtractionConfig(boxed_match_priority=0)], parsing_timeout=None)
    if not parsed:  # plain-text gold that is not valid LaTeX, e.g. "3.5 hours"
        parsed = parse(
            answer, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None
        )
    return tuple(parsed)


def is_equivalent(gold: str, boxed: str) -> bool:
    """math-verify's judgement of a boxed answer against the gold answer, with no timeout set
    (safe off the main thread): screen `boxed` with `unsafe_reason` first."""
    from math_verify import LatexExtractionConfig, parse, verify

    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return False
    pred = parse(
        f"$\\boxed{{{boxed}}}$",
        extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
        parsing_timeout=None,
    )
    if not pred:
        return False
    return bool(verify(list(gold_parsed), pred, timeout_seconds=None))


def score_response(gold: str, response: str, format_reward: float) -> Score:
    """Score one response against the gold answer. Never raises on a malformed response; raises
    only if math-verify itself is not installed (a broken install, not a bad rollout)."""
    import math_verify  # noqa: F401  (fail loudly here rather than score every rollout 0)

    info: dict[str, Any] = {"format_ok": False, "extracted": None}
    if not isinstance(response, str):
        info["reason"] = "not_text"
        return Score(reward=0.0, correct=False, info=info)
    try:
        boxes, problem = find_boxes(response)
        if problem is None and not boxes:
            problem = "no_box"
        elif problem is None and len(boxes) > 1:
            problem = "multiple_boxes"
        elif problem is None and not boxes[0].strip():
            problem = "empty_box"
        if boxes:
            info["extracted"] = boxes[0][:_SHOWN_CHARS]
        if problem is not None:
            info["reason"] = problem
            return Score(reward=0.0, correct=False, info=info)

        info["format_ok"] = True
        answer = boxes[0].strip()
        unsafe = unsafe_reason(answer)
        if unsafe is not None:
            info["reason"] = unsafe
            correct = False
        else:
            correct = bool(gold) and is_equivalent(gold, answer)
        if not correct and "reason" not in info:
            info["reason"] = "wrong"
    except Exception as e:  # a bad rollout is data, not a crash
        info["reason"] = "error"
        info["error"] = f"{type(e).__name__}: {e}"[:_SHOWN_CHARS]
        correct = False
    reward = float(correct) + format_reward * float(info["format_ok"])
    return Score(reward=reward, correct=correct, info=info)


def math_scorer(response: str, answer: str, format_reward: float = 0.0) -> Score:
    """The `math` scorer (entry-point group echo2sdk.scorers) that dataset:// tasks name: score_response with
    the reference answer; `format_reward` as MathAdapter's (0 by default)."""
    return score_response(answer, response, format_reward)
