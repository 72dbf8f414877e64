"""llm_join: two frames joined under a predicate, by the nested loop, classification or the
embedding cascade, against the simulator's latent truth ([entity=k] facts)."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from llm_ops import (
    Budget,
    ConfigError,
    LlmOpsWarning,
    RowsFailedWarning,
    TemplateError,
    estimate_set,
    llm_join,
)

PREDICATE = "Is the review {review} about the product {product}?"


def _reviews(entities: list[int]) -> pl.DataFrame:
    return pl.DataFrame(
        {"review": [f"review {n} of it [entity={e}]" for n, e in enumerate(entities)]}
    )


def _products(entities: list[int]) -> pl.DataFrame:
    return pl.DataFrame({"product": [f"product {e} [entity={e}]" for e in entities]})


def _pairs(frame: pl.DataFrame) -> set[tuple[str, str]]:
    return set(zip(frame["review"].to_list(), frame["product"].to_list(), strict=True))


def _join(endpoint, cache, left, right, predicate=PREDICATE, **options):
    options.setdefault("model", "sim")
    return llm_join(left, right, predicate, endpoint=endpoint.base_url, cache=cache, **options)


def test_the_nested_loop_joins_the_pairs_the_predicate_holds_for(endpoint, cache):
    joined = _join(endpoint, cache, _reviews([1, 2, 3]), _products([3, 1]))
    assert _pairs(joined) == {
        ("review 0 of it [entity=1]", "product 1 [entity=1]"),
        ("review 2 of it [entity=3]", "product 3 [entity=3]"),
    }


def test_the_nested_loop_asks_every_distinct_pair_once(endpoint, cache):
    _join(endpoint, cache, _reviews([1, 1, 2]).vstack(_reviews([1])), _products([1, 2, 3]))
    assert endpoint.stats()["requests"] == 3 * 3


def test_each_judgment_reads_the_left_item_first(endpoint, cache):
    _, report = _join(
        endpoint, cache, _reviews([1]), _products([1]), return_report=True, plan="nested"
    )
    assert endpoint.stats()["judged"]["verdict"] == 1 and report.plan == "nested"


def test_a_left_join_keeps_the_rows_without_a_match(endpoint, cache):
    joined = _join(endpoint, cache, _reviews([1, 5]), _products([1, 2]), how="left")
    unmatched = joined.filter(pl.col("review").str.contains("entity=5"))
    assert unmatched["product"].to_list() == [None] and unmatched["match"].to_list() == [False]


def test_a_semi_join_keeps_the_left_rows_with_a_match(endpoint, cache):
    joined = _join(endpoint, cache, _reviews([1, 5, 2]), _products([1, 2]), how="semi")
    assert joined.columns == ["review", "match", "match_status", "match_error"]
    assert joined["review"].str.contains("entity=5").to_list() == [False, False]


def test_an_anti_join_keeps_the_left_rows_without_one(endpoint, cache):
    joined = _join(endpoint, cache, _reviews([1, 5, 2]), _products([1, 2]), how="anti")
    assert joined["review"].to_list() == ["review 1 of it [entity=5]"]


def test_a_column_both_sides_have_is_written_with_the_suffix_for_the_right(endpoint, cache):
    left = pl.DataFrame({"name": ["Acme [entity=1]", "Bolt [entity=2]"]})
    right = pl.DataFrame({"name": ["ACME Inc [entity=1]"]})
    joined = _join(endpoint, cache, left, right, "Is {name} the same firm as {name_right}?")
    assert joined.select("name", "name_right").rows() == [
        ("Acme [entity=1]", "ACME Inc [entity=1]")
    ]


def test_a_shared_column_written_plainly_alone_is_ambiguous(endpoint, cache):
    left, right = pl.DataFrame({"name": ["a"]}), pl.DataFrame({"name": ["b"], "kind": ["x"]})
    with pytest.raises(TemplateError, match="name_right"):
        _join(endpoint, cache, left, right, "Is {name} a {kind}?")
    assert endpoint.stats()["requests"] == 0


def test_a_predicate_must_name_a_column_of_each_side(endpoint, cache):
    with pytest.raises(TemplateError, match="each side"):
        _join(endpoint, cache, _reviews([1]), _products([1]), "Is {review} kind?")


@pytest.mark.parametrize(("argument", "value"), [("how", "outer"), ("plan", "fast")])
def test_an_unknown_how_or_plan_is_a_config_error(endpoint, cache, argument, value):
    with pytest.raises(ConfigError, match=argument):
        _join(endpoint, cache, _reviews([1]), _products([1]), **{argument: value})


def test_auto_classifies_into_few_right_rows_with_one_call_per_left_row(endpoint, cache):
    reviews = _reviews(list(range(1, 31)))
    left, right = reviews.vstack(reviews), _products(list(range(1, 21)))
    joined, report = _join(endpoint, cache, left, right, nested_max=100, return_report=True)
    assert report.plan == "classify" and "classify_max" in (report.plan_why or "")
    assert endpoint.stats()["requests"] == 30  # distinct left rows, not 60 x 20 pairs
    assert len(joined) == 40  # entities 1..20, each reviewed twice


def test_classify_splits_the_options_to_fit_the_context(endpoint, cache):
    endpoint.configure(context_tokens=256)
    left, right = _reviews([1, 2, 3]), _products(list(range(1, 41)))
    joined, report = _join(
        endpoint, cache, left, right, plan="classify", context_tokens=256, return_report=True
    )
    assert report.requests_sent > 3 and "split" in (report.plan_why or "")
    assert len(joined) == 3 and joined["match_status"].cast(pl.String).to_list() == ["ok"] * 3


def test_auto_without_an_embedding_model_refuses_a_large_join(endpoint, cache):
    with pytest.raises(ConfigError, match="embedding_model"):
        _join(endpoint, cache, _reviews(list(range(200))), _products(list(range(200))))
    assert endpoint.stats()["requests"] == 0


def _world(n: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    return _reviews(list(range(n))), _products(list(reversed(range(n))))


def test_the_cascade_finds_the_matches_with_fewer_calls_than_pairs(endpoint, cache):
    endpoint.configure(judge_error=0.05)
    left, right = _world(150)
    joined, report = _join(
        endpoint, cache, left, right, embedding_model="sim-embed", return_report=True
    )
    true = sum(r.split("=")[1] == p.split("=")[1] for r, p in _pairs(joined))
    assert report.plan == "cascade" and report.requests_sent < 150 * 150 / 20
    assert true >= 0.9 * 150 and true >= 0.9 * len(joined)


def test_a_pair_the_cascade_accepts_by_similarity_says_so(endpoint, cache):
    left, right = _world(150)
    joined = _join(endpoint, cache, left, right, embedding_model="sim-embed")
    assert "similar" in joined["match_status"].cast(pl.String).to_list()


def test_a_rerun_of_the_cascade_sends_nothing(endpoint, cache):
    left, right = _world(120)
    _join(endpoint, cache, left, right, embedding_model="sim-embed", seed=3)
    endpoint.reset()
    _join(endpoint, cache, left, right, embedding_model="sim-embed", seed=3)
    assert endpoint.stats()["requests"] == 0


def test_the_cascade_needs_an_embedding_model(endpoint, cache):
    with pytest.raises(ConfigError, match="embedding_model"):
        _join(endpoint, cache, _reviews([1]), _products([1]), plan="cascade")


def test_a_failed_judgment_is_a_status_not_an_answer(endpoint, cache):
    left = pl.DataFrame({"review": ["[[sim:status=400]] [entity=1]"]})
    with pytest.warns(RowsFailedWarning):
        joined = _join(endpoint, cache, left, _products([1]))
    assert joined.select("match", "match_status").rows() == [(None, "rejected")]
    assert joined["match_error"][0]


def test_a_null_left_value_is_not_asked(endpoint, cache):
    left = pl.DataFrame({"review": [None, "r [entity=1]"]}, schema={"review": pl.String})
    joined = _join(endpoint, cache, left, _products([1]), how="left")
    assert joined["match_status"].cast(pl.String).to_list() == ["skipped", "ok"]
    assert endpoint.stats()["requests"] == 1


def test_an_arrow_table_in_is_an_arrow_table_out(endpoint, cache):
    joined = _join(endpoint, cache, _reviews([1]).to_arrow(), _products([1]))
    assert isinstance(joined, pa.Table) and joined.num_rows == 1


def test_a_lazy_frame_in_is_a_lazy_frame_out(endpoint, cache):
    joined = _join(endpoint, cache, _reviews([1]).lazy(), _products([1]).lazy())
    assert isinstance(joined, pl.LazyFrame) and joined.collect().height == 1


@pytest.mark.parametrize(
    ("left", "right", "arguments"),
    [
        (_reviews([1, 2, 3]), _products([1, 2, 4]), {"plan": "nested"}),
        (_reviews(list(range(40))), _products(list(range(12))), {"plan": "classify"}),
        (*_world(100), {"embedding_model": "sim-embed"}),
    ],
    ids=["nested", "classify", "cascade"],
)
def test_the_estimate_is_within_a_quarter_of_the_run(endpoint, cache, left, right, arguments):
    options = {"model": "sim", "endpoint": endpoint.base_url, "cache": cache, **arguments}
    planned = estimate_set(llm_join, left, right=right, predicate=PREDICATE, **options)
    endpoint.reset()
    _, report = llm_join(left, right, PREDICATE, return_report=True, **options)
    assert planned.plan == report.plan
    assert abs(planned.calls - report.requests_sent) <= 0.25 * report.requests_sent
    assert abs(planned.waves - report.waves) <= 1  # the cascade: a band, or none


def test_a_pair_whose_embedding_failed_is_asked_not_dropped(endpoint, cache):
    endpoint.configure(max_embedding_chars=80)  # a longer text fails its embedding request
    left, right = _world(30)
    left = left.vstack(pl.DataFrame({"review": ["a long review " * 6 + "[entity=3]"]}))
    with pytest.warns(RowsFailedWarning, match="vector_error"):
        joined = _join(endpoint, cache, left, right, plan="cascade", embedding_model="sim-embed")
    found = joined.filter(pl.col("review").str.starts_with("a long review"))
    assert found["product"].to_list() == ["product 3 [entity=3]"]


def test_an_empty_side_joins_nothing_and_sends_nothing(endpoint, cache):
    empty = _products([]).cast({"product": pl.String})
    joined = _join(
        endpoint, cache, _reviews([1, 2]), empty, plan="cascade", embedding_model="sim-embed"
    )
    assert joined.height == 0 and endpoint.stats()["requests"] == 0


def test_a_spent_budget_leaves_the_pairs_not_asked_skipped(endpoint, cache):
    budget = Budget(max_requests=4)
    joined = _join(endpoint, cache, _reviews([1, 2, 3]), _products([1, 2, 3]), budget=budget)
    statuses = joined["match_status"].cast(pl.String).to_list()
    assert endpoint.stats()["requests"] <= 4 and "skipped" in statuses


def test_a_cascade_that_finds_no_match_above_the_noise_floor_says_so(endpoint, cache):
    left, right = _world(60)
    right = right.with_columns(pl.col("product").str.replace(r"entity=", "entity=10"))
    with pytest.warns(LlmOpsWarning, match="noise floor"):
        joined = _join(endpoint, cache, left, right, plan="cascade", embedding_model="sim-embed")
    assert joined.height == 0


def test_an_output_name_the_rows_already_have_is_a_config_error(endpoint, cache):
    right = _products([1]).with_columns(match=pl.lit("yes"))
    with pytest.raises(ConfigError, match="output="):
        _join(endpoint, cache, _reviews([1]), right)
