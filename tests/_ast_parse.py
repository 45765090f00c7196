"""ast.parse for the tests that read the package's source (the layer contract, the tripwires)."""

from __future__ import annotations

import ast


def parse(source: str) -> ast.AST:
    """ast.parse, tried again on CPython 3.11's "AST constructor recursion depth mismatch": 3.11 keeps the AST
    converter's depth count in interpreter-wide state, so an ast.parse running at the same moment in another
    thread (a library's background thread left by an earlier test in this process) corrupts the count of this
    one (CPython gh-106905; 3.11.7 here). The source is fine; a second parse is not disturbed."""
    for attempt in range(3):
        try:
            return ast.parse(source)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")
