"""Imported first by pytest for every test run.

hypothesis is imported here, at start-up, because its pytest plug-in otherwise imports it lazily at the end
of a run that used no hypothesis test, through pytest's assertion rewriter; on CPython 3.11.7 that late
`ast.parse` can fail with "SystemError: AST constructor recursion depth mismatch" after a test has hit a deep
recursion (CPython gh-106905), turning a green run into exit 1."""

from pathlib import Path

import hypothesis  # noqa: F401
import pytest


@pytest.fixture
def example_diff():
    """diff(name): the keys of the lines where examples/<name>.toml differs from examples/math_smollm2.toml,
    comment lines left out (the examples switch the task in their [task] lines; math also tunes its recipe)."""

    def settings(stem: str) -> list[str]:
        lines = (Path(__file__).resolve().parents[1] / "examples" / f"{stem}.toml").read_text().splitlines()
        return [line for line in lines if not line.lstrip().startswith("#")]

    def diff(name: str) -> list[str]:
        pairs = zip(settings("math_smollm2"), settings(name), strict=True)
        return [b.split("=")[0].strip() for a, b in pairs if a != b]

    return diff
