"""Scorers: a response and a reference answer -> Score, for tasks that are rows of questions and answers
(`dataset://`). A scorer is any callable `scorer(response: str, answer: str, **options) -> Score`.

By name: the built-ins below, a scorer registered in the entry-point group `echo2sdk.scorers` (the
echo2-math package registers `math`: math-verify equivalence of the last \\boxed{} answer), or a
"package.module:function" reference (which a remote worker imports only with --allow-plugin).

Built-ins:
    exact     the extracted answer equals the reference after normalising case, whitespace, a trailing
              period and thousands separators in numbers ("1,000" = "1000"); reward 1 or 0
    contains  the reference appears in the extracted answer (normalised the same way)

The extracted answer is the text of the last <answer>...</answer>, else of the last \\boxed{...}, else
what follows the last "####", else the last non-empty line. `Score.info`: answered (one of the three
markers was found).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from echo2sdk.core.contracts import Score
from echo2sdk.errors import ConfigError, NameNotFound

__all__ = ["SCORERS", "tagged_answer", "last_box", "extract_answer", "normalise", "exact", "contains", "load_scorer"]

SCORERS = "echo2sdk.scorers"
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOX = "\\boxed{"
_SPACE = re.compile(r"\s+")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def last_box(text: str) -> str | None:
    start = text.rfind(_BOX)
    if start == -1:
        return None
    depth, i = 1, start + len(_BOX)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def tagged_answer(text: str) -> str | None:
    """The text inside the last <answer>...</answer> (stripped), or None."""
    tags = _TAG.findall(text)
    return tags[-1].strip() if tags else None


def extract_answer(text: str) -> tuple[str, bool]:
    """(the answer a response gives, whether a marker said so): <answer>, \\boxed{}, ####, else the last line."""
    tag = tagged_answer(text)
    if tag is not None:
        return tag, True
    box = last_box(text)
    if box is not None:
        return box.strip(), True
    if "####" in text:
        return text.rsplit("####", 1)[1].strip(), True
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[-1].strip() if lines else ""), False


def normalise(text: str) -> str:
    text = _SPACE.sub(" ", _THOUSANDS.sub("", text)).strip().casefold()
    return text[:-1].rstrip() if text.endswith(".") else text


def exact(response: str, answer: str) -> Score:
    given, answered = extract_answer(response)
    ok = bool(given) and normalise(given) == normalise(answer)
    return Score(reward=1.0 if ok else 0.0, correct=ok, info={"answered": answered})


def contains(response: str, answer: str) -> Score:
    given, answered = extract_answer(response)
    ok = bool(normalise(answer)) and normalise(answer) in normalise(given)
    return Score(reward=1.0 if ok else 0.0, correct=ok, info={"answered": answered})


_BUILTIN: dict[str, Callable[..., Score]] = {"exact": exact, "contains": contains}


def load_scorer(name: object) -> Callable[..., Any]:
    """A built-in, registered or referenced scorer by name; NameNotFound (with suggestions) otherwise."""
    from echo2sdk.plugins import load_object, registered

    if not isinstance(name, str) or not name:
        raise ConfigError(f"scorer = {name!r}: expected a scorer name, e.g. 'exact' or 'math'")
    if name in _BUILTIN:
        return _BUILTIN[name]
    if ":" not in name and name not in registered(SCORERS):
        if name == "math":
            raise ConfigError("scorer = 'math' comes from the echo2-math package, which is not installed here: "
                              "pip install -e contrib/math  (from a checkout of echo2sdk)")
        raise NameNotFound("scorer", name, [*_BUILTIN, *registered(SCORERS)])
    scorer = load_object(SCORERS, name)
    if not callable(scorer):
        raise ConfigError(f"scorer = {name!r} is {scorer!r}, not a callable scorer(response, answer, **options)")
    return scorer
