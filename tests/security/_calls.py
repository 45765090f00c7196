"""Where the package calls a function by name: the tripwires that fail on a new way around a guard."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import echo2sdk

PACKAGE = Path(echo2sdk.__file__).parent


def _parse(source: str) -> ast.AST:
    """ast.parse, tried again on CPython 3.11's "AST constructor recursion depth mismatch" (gh-106905: an ast.parse
    in another thread of this test process at the same moment corrupts the count; tests/test_layers.py's twin)."""
    for attempt in range(3):
        try:
            return ast.parse(source)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def calls(names: set[str]) -> Iterator[tuple[str, str, ast.Call]]:
    """(module path relative to the package, the name called, the call) of every call in the package to a function or method named in
    `names` (`f(...)` or `x.f(...)`)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(_parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if called in names:
                    yield str(path.relative_to(PACKAGE)), called, node
