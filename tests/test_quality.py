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
