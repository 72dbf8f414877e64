"""The ``llm`` expression namespace and the frame operators on it, over HTTP to the simulator."""

from __future__ import annotations

import itertools
import threading
import time

import polars as pl
import pytest
from clocks import VirtualTime
from pydantic import BaseModel

import llm_ops
from llm_ops import (
    Cache,
    Client,
    ConfigError,
    RowsFailedError,
    TemplateError,
    llm_classify,
    llm_complete,
    llm_embed,
    llm_extract,
    llm_filter,
    open_cache,
)
from llm_ops._expr.reports import Reports, record_unrecorded
from llm_ops.polars import llm
from llm_ops.testing import expected_reply

TEXTS = pl.DataFrame({"id": [1, 2, 3, 4, 5], "text": ["b", "a", None, "b", "[[sim:status=400]]"]})


@pytest.fixture
def options(endpoint, cache):
    """What every expression here is given: the simulator, a fresh cache, model ``sim``."""
    return {"model": "sim", "endpoint": endpoint.base_url, "cache": cache}


@pytest.fixture
def small_batches():
    """The streaming engine hands each expression two rows at a time."""
    with pl.Config(streaming_chunk_size=2):
        yield


def summary(options, **more):
    return pl.col("text").llm.complete("Summarize: {}", with_status=True, **options, **more)


def struct_columns(frame, name="text"):
    return frame.select(pl.col(name).struct.unnest())


def keys(cache):
    with open_cache(cache) as con:
        return sorted(row[0] for row in con.sql("SELECT key FROM llm_cache").fetchall())


def test_answers_statuses_and_errors_are_llm_completes(options, endpoint, tmp_path):
    mine = struct_columns(TEXTS.select(summary(options)))
    sent = endpoint.stats()["requests"]
    endpoint.reset()
    theirs = TEXTS.pipe(llm_complete, prompt="Summarize: {text}", **{**options, "cache": False})
    assert mine.rows() == theirs.select("completion", "^completion_.*$").rows()
    assert sent == endpoint.stats()["requests"] == 3


def test_a_row_sent_by_llm_complete_is_cached_for_the_expression(options, endpoint):
    TEXTS.pipe(llm_complete, prompt="Summarize: {text}", **options)
    endpoint.reset()
    statuses = struct_columns(TEXTS.select(summary(options)))["status"]
    assert statuses.to_list() == ["cached", "cached", "skipped", "cached", "rejected"]
    assert endpoint.stats()["requests"] == 1  # the rejected row: rejections are not cached


def test_the_expression_and_llm_complete_write_the_same_keys(options, tmp_path):
    TEXTS.select(summary(options))
    theirs = tmp_path / "theirs.duckdb"
    TEXTS.pipe(llm_complete, prompt="Summarize: {text}", **{**options, "cache": theirs})
    assert keys(options["cache"]) == keys(theirs)


def test_a_lazy_frame_gives_what_the_eager_frame_gives(options):
    eager = TEXTS.with_columns(summary(options))
    lazy = TEXTS.lazy().with_columns(summary({**options, "cache": False})).collect()
    assert lazy.equals(eager)


def test_a_value_in_a_later_batch_is_sent_once(options, endpoint, small_batches):
    lazy = TEXTS.lazy().with_columns(summary(options)).collect()
    assert endpoint.stats()["requests"] == 3
    answers = struct_columns(lazy)["answer"]
    assert answers.to_list()[:2] == [expected_reply(f"Summarize: {t}", model="sim") for t in "ba"]
    assert answers[3] == answers[0]


def test_without_a_cache_later_batches_reuse_what_earlier_ones_got(
    options, endpoint, small_batches
):
    lazy = TEXTS.lazy().with_columns(summary({**options, "cache": False})).collect()
    assert endpoint.stats()["requests"] == 3
    assert lazy.equals(TEXTS.with_columns(summary({**options, "cache": False})))


def test_row_order_is_kept_in_streaming_batches(options, small_batches):
    rows = pl.DataFrame({"text": [f"review {i}" for i in range(9)]})
    out = rows.lazy().select(pl.col("text").llm.complete("{}", **options)).collect()
    assert out["text"].to_list() == [expected_reply(t, model="sim") for t in rows["text"]]


def test_the_plain_form_is_null_where_a_row_failed_or_was_skipped(options, endpoint):
    out = TEXTS.select(pl.col("text").llm.complete("Summarize: {}", **options))
    assert out["text"].is_null().to_list() == [False, False, True, False, True]
    assert endpoint.stats()["requests"] == 3  # the null row was not sent


