"""No test judges behaviour by elapsed wall time: on a busy machine a test that asserts on a
duration measured with the real clock fails for reasons that are not the code's. Tests of timed
behaviour drive a fake clock (``tests/clocks.py``) or a simulator that holds its answers until
told (``gather``, ``hold``), and assert on order and counts.

This reads every test module and fails on an ``assert`` that uses the real clock: a call of
``time.monotonic``, ``time.perf_counter`` or ``time.time`` (or their ``_ns`` forms), or a name
computed from one, such as ``took = time.monotonic() - start``. A generous deadline that only
stops a wait from hanging judges nothing: it raises ``AssertionError`` itself, saying what it
waited for, or its function is in :data:`ALLOWED`."""

from __future__ import annotations

import ast
from pathlib import Path

from sources import syntax_tree

TESTS = Path(__file__).resolve().parent
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}

ALLOWED = {
    ("test_engine.py", "_wait_for_answers"): "a minute's deadline on a wait: it only stops a hang",
    ("test_ray.py", "_wait_until"): "a 30 s deadline on a wait: it only stops a hang",
    ("test_hostile.py", "test_retry_after_reads_seconds_milliseconds_and_http_dates"): (
        "an HTTP date is absolute: the header is made from the wall clock that retry_after "
        "reads, and the bound leaves minutes for a slow machine"
    ),
}
"""(file, function) -> why its asserts on the real clock judge no behaviour by its speed."""


def _is_clock_call(node: ast.AST) -> bool:
    """``time.monotonic()`` and the like, or a bare ``monotonic()`` imported from ``time``."""
    if not isinstance(node, ast.Call):
        return False
    function = node.func
    if isinstance(function, ast.Attribute):
        return (
            isinstance(function.value, ast.Name)
            and function.value.id == "time"
            and function.attr in CLOCKS
        )
    return isinstance(function, ast.Name) and function.id in CLOCKS - {"time"}


def _reads_the_clock(node: ast.AST, tainted: set[str]) -> bool:
    return any(
        _is_clock_call(inner) or (isinstance(inner, ast.Name) and inner.id in tainted)
        for inner in ast.walk(node)
    )


def _assigned(node: ast.AST) -> tuple[list[ast.expr], ast.AST | None]:
    """The targets an assignment binds and the value it binds them to."""
    if isinstance(node, ast.Assign):
        return node.targets, node.value
    if isinstance(node, ast.AugAssign | ast.AnnAssign | ast.NamedExpr):
        return [node.target], node.value
    return [], None


def _clock_names(scope: ast.AST) -> set[str]:
    """Names in ``scope`` that hold the real clock's time or something computed from it."""
    tainted: set[str] = set()
    while True:
        before = len(tainted)
        for node in ast.walk(scope):
            targets, value = _assigned(node)
            if value is not None and _reads_the_clock(value, tainted):
                for target in targets:
                    tainted.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        if len(tainted) == before:
            return tainted


FUNCTIONS = ast.FunctionDef | ast.AsyncFunctionDef


def _wall_time_asserts(path: Path) -> list[str]:
    """``file:line function`` of each assert in ``path`` on the real clock (not allowed)."""
    tree = syntax_tree(path.read_text())
    found: list[str] = []

    def visit(node: ast.AST, function: str, tainted: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, FUNCTIONS):
                visit(child, child.name, tainted | _clock_names(child))
                continue
            if (
                isinstance(child, ast.Assert)
                and (path.name, function) not in ALLOWED
                and _reads_the_clock(child.test, tainted)
            ):
                found.append(f"{path.name}:{child.lineno} {function}")
            visit(child, function, tainted)

    # names set at the top of the module, outside any function, hold for every function
    top = [s for s in tree.body if not isinstance(s, FUNCTIONS | ast.ClassDef)]
    visit(tree, "<module>", _clock_names(ast.Module(body=top, type_ignores=[])))
    return found


def test_no_test_asserts_on_a_duration_measured_with_the_real_clock():
    found = [hit for path in sorted(TESTS.glob("*.py")) for hit in _wall_time_asserts(path)]
    assert found == []


def test_the_scan_catches_an_assert_on_an_elapsed_time(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import time\n"
        "def test_fast():\n"
        "    start = time.perf_counter()\n"
        "    took = time.perf_counter() - start\n"
        "    assert took < 1.0\n"
    )
    assert _wall_time_asserts(sample) == ["test_sample.py:5 test_fast"]


def test_every_allowed_function_still_exists():
    names = {
        (path.name, node.name)
        for path in TESTS.glob("*.py")
        for node in ast.walk(syntax_tree(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert set(ALLOWED) <= names
