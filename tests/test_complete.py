"""Behaviour of llm_complete against the real local endpoint and a real DuckDB cache."""

from __future__ import annotations

import asyncio

import polars as pl
import pyarrow as pa
import pytest

from llm_ops import (
    STATUS_DTYPE,
    Client,
    ConfigError,
    Retries,
    RowsFailedError,
    Sampling,
    SemanticCache,
    last_report,
    llm_complete,
    llm_complete_async,
)
from llm_ops.testing import expected_reply


def test_each_row_gets_the_answer_to_its_own_prompt(complete):
    df = pl.DataFrame({"text": [f"review number {i}" for i in range(50)]})
    out = df.pipe(complete, prompt="Summarize: {text}", concurrency=8)
    expected = [expected_reply(f"Summarize: {t}", model="sim") for t in df["text"]]
    assert out["completion"].to_list() == expected


def test_duplicate_prompts_are_sent_once(complete, endpoint):
    df = pl.DataFrame({"text": ["a", "b", "a", "a", "b", "c"] * 5})
    df.pipe(complete, prompt="{text}")
    assert endpoint.stats()["requests"] == 3


def test_second_run_sends_nothing_and_marks_rows_cached(complete, endpoint):
    df = pl.DataFrame({"text": ["a", "b", "a"]})
    first = df.pipe(complete, prompt="{text}")
    endpoint.reset()
    second = df.pipe(complete, prompt="{text}")
    assert endpoint.stats()["requests"] == 0
    assert second["completion_status"].to_list() == ["cached"] * 3
    assert second["completion"].to_list() == first["completion"].to_list()


def test_null_inputs_are_skipped_and_never_sent(complete, endpoint):
    df = pl.DataFrame({"text": ["a", None, "b"]})
    out = df.pipe(complete, prompt="{text}")
    assert out["completion_status"].to_list() == ["ok", "skipped", "ok"]
    assert out["completion_error"][1] == "column 'text' is null; row not sent"
    assert endpoint.stats()["requests"] == 2


def test_row_count_order_and_input_columns_are_kept(complete):
    df = pl.DataFrame({"id": [5, 3, 9, 1], "text": ["x", "y", "x", None]})
    out = df.pipe(complete, prompt="{text}")
    assert out.select("id", "text").equals(df)
    assert out.columns == ["id", "text", "completion", "completion_status", "completion_error"]


def test_input_frame_is_not_mutated(complete):
    df = pl.DataFrame({"text": ["x"]})
    df.pipe(complete, prompt="{text}")
    assert df.columns == ["text"]


def test_rejected_rows_do_not_stop_the_others(complete):
    df = pl.DataFrame({"text": ["fine", "[[sim:status=400]] bad", "also fine"]})
    out = df.pipe(complete, prompt="{text}")
    assert out["completion_status"].to_list() == ["ok", "rejected", "ok"]
    assert out["completion_error"][1] == "HTTP 400: simulated error 400"
    assert out["completion"][1] is None


def test_transient_errors_are_retried(complete, endpoint):
    df = pl.DataFrame({"text": ["[[sim:fail_times=2]] [[sim:fail_status=503]] flaky"]})
    out, report = df.pipe(complete, prompt="{text}", return_report=True)
    assert out["completion_status"].to_list() == ["ok"]
    assert (report.requests_sent, report.retries) == (3, 2)


def test_retries_exhausted_mark_the_row_failed(complete):
    df = pl.DataFrame({"text": ["[[sim:fail_times=9]] down"]})
    out = df.pipe(complete, prompt="{text}", retries=Retries(max_attempts=2))
    assert out["completion_status"].to_list() == ["failed"]
    assert out["completion_error"][0].startswith("gave up after 2 attempts: HTTP 500")