def test_the_report_counts_the_failed_rows_of_every_batch(options, small_batches):
    TEXTS.lazy().select(pl.col("text").llm.complete("Summarize: {}", **options)).collect()
    report = llm_ops.last_report()
    assert (report.rows, report.failed_rows, report.statuses["skipped"]) == (5, 1, 1)


def test_a_query_is_recorded_in_llm_runs(options):
    TEXTS.select(pl.col("text").llm.complete("Summarize: {}", **options))
    with open_cache(options["cache"]) as con:
        runs = con.sql("SELECT rows, statuses['rejected'] FROM llm_runs").fetchall()
    assert runs == [(5, 1)]


def test_batches_within_flush_seconds_of_a_record_are_recorded_together(options, tmp_path):
    TEXTS.head(2).select(summary(options))
    batch = llm_ops.last_report()  # one batch's report, as an expression adds them up
    assert batch is not None
    clock = VirtualTime()
    runs = Cache(tmp_path / "runs.duckdb", flush_seconds=60)
    with Client(endpoint=options["endpoint"], cache=runs) as client:
        reports = Reports(client, clock=clock)
        recorded = []
        for now in (0.0, 59.0, 60.0):  # the first at once; the next waits; the third: both
            clock.now = now
            reports.include_batch(batch)
            with open_cache(runs.path) as con:
                recorded += con.sql("SELECT count(*), sum(rows) FROM llm_runs").fetchall()
    assert recorded == [(1, 2), (1, 2), (2, 6)]


def test_the_exit_waits_for_a_run_record_under_way(options, small_batches, monkeypatch):
    calls, counting = itertools.count(1), threading.Lock()
    started, finished = threading.Event(), threading.Event()
    record_run = Cache.record_run

    def slow(self, run, **kwargs):  # this query's second record is the one the timer writes
        with counting:
            timers = self.path == options["cache"] and next(calls) == 2
        if timers:
            started.set()
            time.sleep(0.3)
        try:
            return record_run(self, run, **kwargs)
        finally:
            if timers:
                finished.set()

    monkeypatch.setattr(Cache, "record_run", slow)
    slow_timer = Cache(options["cache"], flush_seconds=0.5)
    TEXTS.lazy().select(summary({**options, "cache": slow_timer})).collect()
    assert started.wait(10)
    record_unrecorded()  # what the exit does: the timer's thread is a daemon
    assert finished.is_set()


def test_on_error_raise_names_the_rows_of_the_batch(options):
    with pytest.raises(RowsFailedError, match="1 row") as raised:
        TEXTS.select(pl.col("text").llm.complete("{}", on_error="raise", **options))
    assert (raised.value.rows, raised.value.statuses) == ([4], ["rejected"])


def test_classify_gives_an_enum_of_the_labels(options):
    out = TEXTS.select(pl.col("text").llm.classify(["good", "bad"], **options))
    assert out.schema["text"] == pl.Enum(["good", "bad"])
    assert set(out["text"].drop_nulls()) <= {"good", "bad"}


def test_classify_asks_for_the_labels_in_the_request_schema(options):
    TEXTS.select(pl.col("text").llm.classify(["good", "bad"], **options))
    with open_cache(options["cache"]) as con:
        [(schema,)] = con.sql(
            "SELECT request->'$.response_format.json_schema.schema' FROM llm_cache LIMIT 1"
        ).fetchall()
    assert '"enum":["good","bad"]' in schema


def test_a_label_the_model_was_not_given_is_invalid(options):
    rows = pl.DataFrame({"text": ["fine", "[[sim:invalid=enum]]"]})
    out = struct_columns(
        rows.select(pl.col("text").llm.classify(["a", "b"], with_status=True, **options))
    )
    assert out["status"].to_list() == ["ok", "invalid"]
    assert out["answer"][1] is None and "none of these" in out["raw"][1]


def test_extract_gives_a_struct_of_the_schema(options):
    class Item(BaseModel):
        name: str
        quantity: int

    out = TEXTS.select(pl.col("text").llm.extract(Item, **options))
    assert out.schema["text"] == pl.Struct({"name": pl.String, "quantity": pl.Int64})


def test_filter_keeps_the_rows_answered_yes(options):
    verdicts = TEXTS.select(pl.col("text").llm.filter("Late? {}", **options))["text"]
    kept = TEXTS.filter(pl.col("text").llm.filter("Late? {}", **options))
    assert kept["id"].to_list() == TEXTS.filter(verdicts)["id"].to_list()


