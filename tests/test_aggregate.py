"""llm_aggregate: a tree fold per group, each level one wave for all groups, in the context."""

from __future__ import annotations

import math

import polars as pl
import pyarrow as pa
import pytest

from llm_ops import Budget, ConfigError, RowsFailedWarning, estimate_set, llm_aggregate
from llm_ops._sets.aggregate import DEFAULT_CONTEXT_TOKENS, _pack
from llm_ops.testing import distinct_facts


def reviews(groups: int, size: int) -> pl.DataFrame:
    """``groups`` groups of ``size`` reviews, review i of a group about entity i mod 5."""
    return pl.DataFrame(
        {
            "shop": [f"s{g}" for g in range(groups) for _ in range(size)],
            "text": [
                f"review {i} of {g} [entity={i % 5}]" for g in range(groups) for i in range(size)
            ],
        }
    )


@pytest.fixture
def aggregate(endpoint, cache):
    """llm_aggregate on the simulator (slots of 300 tokens, as /props says) and a cache."""
    endpoint.configure(context_tokens=300)

    def run(df, **arguments):
        arguments.setdefault("return_report", True)
        return llm_aggregate(
            df,
            "text",
            "Summarize the reviews",
            model="sim",
            endpoint=endpoint.base_url,
            cache=cache,
            **arguments,
        )

    return run


def test_values_are_packed_in_order_as_many_as_fit():
    assert [list(c) for c in _pack([3, 3, 3, 5, 1], 6)] == [[0, 1], [2], [3, 4]]


def test_one_row_per_group_with_its_keys_in_order_of_first_appearance(aggregate):
    df = pl.DataFrame({"shop": ["b", "a", "b"], "text": ["x [entity=1]", "y [entity=2]", "z"]})
    out, _ = aggregate(df, by="shop")
    assert out["shop"].to_list() == ["b", "a"]
    assert out.columns == ["shop", "aggregate", "aggregate_status", "aggregate_error"]


def test_the_answer_names_every_fact_of_its_group(aggregate):
    out, _ = aggregate(reviews(3, 40), by="shop")
    facts = {f"[entity={k}]" for k in range(5)}
    assert all(set(distinct_facts(answer)) == facts for answer in out["aggregate"])


def test_each_level_is_one_wave_for_all_groups(aggregate):
    _, one = aggregate(reviews(1, 40), by="shop")
    _, six = aggregate(reviews(6, 40), by="shop")
    assert six.waves == one.waves == 2 and six.requests_sent > one.requests_sent


def test_calls_stay_within_the_tree_bound(aggregate, endpoint):
    _, report = aggregate(reviews(1, 60), by="shop")
    per_request = 10  # reviews of 21-22 characters in 300-token requests (tokens of values: 136)
    assert report.requests_sent <= math.ceil(60 / (per_request - 1)) + report.waves


def test_a_group_that_fits_one_request_costs_one_call(aggregate, endpoint):
    aggregate(reviews(1, 5))
    assert endpoint.stats()["requests"] == 1


def test_no_request_overflows_the_context(aggregate, endpoint):
    long = pl.DataFrame({"text": ["word " * 400 + "[entity=1]", "short [entity=2]"]})
    out, report = aggregate(long)
    assert report.requests_sent >= 1 and endpoint.stats()["requests"] == report.requests_sent
    assert out["aggregate_status"].to_list() == ["truncated"]
    assert "cut to fit" in out["aggregate_error"][0]


def test_a_failed_part_fails_its_group_only(aggregate):
    df = pl.DataFrame(
        {"shop": ["a", "a", "b"], "text": ["x [[sim:status=400]]", "y [entity=1]", "z [entity=2]"]}
    )
    with pytest.warns(RowsFailedWarning, match="1 of 2"):
        out, _ = aggregate(df, by="shop")
    assert out["aggregate_status"].to_list() == ["rejected", "ok"]
    assert out["aggregate"][0] is None and out["aggregate_error"][0]


def test_a_rerun_sends_nothing(aggregate, endpoint):
    aggregate(reviews(3, 40), by="shop")
    endpoint.reset()
    out, _ = aggregate(reviews(3, 40), by="shop")
    assert endpoint.stats()["requests"] == 0 and set(out["aggregate_status"]) == {"cached"}


def test_order_by_sets_the_order_values_are_folded_in(aggregate):
    df = pl.DataFrame({"rank": [2, 1], "text": ["b [entity=2]", "a [entity=1]"]})
    out, _ = aggregate(df, order_by="rank")
    assert distinct_facts(out["aggregate"][0]) == ["[entity=1]", "[entity=2]"]


def test_a_group_without_values_is_skipped_unasked(aggregate, endpoint):
    df = pl.DataFrame(
        {"shop": ["a"], "text": [None]}, schema={"shop": pl.String, "text": pl.String}
    )
    out, _ = aggregate(df, by="shop")
    assert out["aggregate_status"].to_list() == ["skipped"]
    assert endpoint.stats()["requests"] == 0


def test_the_schema_is_asked_of_the_root_only(aggregate):
    schema = {
        "type": "object",
        "properties": {"summary": {"type": "string"}},
        "required": ["summary"],
    }
    out, _ = aggregate(reviews(1, 40), schema=schema)
    assert set(distinct_facts(out["aggregate"][0]["summary"])) == {
        f"[entity={k}]" for k in range(5)
    }


def test_the_context_is_read_from_the_endpoints_props(aggregate):
    _, report = aggregate(reviews(1, 5), context_tokens=9999)
    assert "300-token requests (the endpoint's /props)" in (report.plan_why or "")


