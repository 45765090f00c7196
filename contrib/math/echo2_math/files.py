"""Problems from files: JSONL (one object a line) or Parquet (needs pyarrow).

Field names are matched case-insensitively against common conventions: the question from
`problem`, `question`, `prompt`, `query` or `input`; the answer from `answer`, `final_answer`,
`expected_answer`, `ground_truth`, `target`, `solution` or `output` (in that order). An answer
written as a worked solution is reduced to its final answer: the text after the last "####"
(GSM8K), or else the content of the last \\boxed{} (MATH).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from echo2sdk.adapters.dataset import jsonl_records
from echo2sdk.errors import AdapterError, DependencyNotInstalled

from .problems import Problem
from .reward import BOX, _closing_brace

__all__ = ["PROBLEM_FIELDS", "ANSWER_FIELDS", "PARQUET_SUFFIXES", "load_problems", "MissingPyarrow"]

PROBLEM_FIELDS = ("problem", "question", "prompt", "query", "input")
ANSWER_FIELDS = ("answer", "final_answer", "expected_answer", "ground_truth", "target", "solution", "output")
PARQUET_SUFFIXES = (".parquet", ".pq")


class MissingPyarrow(DependencyNotInstalled):
    """pyarrow is needed to read Parquet files."""

    def __init__(self, path: str):
        Exception.__init__(
            self,
            f"cannot read {path}: Parquet files need pyarrow, which is not installed: run  pip install pyarrow"
            "  (or  pip install \"echo2-math[parquet]\")",
        )
        self.package, self.extra = "pyarrow", "parquet"


def final_answer(text: str) -> str:
    """The final answer inside a worked solution ("... #### 72", "... \\boxed{72}"), else `text`."""
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    i = text.rfind(BOX + "{")
    if i != -1:
        end = _closing_brace(text, i + len(BOX))
        if end is not None:
            return text[i + len(BOX) + 1 : end].strip()
    return text.strip()


def _field(record: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str, Any] | None:
    lowered = {str(k).lower(): k for k in record}
    for name in names:
        if name in lowered:
            return name, record[lowered[name]]
    return None


def _problem(record: Any, where: str) -> Problem:
    if not isinstance(record, Mapping):
        raise AdapterError(f"{where}: expected a JSON object with a problem and an answer, got {type(record).__name__}")
    found_q = _field(record, PROBLEM_FIELDS)
    found_a = _field(record, ANSWER_FIELDS)
    for found, names, kind in ((found_q, PROBLEM_FIELDS, "problem"), (found_a, ANSWER_FIELDS, "answer")):
        if found is None:
            keys = ", ".join(map(repr, record)) or "none"
            raise AdapterError(
                f"{where}: missing {kind} field; expected one of {', '.join(names)} (found keys: {keys})"
            )
    (q_name, question), (a_name, answer) = found_q, found_a  # type: ignore[misc]
    if not isinstance(question, str) or not question.strip():
        raise AdapterError(f"{where}: field {q_name!r} must be a non-empty string, got {question!r:.80}")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise AdapterError(f"{where}: field {a_name!r} must be a string or a number, got {answer!r:.80}")
    answer = final_answer(str(answer))
    if not answer:
        raise AdapterError(f"{where}: field {a_name!r} is empty")
    return Problem(question.strip(), answer)


def _jsonl(path: Path) -> Iterable[tuple[int, Problem]]:
    for lineno, record in jsonl_records(path):  # echo2sdk's reader (dataset://): line numbers in its errors
        yield lineno, _problem(record, f"{path}:{lineno}")


def _parquet(path: Path) -> Iterable[tuple[int, Problem]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingPyarrow(str(path)) from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:
        raise AdapterError(f"{path}: cannot read as Parquet ({type(e).__name__}: {e})") from None
    for row, record in enumerate(rows):
        yield row, _problem(record, f"{path} row {row}")


def load_problems(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[str, int, Problem]]:
    """(source path, line (JSONL, from 1) or row (Parquet, from 0), problem) for every record, in file order."""
    out: list[tuple[str, int, Problem]] = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise AdapterError(f"problem file {str(path)!r} does not exist or is not a file")
        reader = _parquet if path.suffix.lower() in PARQUET_SUFFIXES else _jsonl
        before = len(out)
        out.extend((str(path), k, problem) for k, problem in reader(path))
        if len(out) == before:
            raise AdapterError(f"problem file {str(path)!r} holds no problems")
    return out
