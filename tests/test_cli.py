"""The llm-ops command line, in process and through its installed entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from llm_ops.cli import main

COMMANDS = [
    ["run"],
    ["estimate"],
    ["serve"],
    ["cache"],
    ["cache", "stats"],
    ["cache", "export"],
    ["cache", "prune"],
    ["cache", "snapshot"],
    ["cache", "vacuum"],
]


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "reviews.parquet"
    pl.DataFrame({"id": [1, 2, 3, 4], "text": ["good", "bad", "good", None]}).write_parquet(path)
    return path


@pytest.fixture
def job(table, endpoint, cache):
    return [
        str(table),
        "--prompt",
        "Rate: {text}",
        "--model",
        "sim",
        "--base-url",
        endpoint.base_url,
        "--cache",
        str(cache),
    ]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: llm-ops" in capsys.readouterr().out


def test_run_writes_the_rows_with_their_answers(job, tmp_path, endpoint, capsys):
    assert main(["run", *job, "--out", str(tmp_path / "out.parquet"), "--no-progress"]) == 0
    out = pl.read_parquet(tmp_path / "out.parquet")
    assert out["completion_status"].to_list() == ["ok", "ok", "ok", "skipped"]
    assert endpoint.stats()["requests"] == 2
    assert "distinct requests           2" in capsys.readouterr().out


def test_csv_input(tmp_path, endpoint, cache):
    (tmp_path / "in.csv").write_text("text\nhello\nworld\n")
    assert (
        main(
            [
                "run",
                str(tmp_path / "in.csv"),
                "--prompt",
                "{text}",
                "--model",
                "sim",
                "--base-url",
                endpoint.base_url,
                "--cache",
                str(cache),
                "--out",
                str(tmp_path / "out.parquet"),
            ]
        )
        == 0
    )
    assert pl.read_parquet(tmp_path / "out.parquet")["completion_status"].to_list() == ["ok"] * 2


def test_estimate_counts_what_a_run_then_sends(job, tmp_path, endpoint, capsys):
    assert main(["estimate", *job]) == 0
    assert "requests to send                2" in capsys.readouterr().out
    assert endpoint.stats()["requests"] == 0
    main(["run", *job, "--out", str(tmp_path / "out.parquet")])
    assert endpoint.stats()["requests"] == 2


def test_a_wrong_path_is_one_line_and_non_zero(capsys, tmp_path):
    assert (
        main(
            [
                "run",
                str(tmp_path / "nope.parquet"),
                "--prompt",
                "{x}",
                "--model",
                "m",
                "--out",
                str(tmp_path / "o.parquet"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert err.startswith("llm-ops: error: no input file matches") and err.count("\n") == 1


def test_an_unknown_column_is_one_line_and_non_zero(job, tmp_path, capsys):
    job[2] = "{body}"
    assert main(["run", *job, "--out", str(tmp_path / "o.parquet")]) == 1
    assert "column 'body'" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()


def test_cache_stats_export_prune_vacuum(job, tmp_path, cache, capsys):
    main(["run", *job, "--out", str(tmp_path / "out.parquet")])
    assert main(["cache", "--cache", str(cache), "stats"]) == 0
    assert "1 run(s) recorded" in capsys.readouterr().out
    assert main(["cache", "--cache", str(cache), "export", str(tmp_path / "x.parquet")]) == 0
    assert pl.read_parquet(tmp_path / "x.parquet").height == 2
    assert main(["cache", "--cache", str(cache), "prune", "--model", "sim", "--dry-run"]) == 0
    assert "would delete 2 answer(s)" in capsys.readouterr().out
    assert main(["cache", "--cache", str(cache), "prune", "--model", "sim"]) == 0
    assert main(["cache", "--cache", str(cache), "vacuum"]) == 0
    assert main(["cache", "--cache", str(cache), "export", str(tmp_path / "y.parquet")]) == 0
    assert pl.read_parquet(tmp_path / "y.parquet").height == 0


def test_cache_snapshot_is_a_copy_to_hold_open(job, tmp_path, cache, capsys):
    main(["run", *job, "--out", str(tmp_path / "out.parquet")])
    assert main(["cache", "--cache", str(cache), "snapshot", str(tmp_path / "copy.duckdb")]) == 0
    with duckdb.connect(str(tmp_path / "copy.duckdb"), read_only=True) as copy:
        assert copy.execute("SELECT count(*) FROM llm_cache").fetchall() == [(2,)]


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(Exception, match="no input file matches"):
        main(["--debug", "estimate", str(tmp_path / "nope"), "--prompt", "x", "--model", "m"])


def test_the_installed_command(tmp_path):
    command = Path(sys.executable).with_name("llm-ops")
    result = subprocess.run(
        [str(command), "cache", "--cache", str(tmp_path / "none.duckdb"), "stats"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("llm-ops: error: there is no cache at")


def test_a_budget_holds_across_chunks(job, tmp_path, endpoint, capsys):
    assert (
        main(
            [
                "run",
                *job,
                "--out",
                str(tmp_path / "out.parquet"),
                "--chunk-size",
                "1",
                "--price-request",
                "0.01",
                "--max-cost",
                "0.01",
            ]
        )
        == 0
    )
    out = pl.read_parquet(tmp_path / "out.parquet")
    assert endpoint.stats()["requests"] == 1
    answered = out.filter(pl.col("completion_status") == "ok")
    assert answered["text"].n_unique() == 1  # one distinct request fit the budget
    assert (out["completion_status"] == "skipped").sum() == 4 - answered.height
    assert "a budget was reached" in capsys.readouterr().out


def test_run_with_the_semantic_cache(job, table, tmp_path):
    out, options = tmp_path / "out.parquet", ["--semantic-cache", "sim-embed", "--no-progress"]
    assert main(["run", *job, "--out", str(out), *options]) == 0
    pl.DataFrame({"id": [5], "text": ["Good!"]}).write_parquet(table)
    assert main(["run", *job, "--out", str(out), *options, "--similarity", "0.9"]) == 0
    assert pl.read_parquet(out)["completion_status"].to_list() == ["similar"]


def test_run_a_cascade(job, tmp_path):
    out, first = tmp_path / "out.parquet", [("sim-small" if a == "sim" else a) for a in job]
    cascade = ["--model", "sim", "--escalate", "completion LIKE '%bad%'"]
    assert main(["run", *first, *cascade, "--out", str(out), "--no-progress"]) == 0
    assert pl.read_parquet(out)["completion_model"].to_list() == [
        "sim-small",
        "sim",
        "sim-small",
        None,
    ]
