"""What a type checker infers for the frame functions: a DataFrame in, a DataFrame out; a
LazyFrame in, a LazyFrame out; a pyarrow Table in, a Table out.

One mypy run (``--strict``, the project's configuration, a cache of its own) over a small
file that calls each function with each kind of frame; each test reads one ``reveal_type``.
pyarrow ships no type hints, so to mypy a ``pa.Table`` is ``Any``: what it says of a table
call is ``Any``, and the tests check that this does not make the Polars calls ``Any`` too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DATAFRAME = "polars.dataframe.frame.DataFrame"
LAZYFRAME = "polars.lazyframe.frame.LazyFrame"
TABLE = ("Any", "pyarrow.lib.Table")  # Any while pyarrow has no type hints
REPORT = "llm_ops._report.RunReport"

CALLS = {
    "llm_complete": 'llm_complete({frame}, prompt="{{text}}", model="m"{more})',
    "llm_complete_async": 'await llm_complete_async({frame}, prompt="{{text}}", model="m"{more})',
    "llm_embed": 'llm_embed({frame}, column="text", model="m"{more})',
    "llm_filter": 'llm_filter({frame}, "Late? {{text}}", model="m"{more})',
    "llm_classify": 'llm_classify({frame}, "text", ["a", "b"], model="m"{more})',
    "llm_extract": 'llm_extract({frame}, "text", {{"type": "object"}}, model="m"{more})',
    "Client.complete": 'client.complete({frame}, prompt="{{text}}", model="m"{more})',
    "Client.complete_async": (
        'await client.complete_async({frame}, prompt="{{text}}", model="m"{more})'
    ),
}
REPORTED = [
    "llm_complete",
    "llm_complete_async",
    "llm_filter",
    "llm_classify",
    "llm_extract",
    "Client.complete",
    "Client.complete_async",
]
FRAMES = {"frame": DATAFRAME, "lazy": LAZYFRAME, "table": TABLE}

HEADER = """\
import polars as pl
import pyarrow as pa

from llm_ops import (
    Client,
    llm_classify,
    llm_complete,
    llm_complete_async,
    llm_embed,
    llm_extract,
    llm_filter,
)

frame = pl.DataFrame({"text": ["a"]})
lazy = frame.lazy()
table = pa.table({"text": ["a"]})
client = Client(endpoint="http://127.0.0.1:9/v1", cache=False)


async def main() -> None:
"""


def _source() -> tuple[str, dict[int, str]]:
    """The file, and which case each of its ``reveal_type`` lines is."""
    lines, cases = HEADER.splitlines(), {}
    for name, call in CALLS.items():
        for frame in FRAMES:
            lines.append(f"    reveal_type({call.format(frame=frame, more='')})")
            cases[len(lines)] = f"{name}({frame})"
            if name in REPORTED and frame != "lazy":  # a LazyFrame's report: last_report()
                reported = call.format(frame=frame, more=", return_report=True")
                lines.append(f"    reveal_type({reported})")
                cases[len(lines)] = f"{name}({frame}, return_report=True)"
    return "\n".join(lines) + "\n", cases


@pytest.fixture(scope="module")
def revealed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each case's revealed type, from one mypy run."""
    folder = tmp_path_factory.mktemp("types")
    source, cases = _source()
    (folder / "calls.py").write_text(source)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(folder / ".mypy_cache"),
            "calls.py",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=folder,
        env={**os.environ, "MYPYPATH": str(ROOT)},
    )
    found = {}
    for line in run.stdout.splitlines():
        match = re.match(r'calls\.py:(\d+): note: Revealed type is "(.*)"$', line)
        if match:
            found[cases[int(match[1])]] = match[2]
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert not errors, run.stdout
    assert len(found) == len(cases), run.stdout + run.stderr
    return found


@pytest.mark.parametrize("name", CALLS)
def test_a_dataframe_in_is_a_dataframe_out(revealed, name):
    assert revealed[f"{name}(frame)"] == DATAFRAME


@pytest.mark.parametrize("name", CALLS)
def test_a_lazyframe_in_is_a_lazyframe_out(revealed, name):
    assert revealed[f"{name}(lazy)"] == LAZYFRAME


@pytest.mark.parametrize("name", CALLS)
def test_a_table_in_is_what_mypy_knows_of_a_table(revealed, name):
    assert revealed[f"{name}(table)"] in TABLE


@pytest.mark.parametrize("name", REPORTED)
def test_return_report_gives_the_frame_and_the_report(revealed, name):
    assert revealed[f"{name}(frame, return_report=True)"] == f"tuple[{DATAFRAME}, {REPORT}]"


@pytest.mark.parametrize("name", REPORTED)
def test_return_report_with_a_table_gives_the_report_too(revealed, name):
    assert revealed[f"{name}(table, return_report=True)"] in (
        f"tuple[{table}, {REPORT}]" for table in TABLE
    )
