"""The README's examples run, and CI runs the README's second command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


# Each Python example, and the output shown after it (a ```text block), if any.
EXAMPLES = re.findall(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```\n)?", README, re.S)


@pytest.mark.parametrize(("code", "shown"), EXAMPLES, ids=range(len(EXAMPLES)))
def test_each_readme_example_runs_on_its_own_and_prints_what_it_shows(
    code, shown, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLM_OPS_CACHE", str(tmp_path / "default-cache.duckdb"))
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out == shown
    exec(compile(code, "README.md", "exec"), {})  # and again, as a reader would: from the cache


def test_the_readme_sql_runs_in_the_duckdb_cli_on_a_new_cache(complete, cache):
    import subprocess
    import sys

    import polars as pl

    pl.DataFrame({"text": ["a", "b"]}).pipe(complete, prompt="{text}")
    sql = re.findall(r"```sql\n(.*?)```", README, re.S)[0]
    cli = Path(sys.executable).with_name("duckdb")  # duckdb-cli, a DuckDB 1.x
    result = subprocess.run(
        [str(cli), "-readonly", str(cache), "-c", sql], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert result.stdout.count("sim") >= 1 and "hit_rate" in result.stdout


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
