"""The README's examples run, and CI runs the README's second command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_python_examples_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for block in re.findall(r"```python\n(.*?)```", README, re.S):
        exec(compile(block, "README.md", "exec"), namespace)


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^(python3 -m venv .*)$", README, re.M)
    assert len(commands) == 2
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("block", re.findall(r"```console\n(.*?)```", README, re.S))
def test_readme_console_sessions_print_what_they_show(block, tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("LLM_OPS_CACHE", None)
    llm_ops = str(Path(sys.executable).with_name("llm-ops"))
    for session in re.split(r"^\$ ", block, flags=re.M)[1:]:
        command, _, expected = session.partition("\n")
        result = subprocess.run(
            command.replace("llm-ops", llm_ops, 1),
            shell=True,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.stdout + result.stderr == expected
