"""The README's examples run, and CI runs the README's second command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("block", re.findall(r"```python\n(.*?)```", README, re.S))
def test_readme_python_examples_run(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {})


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^(python3 -m venv .*)$", README, re.M)
    assert len(commands) == 2
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
