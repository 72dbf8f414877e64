"""The package as installed: what it needs, where it runs, what it says it is."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import polars as pl

import llm_ops
from llm_ops import default_cache_path, llm_complete

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )


def test_import_works_where_fcntl_does_not_exist():
    # As on Windows: no fcntl module at all.
    result = _python("import sys; sys.modules['fcntl'] = None; import llm_ops, llm_ops.cli")
    assert result.returncode == 0, result.stderr


def test_the_core_does_not_need_prefect_or_ray():
    result = _python(
        "import sys; sys.modules['prefect'] = sys.modules['ray'] = None\n"
        "import llm_ops, llm_ops.cli, llm_ops.sql, llm_ops.tables, llm_ops.testing"
    )
    assert result.returncode == 0, result.stderr


def test_prefect_is_an_extra_not_a_dependency():
    core = " ".join(PYPROJECT["project"]["dependencies"])
    assert "prefect" not in core and "ray" not in core
    assert {"prefect", "ray"} <= PYPROJECT["project"]["optional-dependencies"].keys()


def test_the_version_is_written_once_and_read_from_the_installed_package():
    assert llm_ops.__version__ == metadata.version("llm-ops") == PYPROJECT["project"]["version"]


def test_a_job_given_no_cache_writes_in_the_tests_home_not_the_users(endpoint, tmp_path):
    pl.DataFrame({"text": ["a"]}).pipe(
        llm_complete, prompt="{text}", model="sim", endpoint=endpoint.base_url, progress=False
    )
    assert default_cache_path().is_relative_to(Path.home())
    assert default_cache_path().exists() and Path.home().name.startswith("llm-ops-tests-")
