"""Where the package calls a function by name: the tripwires that fail on a new way around a guard."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import echo2sdk
from _ast_parse import parse

PACKAGE = Path(echo2sdk.__file__).parent


def calls(names: set[str]) -> Iterator[tuple[str, str, ast.Call]]:
    """(module path relative to the package, the name called, the call) of every call in the package to a function or method named in
    `names` (`f(...)` or `x.f(...)`)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if called in names:
                    yield str(path.relative_to(PACKAGE)), called, node