def test_truncated_answers_keep_the_partial_text(complete):
    df = pl.DataFrame({"text": ["one two three four five"]})
    out = df.pipe(complete, prompt="{text}", sampling=Sampling(max_tokens=3))
    assert out["completion_status"].to_list() == ["truncated"]
    assert out["completion"][0] == expected_reply(
        "one two three four five", model="sim", max_tokens=3
    )


def test_lazyframe_in_lazyframe_out(complete):
    out = pl.LazyFrame({"text": ["x"]}).pipe(complete, prompt="{text}")
    assert isinstance(out, pl.LazyFrame)
    assert out.collect()["completion_status"].to_list() == ["ok"]


def test_a_lazyframe_sends_nothing_until_it_is_collected(complete, endpoint):
    out = pl.LazyFrame({"text": ["x", "y"]}).pipe(complete, prompt="{text}")
    assert endpoint.stats()["requests"] == 0
    out.collect()
    assert endpoint.stats()["requests"] == 2


LAZY_OPTIONS = {
    "plain": {},
    "schema": {"schema": {"type": "object", "properties": {"n": {"type": "integer"}}}},
    "cascade": {"model": ["sim-small", "sim"]},
    "semantic cache": {"semantic_cache": SemanticCache("sim-embed", threshold=0.99)},
}


@pytest.mark.parametrize("options", LAZY_OPTIONS.values(), ids=LAZY_OPTIONS)
def test_a_collected_lazyframe_equals_the_eager_result(complete, tmp_path, options):
    df = pl.DataFrame({"id": [1, 2, 3], "text": ["x", None, "x"]})
    lazy = df.lazy().pipe(complete, prompt="{text}", cache=tmp_path / "lazy.duckdb", **options)
    eager = df.pipe(complete, prompt="{text}", cache=tmp_path / "eager.duckdb", **options)
    assert lazy.collect().equals(eager)


def test_a_lazyframes_schema_is_known_before_it_is_collected(complete, endpoint):
    out = pl.LazyFrame({"text": ["x"]}).pipe(complete, prompt="{text}", output="a")
    assert out.collect_schema() == {
        "text": pl.String,
        "a": pl.String,
        "a_status": STATUS_DTYPE,
        "a_error": pl.String,
    }
    assert endpoint.stats()["requests"] == 0


def test_a_bad_option_with_a_lazyframe_is_refused_before_it_is_collected(complete, endpoint):
    with pytest.raises(ConfigError, match="on_error must be"):
        pl.LazyFrame({"text": ["x"]}).pipe(complete, prompt="{text}", on_error="maybe")
    assert endpoint.stats()["requests"] == 0


def test_a_bad_template_with_a_lazyframe_is_refused_before_it_is_collected(complete):
    with pytest.raises(ConfigError, match="title"):
        pl.LazyFrame({"text": ["x"]}).pipe(complete, prompt="{title}")


def test_return_report_with_a_lazyframe_is_refused(complete):
    with pytest.raises(ConfigError, match="last_report"):
        pl.LazyFrame({"text": ["x"]}).pipe(complete, prompt="{text}", return_report=True)


def test_a_lazyframes_report_is_the_last_report_once_collected(complete):
    pl.LazyFrame({"text": ["x", "x", None]}).pipe(complete, prompt="{text}").collect()
    report = last_report()
    assert (report.rows, report.requests_sent, report.statuses["skipped"]) == (3, 1, 1)


def test_on_error_raise_with_a_lazyframe_raises_at_collect(complete):
    out = pl.LazyFrame({"text": ["x", "[[sim:status=400]]"]}).pipe(
        complete, prompt="{text}", on_error="raise"
    )
    with pytest.raises(RowsFailedError, match="row 1: rejected"):
        out.collect()


def test_a_failed_row_without_a_cache_says_a_rerun_sends_every_row(endpoint):
    df = pl.DataFrame({"text": ["x", "[[sim:status=400]]"]})
    with pytest.raises(RowsFailedError, match="the cache is off, so a rerun sends every row"):
        df.pipe(
            llm_complete,
            prompt="{text}",
            model="sim",
            endpoint=endpoint.base_url,
            cache=False,
            on_error="raise",
        )