def test_in_group_by_agg_each_group_gets_its_rows_answers(options, endpoint):
    groups = TEXTS.group_by(pl.col("id") % 2, maintain_order=True).agg(
        pl.col("text").llm.complete("{}", **options)
    )
    assert groups["text"].to_list()[0] == [expected_reply("b", model="sim"), None, None]
    assert endpoint.stats()["requests"] == 3


def test_two_expressions_in_one_context_both_answer(options):
    out = TEXTS.select(
        pl.col("text").llm.complete("One: {}", **options).alias("one"),
        pl.col("text").llm.complete("Two: {}", **options).alias("two"),
    )
    assert out["two"][0] == expected_reply("Two: b", model="sim")


def test_any_string_expression_is_a_prompt(options):
    out = TEXTS.select(pl.format("#{}: {}", "id", "text").llm.complete(**options))
    assert out.item(0, 0) == expected_reply("#1: b", model="sim")


def test_a_struct_expressions_template_names_its_fields(options):
    asked = pl.struct("id", "text").llm.complete("{id} says {text}", with_status=True, **options)
    out = struct_columns(TEXTS.select(asked.alias("x")), "x")
    assert out["answer"][0] == expected_reply("1 says b", model="sim")
    assert out["error"][2] == "column 'text' is null; row not sent"


def test_embed_gives_llm_embeds_vectors_and_statuses(endpoint, cache):
    vectors = pl.col("text").llm.embed(
        model="sim-embed", dimensions=8, with_status=True, endpoint=endpoint.base_url, cache=cache
    )
    mine = struct_columns(TEXTS.select(vectors))
    theirs = TEXTS.pipe(
        llm_embed, column="text", model="sim-embed", dimensions=8, endpoint=endpoint.base_url
    )
    assert mine.rows() == theirs.select("embedding", "embedding_status", "embedding_error").rows()


def test_misuse_is_a_config_error_before_anything_is_sent(options, endpoint):
    with pytest.raises(ConfigError, match="unknown option"):
        pl.col("text").llm.complete("{}", colour="red", **options)
    with pytest.raises(ConfigError, match="its output is its name"):
        pl.col("text").llm.complete("{}", output="summary", **options)
    with pytest.raises(TemplateError, match="does not use the value"):
        TEXTS.select(pl.col("text").llm.complete("Summarize", **options))
    assert endpoint.stats()["requests"] == 0


def test_an_unknown_on_error_is_refused_as_llm_complete_refuses_it(options):
    with pytest.raises(ConfigError, match="on_error must be 'null' or 'raise'"):
        pl.col("text").llm.complete("{}", on_error="skip", **options)


def test_a_template_naming_a_column_on_a_single_value_says_what_to_write(options):
    with pytest.raises(TemplateError, match=r"write \{\} for it"):
        TEXTS.select(pl.col("text").llm.complete("Summarize: {text}", **options))


def test_expressions_with_the_same_options_share_one_client(options):
    from llm_ops._expr.runtime import client_for

    made = {"endpoint": options["endpoint"], "cache": options["cache"]}
    assert client_for(None, made) is client_for(None, dict(reversed(made.items())))


def test_a_client_of_your_own_is_used(endpoint, cache):
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        TEXTS.select(pl.col("text").llm.complete("{}", model="sim", client=client))
    assert len(keys(cache)) == 2


def test_an_expression_sends_on_its_clients_connection_pool(endpoint):
    """A frame job, then an expression on the same client: the expression's requests go out on
    the client's engine, so on the keep-alive connections the job opened, and no more open
    than the concurrency allows (an engine of its own would open as many again)."""
    # the job's requests overlap however busy the machine (answers wait until four are in
    # flight), so it opens several connections
    endpoint.configure(gather=4)
    first = pl.DataFrame({"text": [f"first {i}" for i in range(24)]})
    second = pl.DataFrame({"text": [f"second {i}" for i in range(24)]})
    with Client(endpoint=endpoint.base_url, cache=False, concurrency=4) as client:
        client.complete(first, prompt="{text}", model="sim")
        after_job = endpoint.stats()["connections"]
        second.select(pl.col("text").llm.complete("{}", model="sim", client=client))
        after_both = endpoint.stats()
    assert after_both["requests"] == 48
    assert 2 <= after_job <= 4
    assert after_both["connections"] == after_job


def test_the_typed_accessor_is_the_namespace(options):
    out = TEXTS.select(llm(pl.col("text")).complete("Summarize: {}", **options))
    assert out.equals(TEXTS.select(pl.col("text").llm.complete("Summarize: {}", **options)))


# -- llm_filter, llm_classify, llm_extract ----------------------------------------------------


