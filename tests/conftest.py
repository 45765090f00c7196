"""Imported first by pytest for every test run.

hypothesis is imported here, at start-up, because its pytest plug-in otherwise imports it lazily at the end
of a run that used no hypothesis test, through pytest's assertion rewriter; on CPython 3.11.7 that late
`ast.parse` can fail with "SystemError: AST constructor recursion depth mismatch" after a test has hit a deep
recursion (CPython gh-106905), turning a green run into exit 1."""

import hypothesis  # noqa: F401
