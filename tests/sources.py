"""The repository's Python files as syntax trees, for tests that read the code itself."""

from __future__ import annotations

import ast


def syntax_tree(source: str) -> ast.Module:
    """``ast.parse`` of ``source``, tried again where CPython 3.11.7 raises a spurious
    ``SystemError: AST constructor recursion depth mismatch``: its AST conversion keeps that
    depth in state shared by every thread (gh-106905, fixed in 3.11.8), so a thread another
    test left running (Prefect's, a job's) that parses at the same moment corrupts it."""
    for _ in range(4):
        try:
            return ast.parse(source)
        except SystemError:
            continue
    return ast.parse(source)