def test_an_async_call_with_a_lazyframe_stays_lazy(endpoint, cache):
    lazy = asyncio.run(
        llm_complete_async(
            pl.LazyFrame({"text": ["x"]}),
            prompt="{text}",
            model="sim",
            endpoint=endpoint.base_url,
            cache=cache,
        )
    )
    assert isinstance(lazy, pl.LazyFrame) and endpoint.stats()["requests"] == 0
    assert lazy.collect()["completion_status"].to_list() == ["ok"]


def test_arrow_table_in_arrow_table_out(complete):
    out = complete(pa.table({"text": ["x"]}), prompt="{text}")
    assert isinstance(out, pa.Table)
    assert out.column("completion").to_pylist() == [expected_reply("x", model="sim")]


def test_system_message_is_a_template_too(complete):
    df = pl.DataFrame({"text": ["x"], "lang": ["French"]})
    out = df.pipe(complete, prompt="{text}", system="Answer in {lang}.")
    assert out["completion"][0] == expected_reply("x", model="sim", system="Answer in French.")


def test_braces_can_be_escaped(complete):
    out = pl.DataFrame({"text": ["x"]}).pipe(complete, prompt="{{json}} {text}")
    assert out["completion"][0] == expected_reply("{json} x", model="sim")


def test_numbers_are_rendered_as_text(complete):
    out = pl.DataFrame({"stars": [4]}).pipe(complete, prompt="Stars: {stars}")
    assert out["completion"][0] == expected_reply("Stars: 4", model="sim")


def test_sync_call_works_inside_a_running_event_loop(complete):
    async def notebook_cell():
        return pl.DataFrame({"text": ["x"]}).pipe(complete, prompt="{text}")

    out = asyncio.run(notebook_cell())
    assert out["completion_status"].to_list() == ["ok"]


def test_async_variant(endpoint, cache):
    out = asyncio.run(
        llm_complete_async(
            pl.DataFrame({"text": ["x"]}),
            prompt="{text}",
            model="sim",
            endpoint=endpoint.base_url,
            cache=cache,
        )
    )
    assert out["completion_status"].to_list() == ["ok"]


def test_report_counts(complete):
    df = pl.DataFrame({"text": ["a", "a", None, "b"]})
    _, report = df.pipe(complete, prompt="{text}", return_report=True)
    assert (report.rows, report.distinct_requests, report.cache_hits, report.requests_sent) == (
        4,
        2,
        0,
        2,
    )
    assert report.statuses["ok"] == 3 and report.statuses["skipped"] == 1
    assert report.completion_tokens > 0


def test_output_name_sets_all_three_columns(complete):
    out = pl.DataFrame({"text": ["x"]}).pipe(complete, prompt="{text}", output="summary")
    assert out.columns[1:] == ["summary", "summary_status", "summary_error"]


@pytest.mark.parametrize("on_error", ["null", "raise"])
def test_failed_rows_answer_null_or_raise_after_caching(complete, endpoint, on_error):
    from llm_ops import RowsFailedError

    df = pl.DataFrame({"text": ["good", "[[sim:status=404]]"]})
    if on_error == "raise":
        with pytest.raises(RowsFailedError, match="row 1: rejected: HTTP 404"):
            df.pipe(complete, prompt="{text}", on_error="raise")
    else:
        assert df.pipe(complete, prompt="{text}")["completion"][1] is None
    endpoint.reset()
    again = df.pipe(complete, prompt="{text}")
    assert again["completion_status"].to_list() == ["cached", "rejected"]


def _cached(cache) -> int:
    from llm_ops import open_cache

    with open_cache(cache) as con:
        return con.execute("SELECT count(*) FROM llm_cache").fetchall()[0][0]