def test_the_context_falls_back_to_context_tokens_without_props(endpoint, cache):
    _, report = llm_aggregate(
        reviews(1, 5),
        "text",
        "Summarize",
        model="sim",
        endpoint=endpoint.base_url,
        cache=cache,
        context_tokens=1000,
        return_report=True,
    )
    assert "1,000-token requests (context_tokens=)" in (report.plan_why or "")


def test_the_default_context_when_nothing_says(endpoint, cache):
    _, report = llm_aggregate(
        reviews(1, 5),
        "text",
        "Summarize",
        model="sim",
        endpoint=endpoint.base_url,
        cache=cache,
        return_report=True,
    )
    assert f"{DEFAULT_CONTEXT_TOKENS:,}-token requests" in (report.plan_why or "")


def test_a_spent_budget_skips_the_groups_it_could_not_finish(aggregate):
    out, _ = aggregate(reviews(2, 40), by="shop", budget=Budget(max_requests=3))
    assert set(out["aggregate_status"]) == {"skipped"}
    assert "budget" in out["aggregate_error"][0]


def test_in_batch_mode_each_level_is_one_provider_batch(endpoint, cache):
    from llm_ops import BatchMode

    endpoint.configure(context_tokens=300, batch_seconds=0.1, batch_validation_seconds=0.05)
    out, report = llm_aggregate(
        reviews(3, 40), "text", "Summarize the reviews", by="shop", model="sim",
        endpoint=endpoint.base_url, cache=cache, batch=BatchMode(poll_seconds=0.05),
        return_report=True,
    )  # fmt: skip
    assert endpoint.stats()["batches"] == report.waves == 2
    assert set(out["aggregate_status"]) == {"ok"}


def test_a_missing_column_is_refused_before_any_request(aggregate, endpoint):
    with pytest.raises(ConfigError, match="no column 'shop'"):
        aggregate(pl.DataFrame({"text": ["a"]}), by="shop")
    assert endpoint.stats()["requests"] == 0


def test_a_context_too_small_for_the_answer_is_refused(aggregate):
    with pytest.raises(ConfigError, match="lower max_tokens"):
        aggregate(reviews(1, 5), max_tokens=250)


def test_an_arrow_table_gives_an_arrow_table(aggregate):
    out = aggregate(reviews(1, 5).to_arrow(), return_report=False)
    assert isinstance(out, pa.Table) and out.num_rows == 1


def test_a_lazy_frame_gives_a_lazy_frame(aggregate):
    out = aggregate(reviews(1, 5).lazy(), return_report=False)
    assert isinstance(out, pl.LazyFrame) and out.collect().height == 1


def test_the_estimate_is_within_a_quarter_of_the_run(aggregate, endpoint):
    df = reviews(4, 60)
    estimate = estimate_set(
        llm_aggregate,
        df,
        column="text",
        instruction="Summarize the reviews",
        by="shop",
        model="sim",
        endpoint=endpoint.base_url,
        cache=False,
    )
    _, report = aggregate(df, by="shop")
    assert abs(estimate.calls - report.requests_sent) <= 0.25 * report.requests_sent
    assert abs(estimate.waves - report.waves) <= 0.25 * report.waves
    assert abs(estimate.input_tokens - report.prompt_tokens) <= 0.25 * report.prompt_tokens


def test_the_expression_answers_once_per_group_in_agg(endpoint, cache):
    folded = (
        reviews(2, 10)
        .group_by("shop", maintain_order=True)
        .agg(
            pl.col("text").llm.aggregate(
                "Summarize the reviews", model="sim", endpoint=endpoint.base_url, cache=cache
            )
        )
    )
    facts = {f"[entity={k}]" for k in range(5)}
    assert folded.height == 2 and all(set(distinct_facts(a)) == facts for a in folded["text"])


def test_the_expression_with_status_says_why_a_group_failed(endpoint, cache):
    df = pl.DataFrame({"text": ["x [[sim:status=400]]"]})
    with pytest.warns(RowsFailedWarning):
        out = df.select(
            pl.col("text").llm.aggregate(
                "Summarize", model="sim", with_status=True, endpoint=endpoint.base_url, cache=cache
            )
        ).unnest("text")
    assert out["status"].to_list() == ["rejected"] and out["answer"][0] is None


@pytest.fixture
def con(endpoint, cache):
    import duckdb

    from llm_ops.sql import register

    connection = duckdb.connect()
    register(connection, endpoint=endpoint.base_url, cache=cache, model="sim")
    frame = reviews(3, 12)  # noqa: F841 (DuckDB reads the frame by its name)
    connection.execute("CREATE TABLE reviews AS SELECT * FROM frame")
    return connection


def test_llm_agg_is_a_sql_aggregate_one_answer_per_group(con):
    rows = con.sql(
        "SELECT shop, llm_agg('Summarize the reviews', text) FROM reviews "
        "GROUP BY shop ORDER BY shop"
    ).fetchall()
    facts = {f"[entity={k}]" for k in range(5)}
    assert [shop for shop, _ in rows] == ["s0", "s1", "s2"]
    assert all(set(distinct_facts(answer)) == facts for _, answer in rows)


def test_llm_agg_sends_a_rerun_nothing(con, endpoint):
    query = "SELECT shop, llm_agg('Summarize', text) FROM reviews GROUP BY shop"
    con.sql(query).fetchall()
    endpoint.reset()
    con.sql(query).fetchall()
    assert endpoint.stats()["requests"] == 0


def test_llm_agg_result_says_why_a_group_has_no_answer(con):
    ((result,),) = con.sql("SELECT llm_agg_result('Summarize', NULL::VARCHAR)").fetchall()
    assert (result["answer"], result["status"]) == (None, "skipped")
