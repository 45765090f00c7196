"""echo2-math (contrib/math): problem generation, file loading, scoring, plug-in registration."""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo2_math import DEFAULT_SYSTEM_PROMPT, MathAdapter
from echo2_math.reward import MAX_ANSWER_CHARS, find_boxes, unsafe_reason
from echo2sdk.core.contracts import Score, Task, TaskAdapter
from echo2sdk.errors import AdapterError, ConfigError, DependencyNotInstalled

FR = 0.1  # the default format_reward


def first(adapter: MathAdapter, n: int, seed: int = 0) -> list[Task]:
    return list(itertools.islice(adapter.tasks(seed), n))


def task_with(answer: str) -> Task:
    return Task(id="t", messages=({"role": "user", "content": "?"},), answer=answer)


# ---------------------------------------------------------------- packaging


def test_entry_point_registered():
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="echo2sdk.adapters")}
    assert "math" in eps
    assert eps["math"].value == "echo2_math:MathAdapter"
    assert eps["math"].load() is MathAdapter


def test_import_is_cheap():
    code = "import sys, echo2_math; print(sorted(m for m in ('math_verify', 'sympy', 'pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_satisfies_protocol():
    assert isinstance(MathAdapter(), TaskAdapter)


def test_same_options_rebuild_an_equal_adapter():
    opts = {"difficulty": 3, "files": None, "format_reward": 0.2, "max_problems": 5}
    assert MathAdapter(**opts) == MathAdapter(**opts)
    assert MathAdapter(**opts) != MathAdapter(**{**opts, "difficulty": 4})
    assert "difficulty=3" in repr(MathAdapter(**opts))


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("bad", [0, 6, -1, 100, "1", 1.0, True, None])
def test_difficulty_out_of_range(bad):
    with pytest.raises(ConfigError, match=re.escape(repr(bad))):
        MathAdapter(difficulty=bad)


@pytest.mark.parametrize(
    "options, field",
    [
        ({"format_reward": -0.1}, "format_reward"),
        ({"format_reward": float("nan")}, "format_reward"),
        ({"format_reward": "0.1"}, "format_reward"),
        ({"max_problems": 0}, "max_problems"),
        ({"max_problems": 2.5}, "max_problems"),
        ({"files": []}, "files"),
        ({"files": [1, 2]}, "files"),
        ({"system_prompt": 3}, "system_prompt"),
    ],
)
def test_bad_options(options, field):
    with pytest.raises(ConfigError, match=field):
        MathAdapter(**options)


# ---------------------------------------------------------------- procedural problems


def test_deterministic_per_seed():
    a, b = MathAdapter(difficulty=2), MathAdapter(difficulty=2)
    assert first(a, 50, seed=7) == first(b, 50, seed=7)
    assert [t.messages for t in first(a, 50, seed=7)] != [t.messages for t in first(a, 50, seed=8)]


def test_task_shape_and_unique_ids():
    tasks = first(MathAdapter(), 200, seed=3)
    assert len({t.id for t in tasks}) == 200
    assert tasks[0].id == "3-0"
    for t in tasks:
        system, ex_q, ex_a, user = t.messages  # one worked example by default
        assert system == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
        assert ex_q["role"] == "user" and ex_a["role"] == "assistant" and "\\boxed{" in ex_a["content"]
        assert user["role"] == "user" and user["content"]
        assert t.answer
    assert "\\boxed{}" in DEFAULT_SYSTEM_PROMPT
    (bare,) = first(MathAdapter(fewshot=0), 1)
    assert [m["role"] for m in bare.messages] == ["system", "user"]
    with pytest.raises(ConfigError, match=re.escape("fewshot must be an integer in [0, 8], got fewshot=9")):
        MathAdapter(fewshot=9)


def test_custom_system_prompt():
    (t,) = first(MathAdapter(system_prompt="Answer in \\boxed{}."), 1)
    assert t.messages[0]["content"] == "Answer in \\boxed{}."


def test_max_problems_ends_the_stream():
    assert len(list(MathAdapter(max_problems=7).tasks(0))) == 7


def test_level1_is_small_single_digit_addition():
    for t in first(MathAdapter(difficulty=1), 100):
        a, b = map(int, re.fullmatch(r"What is (\d) \+ (\d)\?", t.messages[-1]["content"]).groups())
        assert t.answer == str(a + b)


