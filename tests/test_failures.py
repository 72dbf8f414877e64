"""Failed rows speak up: one warning per job with the count and the most common reasons."""

from __future__ import annotations

import warnings

import duckdb
import polars as pl
import pytest

import llm_ops
from llm_ops import LlmOpsWarning, RowsFailedWarning
from llm_ops._failures import count_reasons, early_note
from llm_ops.sql import register
from llm_ops.tables import Table

REFUSED = "refused [[sim:status=400]]"
ROWS = pl.DataFrame({"text": [REFUSED] * 3 + ["fine"]})


def test_failed_rows_warn_once_with_the_count_and_the_reason(complete):
    with pytest.warns(RowsFailedWarning) as caught:
        ROWS.pipe(complete, prompt="{text} {text}")
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith("3 of 4 rows failed: 3 with 'HTTP 400: simulated error")
    assert "'completion_error' column" in message


def test_the_warning_points_at_the_callers_line(complete):
    with pytest.warns(RowsFailedWarning) as caught:
        ROWS.pipe(complete, prompt="{text}")
    assert caught[0].filename == __file__


def test_no_warning_when_every_row_is_answered(complete):
    with warnings.catch_warnings():
        warnings.simplefilter("error", LlmOpsWarning)
        pl.DataFrame({"text": ["a", "b", None]}).pipe(complete, prompt="{text}")


def test_the_warning_is_filtered_by_its_class(complete):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", LlmOpsWarning)
        ROWS.pipe(complete, prompt="{text}")
    assert not [w for w in caught if issubclass(w.category, LlmOpsWarning)]


def test_the_report_counts_failed_rows_by_reason(complete):
    with pytest.warns(RowsFailedWarning):
        _, report = ROWS.pipe(complete, prompt="{text}", return_report=True)
    assert list(report.errors.values()) == [3]


def test_an_expression_warns_once_for_its_rows(endpoint):
    expr = pl.col("text").llm.complete("{}", model="sim", endpoint=endpoint.base_url, cache=False)
    with pytest.warns(RowsFailedWarning, match="3 of 4 rows failed") as caught:
        ROWS.with_columns(expr)
    assert len(caught) == 1 and llm_ops.last_report().errors


def test_a_table_job_warns_with_its_output_column(tmp_path, endpoint, cache):
    ROWS.write_parquet(tmp_path / "in.parquet")
    with llm_ops.Client(endpoint=endpoint.base_url, cache=cache) as client:
        table = Table(
            client, tmp_path / "in.parquet", tmp_path / "o.parquet", prompt="{text}", model="sim"
        )
        with pytest.warns(RowsFailedWarning, match="'completion_error' column of"):
            table.run()


def test_reasons_do_not_split_on_each_rows_numbers():
    errors = [
        ("the request needs about 9,120 tokens", 1),
        ("the request needs about 870 tokens", 2),
    ]
    assert count_reasons(errors) == {"the request needs about N tokens": 3}


def test_the_early_note_needs_most_of_the_first_rows_to_fail_alike():
    assert (
        early_note(["HTTP 401: bad key"] * 18)
        == "18 of the first 20 rows failed: 'HTTP 401: bad key'"
    )
    assert early_note(["HTTP 401: bad key"] * 10 + ["HTTP 500"] * 10) is None


def test_a_sql_call_warns_with_its_rows(endpoint):
    con = duckdb.connect()
    register(con, endpoint=endpoint.base_url, cache=False)
    with pytest.warns(RowsFailedWarning, match="1 of 2 rows failed: 1 with 'HTTP 400"):
        con.sql(
            f"SELECT llm_complete(t, model := 'sim') FROM (VALUES ('ok'), ('{REFUSED}')) v(t)"
        ).fetchall()