def test_llm_filter_asks_only_about_rows_an_earlier_filter_kept(options, endpoint):
    kept = llm_filter(TEXTS.lazy().filter(pl.col("id") < 3), "Late? {text}", **options).collect()
    assert endpoint.stats()["requests"] == 2
    assert set(kept["id"]) <= {1, 2}


def test_llm_filter_is_the_expression_filter(options):
    frame = llm_filter(TEXTS, "Is this late? {text}", **options)
    assert frame.equals(
        TEXTS.filter(pl.struct("text").llm.filter("Is this late? {text}", **options))
    )


def test_llm_classify_adds_llm_completes_columns(options):
    out, report = llm_classify(TEXTS, "text", ["good", "bad"], return_report=True, **options)
    assert out.columns == [*TEXTS.columns, "label", "label_status", "label_error", "label_raw"]
    assert report.statuses["rejected"] == 1 and report.rows == 5


def test_llm_classify_cascades_like_llm_complete(endpoint, cache):
    rows = pl.DataFrame({"text": ["easy", "[[sim:fail_for=sim-small]] hard"]})
    out = llm_classify(
        rows,
        "text",
        ["a", "b"],
        model=["sim-small", "sim"],
        endpoint=endpoint.base_url,
        cache=cache,
    )
    assert out["label_model"].to_list() == ["sim-small", "sim"]
    assert out["label_status"].to_list() == ["ok", "ok"]


def test_llm_extract_keys_like_llm_complete_with_the_schema(options, endpoint):
    class Item(BaseModel):
        name: str

    llm_extract(TEXTS, "text", Item, prompt="Item in: {text}", **options)
    endpoint.reset()
    again = TEXTS.pipe(llm_complete, prompt="Item in: {text}", schema=Item, **options)
    assert endpoint.stats()["requests"] == 1  # the rejected row only
    assert again["completion_status"].to_list()[0] == "cached"


def test_llm_extract_uses_the_semantic_cache(options, endpoint):
    from llm_ops import SemanticCache

    class Item(BaseModel):
        name: str

    similar = SemanticCache("sim-embed", threshold=0.9)
    llm_extract(
        pl.DataFrame({"text": ["Love it, fits"]}), "text", Item, semantic_cache=similar, **options
    )
    again = llm_extract(
        pl.DataFrame({"text": ["love it -- fits!"]}),
        "text",
        Item,
        semantic_cache=similar,
        **options,
    )
    assert again["extracted_status"].to_list() == ["similar"]


def test_a_lazy_frame_stays_lazy_and_sends_nothing_until_collected(options, endpoint):
    lazy = llm_classify(TEXTS.lazy(), "text", ["good", "bad"], **options)
    assert isinstance(lazy, pl.LazyFrame) and endpoint.stats()["requests"] == 0
    assert lazy.collect()["label_status"].to_list()[2] == "skipped"


class Mood(BaseModel):
    mood: str


SEMANTIC_OPERATORS = {
    "llm_filter": lambda frame, **options: llm_filter(frame, "Late? {text}", **options),
    "llm_classify": lambda frame, **options: llm_classify(frame, "text", ["a", "b"], **options),
    "llm_extract": lambda frame, **options: llm_extract(frame, "text", Mood, **options),
}


@pytest.mark.parametrize("operator", SEMANTIC_OPERATORS.values(), ids=SEMANTIC_OPERATORS)
def test_each_operator_sends_nothing_for_a_lazyframe_until_it_is_collected(
    operator, options, endpoint
):
    lazy = operator(TEXTS.lazy(), **options)
    assert isinstance(lazy, pl.LazyFrame) and endpoint.stats()["requests"] == 0


@pytest.mark.parametrize("operator", SEMANTIC_OPERATORS.values(), ids=SEMANTIC_OPERATORS)
def test_each_operators_collected_lazyframe_equals_its_eager_result(operator, options):
    # without a cache: with one, a value repeated in a later streaming batch is "cached"
    lazy = operator(TEXTS.lazy(), **{**options, "cache": False})
    assert lazy.collect().equals(operator(TEXTS, **{**options, "cache": False}))


@pytest.mark.parametrize("operator", SEMANTIC_OPERATORS.values(), ids=SEMANTIC_OPERATORS)
def test_each_operator_refuses_a_bad_option_for_a_lazyframe_before_collect(
    operator, options, endpoint
):
    with pytest.raises(ConfigError, match="on_error must be 'null' or 'raise'"):
        operator(TEXTS.lazy(), on_error="skip", **options)
    assert endpoint.stats()["requests"] == 0