def solve(question: str) -> Fraction:
    """An independent solver for the five templates."""
    num = r"(\d+(?:/\d+)?)"
    if m := re.fullmatch(rf"What is {num} ([-+×÷]) {num}\?(?: Give the answer as a reduced fraction\.)?", question):
        p, op, q = Fraction(m[1]), m[2], Fraction(m[3])
        return {"+": p + q, "-": p - q, "×": p * q, "÷": p / q}[op]
    m = re.fullmatch(r"Solve for x: (.+) = (\d+)", question)
    assert m, question
    lhs, rhs = m[1], Fraction(m[2])
    if m2 := re.fullmatch(r"x \+ (\d+)", lhs):
        return rhs - int(m2[1])
    if m2 := re.fullmatch(r"x - (\d+)", lhs):
        return rhs + int(m2[1])
    if m2 := re.fullmatch(r"(\d+)x", lhs):
        return rhs / int(m2[1])
    m2 = re.fullmatch(r"x / (\d+)", lhs)
    assert m2, question
    return rhs * int(m2[1])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(-(2**63), 2**63), difficulty=st.integers(1, 5))
def test_generated_answers_are_right_and_canonical(seed, difficulty):
    for t in first(MathAdapter(difficulty=difficulty), 10, seed=seed):
        value = solve(t.messages[-1]["content"])
        assert Fraction(t.answer) == value
        assert t.answer == (str(value.numerator) if value.denominator == 1 else str(value))  # reduced
        if difficulty < 5:
            assert value.denominator == 1 and value >= 0


# ---------------------------------------------------------------- scoring


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
def test_boxed_gold_answer_scores_full_reward(difficulty):
    adapter = MathAdapter(difficulty=difficulty)
    for t in first(adapter, 15, seed=difficulty):
        s = adapter.score(t, f"Let me think. The answer is \\boxed{{{t.answer}}}.")
        assert s == Score(reward=1.0 + FR, correct=True, info={"format_ok": True, "extracted": t.answer})
        wrong = adapter.score(t, f"\\boxed{{{t.answer} + 1}}")
        assert (wrong.reward, wrong.correct, wrong.info["format_ok"]) == (FR, False, True)


def test_format_reward_option():
    adapter = MathAdapter(format_reward=0.0)
    (t,) = first(adapter, 1)
    assert adapter.score(t, f"\\boxed{{{t.answer}}}").reward == 1.0
    assert adapter.score(t, "\\boxed{-1}").reward == 0.0


@pytest.mark.parametrize(
    "response, reason",
    [
        ("12 + 7 = 19", "no_box"),
        ("", "no_box"),
        ("\\boxed{19} and \\boxed{19}", "multiple_boxes"),
        ("\\boxed{\\boxed{19}}", "multiple_boxes"),
        ("\\boxed{}", "empty_box"),
        ("\\boxed{   }", "empty_box"),
        ("\\boxed 19", "unbraced_box"),
        ("\\boxed", "unbraced_box"),
        ("\\boxed{19", "unbalanced_box"),
        ("\\boxed{{19}", "unbalanced_box"),
        ("\\boxed{19\\}", "unbalanced_box"),
    ],
)
def test_format_failures_score_zero(response, reason):
    s = MathAdapter().score(task_with("19"), response)
    assert (s.reward, s.correct, s.info["format_ok"], s.info["reason"]) == (0.0, False, False, reason)


def test_braces_inside_the_box():
    boxes, problem = find_boxes("so \\boxed{\\frac{1}{2}} and \\{ \\}")
    assert (boxes, problem) == (["\\frac{1}{2}"], None)
    s = MathAdapter().score(task_with("1/2"), "\\boxed{\\frac{1}{2}}")
    assert s.correct and s.reward == 1.0 + FR


@pytest.mark.parametrize(
    "gold, boxed",
    [
        ("1/2", "0.5"),
        ("1/2", "\\frac{1}{2}"),
        ("1/2", "\\dfrac{1}{2}"),
        ("1/2", "2/4"),
        ("-1/6", "-\\frac{1}{6}"),
        ("4", "x = 4"),
        ("4", "x=4"),
        ("4", "4.0"),
        ("4", "\\frac{8}{2}"),
        ("1000", "1,000"),
        ("72", "72\\text{ dollars}"),
    ],
)
def test_equivalent_forms_accepted(gold, boxed):
    s = MathAdapter().score(task_with(gold), f"\\boxed{{{boxed}}}")
    assert s.correct is True and s.reward == 1.0 + FR


@pytest.mark.parametrize("gold, boxed", [("4", "x = 5"), ("1/2", "0.6"), ("8", "3 + 5 = 9"), ("5/6", "6/5")])
def test_inequivalent_forms_rejected(gold, boxed):
    s = MathAdapter().score(task_with(gold), f"\\boxed{{{boxed}}}")
    assert s.correct is False and s.reward == FR


