"""ruff and mypy --strict keep the library honest; run as tests so CI enforces them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff():
    result = _run("ruff", "check", "llm_ops", "tests", "flows", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = _run("ruff", "format", "--check", "llm_ops", "tests", "flows", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict():
    result = _run("mypy", "llm_ops", "flows")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_exception_the_library_defines_is_rooted_at_llm_ops_error_or_llm_ops_warning():
    import importlib
    import pkgutil

    import llm_ops
    from llm_ops import LlmOpsError, LlmOpsWarning
    from llm_ops._dialects import MalformedAnswer
    from llm_ops._engine.answers import Final, Retryable

    modules = [
        importlib.import_module(module.name)
        for module in pkgutil.walk_packages(llm_ops.__path__, "llm_ops.")
        if not module.name.endswith("__main__")
    ]
    defined = {
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__.startswith("llm_ops")
    }
    # how an attempt tells its retry loop what became of it, and a dialect the engine that an
    # answer could not be read (the dialects import nothing of llm-ops, LlmOpsError included)
    signals = {Retryable, Final, MalformedAnswer}
    roots = (LlmOpsError, LlmOpsWarning)
    outside = {kind.__name__ for kind in defined - signals if not issubclass(kind, roots)}
    assert outside == set()