@pytest.mark.parametrize("reason", ["error", "abort", "none"])
def test_an_answer_that_did_not_finish_is_retried(complete, endpoint, reason):
    df = pl.DataFrame({"text": [f"hi [[sim:finish_reason={reason}]] [[sim:fail_times=1]]"]})
    out = df.pipe(complete, prompt="{text}")
    assert out["completion_status"].to_list() == ["ok"]
    assert endpoint.stats()["requests"] == 2


@pytest.mark.parametrize("reason", ["error", "abort", "none"])
def test_an_answer_that_never_finishes_fails_and_is_not_cached(complete, cache, reason):
    df = pl.DataFrame({"text": [f"hi [[sim:finish_reason={reason}]]"]})
    out = df.pipe(complete, prompt="{text}", retries=Retries(max_attempts=2))
    assert out["completion_status"].to_list() == ["failed"]
    assert "did not finish" in out["completion_error"][0]
    assert out["completion"].to_list() == [None]
    assert _cached(cache) == 0


def test_a_filtered_answer_has_its_own_status_and_is_not_cached(complete, endpoint, cache):
    df = pl.DataFrame({"text": ["hi [[sim:finish_reason=content_filter]]"]})
    out = df.pipe(complete, prompt="{text}")
    assert out.row(0)[1:] == (
        None,
        "filtered",
        "the endpoint's content filter stopped the answer (finish_reason 'content_filter')",
    )
    assert endpoint.stats()["requests"] == 1  # not retried
    assert _cached(cache) == 0


def test_a_200_carrying_an_error_is_retried(complete, endpoint):
    df = pl.DataFrame({"text": ["hi [[sim:error_in_200=1]] [[sim:fail_times=1]]"]})
    assert df.pipe(complete, prompt="{text}")["completion_status"].to_list() == ["ok"]
    assert endpoint.stats()["requests"] == 2


def test_a_200_always_carrying_an_error_fails_and_is_not_cached(complete, cache):
    df = pl.DataFrame({"text": ["hi [[sim:error_in_200=1]]"]})
    out = df.pipe(complete, prompt="{text}", retries=Retries(max_attempts=2))
    assert out["completion_status"].to_list() == ["failed"]
    assert "failed midway" in out["completion_error"][0]
    assert _cached(cache) == 0


def test_a_prompt_without_columns_gives_every_row_the_one_answer(complete, endpoint):
    out = pl.DataFrame({"id": [1, 2, 3]}).pipe(complete, prompt="Tell me a joke")
    assert out["completion"].to_list() == [expected_reply("Tell me a joke", model="sim")] * 3
    assert endpoint.stats()["requests"] == 1


def test_text_that_is_not_utf8_is_refused_naming_the_column(complete, endpoint):
    data = pa.py_buffer(b"okbad\xff")
    offsets = pa.py_buffer(pa.array([0, 2, 6], pa.int32()).buffers()[1])
    table = pa.table({"text": pa.StringArray.from_buffers(2, offsets, data)})
    with pytest.raises(
        ConfigError,
        match=r"column 'text' .* not valid UTF-8 in 1 row\(s\) "
        r"\(first: row 1\)",
    ):
        complete(table, prompt="{text}")
    assert endpoint.stats()["requests"] == 0


def test_a_clients_lazyframe_is_sent_on_that_client_when_collected(endpoint, cache):
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        out = client.complete(pl.LazyFrame({"text": ["x", "y"]}), "{text}", model="sim")
        assert endpoint.stats()["requests"] == 0
        assert out.collect()["completion_status"].to_list() == ["ok", "ok"]


def test_a_clients_lazy_embedding_is_sent_when_collected(endpoint, cache):
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        out = client.embed(pl.LazyFrame({"text": ["x"]}), "text", model="sim-embed")
        assert endpoint.stats()["embedding_requests"] == 0
        assert out.collect()["embedding_status"].to_list() == ["ok"]