GARBAGE = [
    "",
    "}{}{}{",
    "\\boxed{" * 1000,
    "\\boxed{" * 50_000 + "}" * 50_000,
    "}" * 10_000 + "\\boxed{1}",
    "x" * 2_000_000,
    "x" * 1_000_000 + "\\boxed{19}" + "y" * 1_000_000,
    "\\boxed{" + "9" * 10_000 + "}",
    "\\boxed{\\frac{1}{0}}",
    "\\boxed{\\sqrt{-1}}",
    "\\boxed{1/0}",
    "\\boxed{\\\\}",
    "\\boxed{$$}",
    "\\boxed{\\begin{pmatrix}1\\end{pmatrix}}",
    "\\boxed{\x00\ufffd\U0001f600}",
    "\\boxed{\\left(}",
    "\\boxed{x^}",
    "\\boxed{^{^{^{}}}}",
    "\\boxed{!}",
    "\\boxed{=}",
    "\\boxed{\\infty}",
    "\\boxed{[1, 2)}",
]


@pytest.mark.parametrize("response", GARBAGE, ids=range(len(GARBAGE)))
def test_malformed_responses_never_raise(response):
    t = task_with("19")
    start = time.monotonic()
    s = MathAdapter().score(t, response)
    assert isinstance(s, Score) and s.reward in (0.0, FR, 1.0 + FR)
    assert s.correct is (s.reward == 1.0 + FR)
    assert time.monotonic() - start < 10


def test_huge_response_with_one_good_box_is_correct():
    s = MathAdapter().score(task_with("19"), "x" * 1_000_000 + "\\boxed{19}" + "y" * 1_000_000)
    assert s.correct


@pytest.mark.parametrize("response", [None, 19, b"\\boxed{19}"])
def test_non_text_response_scores_zero(response):
    s = MathAdapter().score(task_with("19"), response)  # type: ignore[arg-type]
    assert (s.reward, s.correct) == (0.0, False)


@pytest.mark.parametrize(
    "boxed, reason",
    [
        ("9^{9^{9^{9}}}", "nested_power"),
        ("9**9**9", "nested_power"),
        ("9^{99999}", "large_power"),
        ("(x+1)^{999}", "large_expansion"),
        ("(x+y+z+1)^{30}", "large_expansion"),
        ("(a+b)(c+d)(e+f)(g+h)(i+j)(k+l)(m+n)(o+p)", "large_expansion"),
        ("1000000!", "large_factorial"),
        ("(10^{3})!", "large_factorial"),
        ("\\sum_{i=1}^{10^9} i^i", "big_operator"),
        ("\\binom{1000000000}{500000}", "big_operator"),
        ("1" * (MAX_ANSWER_CHARS + 1), "too_long"),
    ],
)
def test_pathological_answers_are_screened_not_evaluated(boxed, reason):
    assert unsafe_reason(boxed) == reason
    start = time.monotonic()
    s = MathAdapter().score(task_with("19"), f"\\boxed{{{boxed}}}")
    assert (s.reward, s.correct, s.info["reason"]) == (FR, False, reason)
    assert time.monotonic() - start < 1


@pytest.mark.parametrize("boxed", ["x^2+7x+10", "\\frac{\\sqrt{3}}{2}", "(x+1)^{2}", "2^{10}", "5!", "\\pi r^2", "x = 4"])
def test_ordinary_answers_are_not_screened(boxed):
    assert unsafe_reason(boxed) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["\\boxed", "{", "}", "\\", "1", "x", "^", "!", " ", "19", "/", "(", ")", "\\frac"]), max_size=40))
def test_random_latex_never_raises(pieces):
    s = MathAdapter().score(task_with("19"), "".join(pieces))
    assert s.reward in (0.0, FR, 1.0 + FR)
    assert s.info["format_ok"] in (True, False)


def test_scoring_works_off_the_main_thread():
    adapter = MathAdapter(difficulty=5)
    tasks = first(adapter, 8, seed=11)
    results: list[Score] = []
    thread = threading.Thread(target=lambda: results.append(adapter.score(tasks[0], f"\\boxed{{{tasks[0].answer}}}")))
    thread.start()
    thread.join(timeout=60)
    assert results and results[0].correct, results
    with ThreadPoolExecutor(max_workers=4) as pool:
        scores = list(pool.map(lambda t: adapter.score(t, f"so \\boxed{{{t.answer}}}"), tasks))
    assert all(s.correct for s in scores), scores


