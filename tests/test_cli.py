"""The llm-ops command line, in process and through its installed entry point."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

import llm_ops
from llm_ops._options import setting_names
from llm_ops._settings import DECLARED
from llm_ops.cli import main
from llm_ops.cli._job_arguments import flagged_settings

LLM_OPS = str(Path(sys.executable).with_name("llm-ops"))
COMMANDS = [
    ["run"],
    ["estimate"],
    ["sql"],
    ["serve"],
    ["batches"],
    ["cache"],
    ["cache", "stats"],
    ["cache", "export"],
    ["cache", "prune"],
    ["cache", "snapshot"],
    ["cache", "vacuum"],
    ["cache", "merge"],
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


@pytest.mark.parametrize("command", [[], *COMMANDS], ids=lambda c: " ".join(c) or "llm-ops")
def test_help_speaks_cli_not_python(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    said = capsys.readouterr().out
    assert not re.search(r"\b(None|False|True)\b|:class:|:func:|`", said)


def test_every_flat_setting_is_a_flag_or_given_otherwise():
    flags = {s.name for s in DECLARED if s.flat and (s.cli or s.given)}
    assert flags | {"on_error", "progress", "schema"} == setting_names()
    assert flagged_settings() < setting_names()


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"llm-ops {llm_ops.__version__}\n"


def test_run_writes_the_rows_with_their_answers(job, tmp_path, endpoint, capsys):
    assert main(["run", *job, "--output", str(tmp_path / "out.parquet"), "--no-progress"]) == 0
    out = pl.read_parquet(tmp_path / "out.parquet")
    assert out["completion_status"].to_list() == ["ok", "ok", "ok", "skipped"]
    assert endpoint.stats()["requests"] == 2
    assert "distinct requests           2" in capsys.readouterr().out


def test_run_prints_why_rows_failed(job, table, tmp_path, capsys):
    pl.DataFrame({"text": ["good", "no [[sim:status=400]]"]}).write_parquet(table)
    assert main(["run", *job, "--output", str(tmp_path / "out.parquet"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "1 row(s) failed" in err and "1  'HTTP 400: simulated error" in err


def test_estimate_of_a_job_the_cache_answers_costs_nothing(job, tmp_path, endpoint, capsys):
    endpoint.configure(models=("mystery",))  # a model without a price
    job = [arg if arg != "sim" else "mystery" for arg in job]
    assert main(["run", *job, "--output", str(tmp_path / "out.parquet"), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["estimate", *job]) == 0
    out = capsys.readouterr().out
    assert "cost                 $0.0000 to $0.0000" in out and "no price" not in out


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
                "--output",
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
    main(["run", *job, "--output", str(tmp_path / "out.parquet")])
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
                "--output",
                str(tmp_path / "o.parquet"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert err.startswith("llm-ops: error: no input file matches") and err.count("\n") == 1


def test_an_unknown_column_is_one_line_and_non_zero(job, tmp_path, capsys):
    job[2] = "{body}"
    assert main(["run", *job, "--output", str(tmp_path / "o.parquet")]) == 1
    assert "column 'body'" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()


def test_cache_stats_export_prune_vacuum(job, tmp_path, cache, capsys):
    main(["run", *job, "--output", str(tmp_path / "out.parquet")])
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
    main(["run", *job, "--output", str(tmp_path / "out.parquet")])
    assert main(["cache", "--cache", str(cache), "snapshot", str(tmp_path / "copy.duckdb")]) == 0
    with duckdb.connect(str(tmp_path / "copy.duckdb"), read_only=True) as copy:
        assert copy.execute("SELECT count(*) FROM llm_cache").fetchall() == [(2,)]


def _answered_while_held(job, tmp_path, cache, hold) -> None:
    """Run a job, then another whose 2 answers stay in the journal (a reader holds the file
    until it ends)."""
    main(["run", *job, "--output", str(tmp_path / "out.parquet"), "--no-progress"])
    reader = hold(cache)
    titles = [*job[:2], "Title: {text}", *job[3:]]
    out = tmp_path / "titles.parquet"
    main(["run", *titles, "--output", str(out), "--no-progress", "--merge-wait", "0.1"])
    reader.release()
    with duckdb.connect(str(cache), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM llm_cache").fetchall() == [(2,)]


def test_run_says_when_answers_wait_in_the_journal(job, tmp_path, cache, hold, capsys):
    _answered_while_held(job, tmp_path, cache, hold)
    said = capsys.readouterr().out
    assert "2 answers wait in the journal" in said
    assert f"run `llm-ops cache merge --cache {cache}`" in said


def test_cache_merge_merges_what_jobs_left_in_the_journal(job, tmp_path, cache, hold, capsys):
    _answered_while_held(job, tmp_path, cache, hold)
    capsys.readouterr()
    assert main(["cache", "merge", "--cache", str(cache)]) == 0
    assert "llm_cache 2, llm_runs 1" in capsys.readouterr().out
    with duckdb.connect(str(cache), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM llm_cache").fetchall() == [(4,)]
    assert main(["cache", "merge", "--cache", str(cache)]) == 0
    assert "nothing waits in the journal" in capsys.readouterr().out


def test_cache_merge_exits_1_while_the_file_is_held(job, tmp_path, cache, hold, capsys):
    _answered_while_held(job, tmp_path, cache, hold)
    hold(cache)
    capsys.readouterr()
    assert main(["cache", "merge", "--cache", str(cache), "--wait", "0.1"]) == 1
    assert "2 answer(s) still wait in the journal" in capsys.readouterr().err


def test_a_damaged_cache_is_one_line_that_says_what_to_do(
    job, tmp_path, cache, endpoint, capsys, monkeypatch
):
    main(["run", *job, "--output", str(tmp_path / "out.parquet"), "--no-progress"])
    os.truncate(cache, cache.stat().st_size // 2)
    monkeypatch.chdir(tmp_path)  # the cache named as people type it: DuckDB says it in full
    endpoint.reset()
    assert main(["run", *job[:-1], cache.name, "--output", "again.parquet", "--no-progress"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("llm-ops: error: the cache cache.duckdb cannot be read: it is damaged")
    assert "Move it aside" in said and said.count("\n") == 1
    assert endpoint.stats()["requests"] == 0


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(Exception, match="no input file matches"):
        main(["--debug", "estimate", str(tmp_path / "nope"), "--prompt", "x", "--model", "m"])


def test_the_installed_command(tmp_path):
    result = subprocess.run(
        [LLM_OPS, "cache", "stats", "--cache", str(tmp_path / "none.duckdb")],
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
                "--output",
                str(tmp_path / "out.parquet"),
                "--chunk-size",
                "1",
                "--pricing",
                "0,0,0.01",
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
    assert main(["run", *job, "--output", str(out), *options]) == 0
    pl.DataFrame({"id": [5], "text": ["Good!"]}).write_parquet(table)
    assert (
        main(["run", *job, "--output", str(out), *options, "--semantic-cache-threshold", "0.9"])
        == 0
    )
    assert pl.read_parquet(out)["completion_status"].to_list() == ["similar"]


def test_run_a_cascade(job, tmp_path):
    out, first = tmp_path / "out.parquet", [("sim-small" if a == "sim" else a) for a in job]
    cascade = ["--model", "sim", "--escalate", "completion LIKE '%bad%'"]
    assert main(["run", *first, *cascade, "--output", str(out), "--no-progress"]) == 0
    assert pl.read_parquet(out)["completion_model"].to_list() == [
        "sim-small",
        "sim",
        "sim-small",
        None,
    ]


def test_cache_path_before_or_after_the_action(job, tmp_path, cache, capsys):
    main(["run", *job, "--output", str(tmp_path / "out.parquet")])
    assert main(["cache", "stats", "--cache", str(cache)]) == 0
    assert main(["cache", "--cache", str(cache), "stats"]) == 0
    assert capsys.readouterr().out.count("1 run(s) recorded") == 2


def test_estimate_leaves_no_cache_behind(job, tmp_path, capsys):
    assert main(["estimate", *job]) == 0
    assert "cache hits                      0" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["reviews.parquet"]


def test_output_csv(job, tmp_path):
    assert main(["run", *job, "--output", str(tmp_path / "out.csv")]) == 0
    out = pl.read_csv(tmp_path / "out.csv")
    assert out["completion_status"].to_list() == ["ok", "ok", "ok", "skipped"]
    assert not list(tmp_path.glob("out.csv.*"))  # no Parquet, work directory or partial file


def test_output_column_names_the_answer_column(job, tmp_path):
    out = tmp_path / "out.parquet"
    assert main(["run", *job, "--output", str(out), "--output-column", "rating"]) == 0
    assert pl.read_parquet(out).columns == ["id", "text", "rating", "rating_status", "rating_error"]


def test_the_old_out_flag_is_refused_naming_the_new_ones(job, capsys):
    with pytest.raises(SystemExit):
        main(["run", *job, "--out", "out.parquet"])
    assert "--output, --output-column" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("old", "new"),
    [("--batch-max-requests", "--requests-per-batch"), ("--batch-max-bytes", "--bytes-per-batch")],
)
def test_a_renamed_batch_flag_is_refused_naming_the_new_one(job, tmp_path, old, new, capsys):
    with pytest.raises(SystemExit):
        main(["run", *job, "--output", str(tmp_path / "o.parquet"), "--batch", old, "10"])
    assert f"{old} is {new} now" in capsys.readouterr().err


def test_requests_per_batch_cuts_the_batch_files(job, tmp_path, endpoint):
    flags = ["--batch", "--requests-per-batch", "1", "--batch-poll-seconds", "0.05"]
    assert main(["run", *job, "--output", str(tmp_path / "o.parquet"), *flags]) == 0
    assert endpoint.stats()["batches"] == 2  # two distinct requests, one a file


def test_an_output_of_another_kind_is_refused_before_sending(job, tmp_path, endpoint, capsys):
    assert main(["run", *job, "--output", str(tmp_path / "out.json")]) == 1
    assert "name a .parquet or a .csv file" in capsys.readouterr().err
    assert endpoint.stats()["requests"] == 0


def test_nested_columns_cannot_go_to_csv(job, table, tmp_path, endpoint, capsys):
    pl.DataFrame({"text": ["good"], "tags": [["a", "b"]]}).write_parquet(table)
    assert main(["run", *job, "--output", str(tmp_path / "out.csv")]) == 1
    assert "nested column(s) tags; write a .parquet file" in capsys.readouterr().err
    assert endpoint.stats()["requests"] == 0


def test_one_progress_line_over_every_chunk(job, tmp_path):
    terminal, stderr = pty.openpty()  # progress is drawn on a terminal only
    command = [LLM_OPS, "run", *job, "--output", str(tmp_path / "o.parquet"), "--chunk-size", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    os.close(stderr)
    drawn = b""
    with contextlib.suppress(OSError):  # EIO once the command has closed the terminal
        while data := os.read(terminal, 4096):
            drawn += data
    assert process.wait() == 0
    text = drawn.decode()
    assert "llm-ops chunk 1/2:" in text
    assert text.count("\n") == 1  # tqdm's bar, redrawn in place, not a line per chunk
    assert text.rstrip().rsplit("\r", 1)[-1].startswith("llm-ops chunk 2/2: 100%|")


def test_api_key_env_names_the_key(job, tmp_path, endpoint, monkeypatch, capsys):
    endpoint.configure(api_key="sk-from-another-variable")
    monkeypatch.setenv("OTHER_API_KEY", "sk-from-another-variable")
    out = tmp_path / "out.parquet"
    assert main(["run", *job, "--output", str(out), "--api-key-env", "OTHER_API_KEY"]) == 0
    assert pl.read_parquet(out)["completion_status"].to_list() == ["ok", "ok", "ok", "skipped"]
    assert "sk-from-another-variable" not in str(capsys.readouterr())


def test_api_key_env_unset_is_one_line(job, tmp_path, endpoint, capsys):
    assert (
        main(["run", *job, "--output", str(tmp_path / "o.parquet"), "--api-key-env", "NO_SUCH"])
        == 1
    )
    err = capsys.readouterr().err
    assert "NO_SUCH is not set" in err and err.count("\n") == 1
    assert endpoint.stats()["requests"] == 0


def test_sql_reads_the_cache(job, tmp_path, cache, capsys):
    main(["run", *job, "--output", str(tmp_path / "out.parquet")])
    capsys.readouterr()
    query = "SELECT count(*) AS answers FROM cache.llm_cache"
    assert main(["sql", query, "--cache", str(cache)]) == 0
    assert "│ 2       │" in capsys.readouterr().out


def test_sql_llm_complete(endpoint, cache, capsys):
    query = "SELECT llm_complete('Summarize: ' || 'x') AS summary"
    sql = ["sql", query, "--model", "sim", "--base-url", endpoint.base_url, "--cache", str(cache)]
    assert main(sql) == 0
    assert "Summarize: x" in capsys.readouterr().out
    assert endpoint.stats()["requests"] == 1


def test_sql_answers_reach_the_attached_cache(job, tmp_path, endpoint, cache, capsys):
    main(["run", *job, "--output", str(tmp_path / "out.parquet")])
    query = "SELECT llm_complete('new', model := 'sim'), (SELECT count(*) FROM cache.llm_cache)"
    assert main(["sql", query, "--base-url", endpoint.base_url, "--cache", str(cache)]) == 0
    with duckdb.connect(str(cache), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM llm_cache").fetchall() == [(3,)]
    assert capsys.readouterr().err == ""  # nothing about answers waiting in the journal


def test_sql_without_a_key_fails_only_when_it_sends(cache, capsys):
    assert main(["sql", "SELECT 1 AS one", "--cache", str(cache)]) == 0
    assert main(["sql", "SELECT llm_complete('x', model := 'm')", "--cache", str(cache)]) == 1
    assert "set OPENAI_API_KEY, or name the variable" in capsys.readouterr().err


def test_sql_from_a_file_prints_at_most_max_rows(tmp_path, cache, capsys):
    (tmp_path / "q.sql").write_text("SELECT * FROM range(5)")
    sql = ["sql", "--file", str(tmp_path / "q.sql"), "--max-rows", "2", "--cache", str(cache)]
    assert main(sql) == 0
    out = capsys.readouterr().out
    assert "│ 1     │" in out and "│ 2     │" not in out
    assert "3 more row(s) not shown" in out


def test_sql_output_csv(tmp_path, cache):
    out = tmp_path / "x.csv"
    assert (
        main(["sql", "SELECT 1 AS n, 'a' AS s", "--output", str(out), "--cache", str(cache)]) == 0
    )
    assert pl.read_csv(out).to_dicts() == [{"n": 1, "s": "a"}]


def test_sql_error_is_one_line(cache, capsys):
    assert main(["sql", "SELEC 1", "--cache", str(cache)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("llm-ops: error: Parser Error") and err.count("\n") == 1


def test_price_per_model_prices_each_model_of_a_cascade(job, capsys):
    args = ["--model", "sim-small", "--pricing", "sim-small=0.15,0.60", "--pricing", "sim=2.5,10"]
    assert main(["estimate", *job, *args, "--max-tokens", "10"]) == 0
    assert "no price" not in capsys.readouterr().out


def test_a_malformed_price_is_refused_saying_what_it_takes(job, capsys):
    assert main(["estimate", *job, "--pricing", "sim=cheap"]) != 0
    assert "--pricing takes MODEL=IN,OUT" in capsys.readouterr().err


def test_a_header_from_the_environment_opens_an_azure_shaped_endpoint(
    job, tmp_path, endpoint, monkeypatch
):
    endpoint.configure(api_key="azure-key-0123456789", api_key_header="api-key")
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-key-0123456789")
    out = tmp_path / "out.parquet"
    azure = ["--header-env", "api-key=AZURE_OPENAI_API_KEY", "--header", "X-Tenant: acme"]
    assert main(["run", *job, *azure, "--output", str(out)]) == 0
    assert pl.read_parquet(out)["completion_status"].to_list() == ["ok", "ok", "ok", "skipped"]
    assert "X-Tenant" in endpoint.stats()["header_names"]


def test_a_header_env_naming_an_unset_variable_is_one_line(job, tmp_path, capsys):
    out = str(tmp_path / "out.parquet")
    assert main(["run", *job, "--header-env", "api-key=NOT_SET_ANYWHERE", "--output", out]) == 1
    assert "--header-env takes NAME=VARIABLE with VARIABLE set" in capsys.readouterr().err


def test_run_exits_1_when_no_row_got_an_answer(job, table, tmp_path, capsys):
    pl.DataFrame({"text": ["no [[sim:status=400]]", "nor [[sim:status=422]]"]}).write_parquet(table)
    assert main(["run", *job, "--output", str(tmp_path / "out.parquet"), "--no-progress"]) == 1
    assert "no row got an answer" in capsys.readouterr().err
    assert pl.read_parquet(tmp_path / "out.parquet").height == 2  # written all the same


def test_run_stopped_by_refusals_alike_exits_1_with_the_reason(job, table, tmp_path, capsys):
    pl.DataFrame({"text": [f"{i} [[sim:status=400]]" for i in range(30)]}).write_parquet(table)
    assert main(["run", *job, "--output", str(tmp_path / "out.parquet"), "--no-progress"]) == 1
    assert "refused the first 8 requests alike (HTTP 400: simulated error 400)" in (
        capsys.readouterr().err
    )


def test_a_bad_duration_is_one_line_listing_the_units(job, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", *job, "--output", str(tmp_path / "o.parquet"), "--max-age", "1week"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert "--max-age: a duration is a positive number with s, m, h or d (1d, 6h" in err


def test_a_missing_key_names_the_flags_that_give_one(job, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    remote = [*job, "--base-url", "https://api.example.invalid/v1"]  # the last one counts
    assert main(["run", *remote, "--output", str(tmp_path / "o.parquet")]) == 1
    err = capsys.readouterr().err
    assert "pass --api-key-env VARIABLE or set OPENAI_API_KEY" in err
    assert "--header-env NAME=VARIABLE" in err
    assert "api_key=" not in err and "headers=" not in err


def test_a_base_url_without_v1_names_the_flag(job, tmp_path, endpoint, capsys):
    root = endpoint.base_url.removesuffix("/v1")
    assert main(["run", *job, "--base-url", root, "--output", str(tmp_path / "o.parquet")]) == 1
    err = capsys.readouterr().err
    assert f"did you mean --base-url {root}/v1?" in err
    assert "endpoint=" not in err


def test_an_unreachable_endpoint_names_the_flag(job, tmp_path, capsys):
    with socket.socket() as unused:  # a port nothing listens on once it is closed
        unused.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{unused.getsockname()[1]}/v1"
    flags = ["--base-url", closed, "--max-attempts", "1"]
    assert main(["run", *job, *flags, "--output", str(tmp_path / "o.parquet")]) == 1
    assert "Check --base-url and that the server is running" in capsys.readouterr().err


def test_python_still_names_the_option(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(llm_ops.MissingApiKeyError, match=r"pass api_key=\.\.\. or set"):
        llm_ops.Client(endpoint="https://api.example.invalid/v1")