def test_math_verify_timeout_notice_is_not_shown_but_its_other_warnings_are():
    """math-verify warns once per process that its timeout is off; the screen (unsafe_reason) is the bound it
    asks for, so that notice is dropped (it reached `echo2 eval`'s console). A fresh process: the notice is once."""
    code = (
        "import logging; logging.basicConfig(level=logging.WARNING)\n"
        "from echo2_math.reward import score_response\n"
        "assert score_response('7', 'so \\\\boxed{7}', 0.1).correct\n"
        "logging.getLogger('math_verify.parser').warning('another math-verify warning')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "Timeout is disabled" not in out.stderr, out.stderr
    assert "another math-verify warning" in out.stderr, out.stderr


# ---------------------------------------------------------------- files


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return str(path)


RECORDS = [
    {"problem": "What is 2 + 2?", "answer": "4"},
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "He has 3 + 4 = 7.\n#### 7"},
    {"Question": "Half of one?", "final_answer": 0.5},
    {"problem": "Simplify 2/4.", "solution": "Divide by two: $\\boxed{\\frac{1}{2}}$."},
    "",
    {"prompt": "What is 10 - 3?", "target": 7, "extra": "ignored"},
]
ANSWERS = {"What is 2 + 2?": "4", "Tom has 3 apples and buys 4 more. How many?": "7", "Half of one?": "0.5",
           "Simplify 2/4.": "\\frac{1}{2}", "What is 10 - 3?": "7"}  # fmt: skip


def test_jsonl_cycles_shuffled_epochs(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS)
    adapter = MathAdapter(files=[path])
    tasks = first(adapter, 15, seed=5)
    assert tasks == first(MathAdapter(files=[path]), 15, seed=5)
    assert len({t.id for t in tasks}) == 15
    for epoch in range(3):
        chunk = tasks[5 * epoch : 5 * epoch + 5]
        assert {t.messages[-1]["content"]: t.answer for t in chunk} == ANSWERS
        assert {t.info["epoch"] for t in chunk} == {epoch}
    orders = {tuple(t.messages[-1]["content"] for t in tasks[k : k + 5]) for k in (0, 5, 10)}
    orders |= {tuple(t.messages[-1]["content"] for t in first(adapter, 5, seed=s)) for s in range(6)}
    assert len(orders) > 1  # shuffled, not file order every time
    for t in tasks:
        assert adapter.score(t, f"\\boxed{{{t.answer}}}").correct
    assert tasks[0].info["source"] == path and tasks[0].info["position"] in (1, 2, 3, 4, 6)


def test_single_path_string_and_max_problems(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS)
    assert len(list(MathAdapter(files=path, max_problems=12).tasks(0))) == 12


def test_files_are_read_by_tasks_not_by_the_constructor(tmp_path):
    adapter = MathAdapter(files=[str(tmp_path / "absent.jsonl")])
    assert adapter.score(task_with("4"), "\\boxed{4}").correct  # a scoring worker needs no files
    with pytest.raises(AdapterError, match="absent.jsonl.*does not exist"):
        adapter.tasks(0)


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"problem": "1+1?", "answer": "2"', r"bad\.jsonl:2: invalid JSON"),
        ('{"problem": "1+1?"}', r"bad\.jsonl:2: missing answer field; expected one of answer, .*found keys: 'problem'"),
        ('{"text": "1+1?", "answer": "2"}', r"bad\.jsonl:2: missing problem field; expected one of problem, question"),
        ('["1+1?", "2"]', r"bad\.jsonl:2: expected a JSON object"),
        ('{"problem": "", "answer": "2"}', r"bad\.jsonl:2: field 'problem' must be a non-empty string"),
        ('{"problem": "1+1?", "answer": null}', r"bad\.jsonl:2: field 'answer' must be a string or a number"),
        ('{"problem": "1+1?", "answer": " "}', r"bad\.jsonl:2: field 'answer' is empty"),
    ],
)
def test_jsonl_bad_line_names_file_line_and_field(tmp_path, bad_line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [RECORDS[0], bad_line, RECORDS[1]])
    with pytest.raises(AdapterError, match=message):
        MathAdapter(files=[path]).tasks(0)


def test_empty_file_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(AdapterError, match="empty.jsonl.*holds no problems"):
        MathAdapter(files=[path]).tasks(0)


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"question": ["What is 1 + 2?", "What is 5 - 1?"], "answer": ["3", "4"]}), path)
    jsonl = write_jsonl(tmp_path / "q.jsonl", [RECORDS[0]])
    adapter = MathAdapter(files=[str(path), jsonl])
    tasks = first(adapter, 3)
    assert {t.messages[-1]["content"]: t.answer for t in tasks} == {
        "What is 1 + 2?": "3", "What is 5 - 1?": "4", "What is 2 + 2?": "4"}  # fmt: skip
    pq.write_table(pa.table({"question": ["What is 1 + 2?"]}), tmp_path / "bad.parquet")
    with pytest.raises(AdapterError, match=r"bad\.parquet row 0: missing answer field"):
        MathAdapter(files=[str(tmp_path / "bad.parquet")]).tasks(0)


def test_parquet_without_pyarrow_names_the_install(tmp_path, monkeypatch):
    path = tmp_path / "p.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DependencyNotInstalled, match="pip install pyarrow"):
        MathAdapter(files=[str(path)]).tasks(0)
