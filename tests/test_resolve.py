"""llm_resolve: an entity id per row, on the simulator's world of latent entities."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from llm_ops import Budget, ConfigError, RowsFailedWarning, estimate_set, llm_resolve
from llm_ops._sets import Waves
from llm_ops._sets.resolve import (
    VERDICT,
    Clusters,
    pair_prompt,
    recall_threshold,
    stratified_sample,
)

NAMES = [
    "Acme Inc. [entity=1]",
    "ACME Incorporated [entity=1]",
    "acme inc [entity=1]",
    "Globex [entity=2]",
    "Globex Corp [entity=2]",
    "GLOBEX Corporation [entity=2]",
    "Initech [entity=3]",
    "Initech LLC [entity=3]",
    "Umbrella [entity=4]",
    "Hooli [entity=5]",
    "Hooli Inc [entity=5]",
    "Hooli Group [entity=5]",
]
TRUTH = [1, 1, 1, 2, 2, 2, 3, 3, 4, 5, 5, 5]


def resolve(endpoint, frame, **options):
    options.setdefault("cache", False)
    return llm_resolve(
        frame,
        "name",
        model="sim",
        embedding_model="sim-embed",
        endpoint=endpoint.base_url,
        **options,
    )


def same_partition(entities, truth):
    """Whether two lists put the same rows together."""
    return len(set(zip(entities, truth, strict=True))) == len(set(truth)) == len(set(entities))


@pytest.fixture
def names():
    return pl.DataFrame({"name": NAMES})


# -- the clustering, on given verdicts ------------------------------------------------------


def settled(size, verdicts, answers=None):
    asked = []

    def check(pairs):
        asked.extend(pairs)
        return [(answers or {}).get((min(p), max(p))) for p in pairs]

    clusters = Clusters(size, dict(verdicts))
    clusters.settle(check)
    return clusters.labels(), asked


def test_a_triangle_of_matches_is_one_cluster():
    labels, _ = settled(3, {(0, 1): True, (1, 2): True, (0, 2): True})
    assert labels == [0, 0, 0]


def test_one_wrong_match_does_not_join_two_entities_of_two_rows():
    # X = {0, 1}, Y = {2, 3}; 1-2 wrongly says they match
    labels, _ = settled(4, {(0, 1): True, (2, 3): True, (1, 2): True})
    assert len({labels[0], labels[1]} & {labels[2], labels[3]}) == 0


def test_one_wrong_match_does_not_join_two_entities_of_three_rows():
    # X = {0, 1, 2}, Y = {3, 4, 5}, all pairs inside each checked; 2-3 wrongly matches
    inside = {(i, j): True for i in range(3) for j in range(i + 1, 3)}
    inside |= {(i, j): True for i in range(3, 6) for j in range(i + 1, 6)}
    labels, _ = settled(6, inside | {(2, 3): True}, answers={(0, 3): False, (2, 4): False})
    assert labels == [0, 0, 0, 3, 3, 3]


def test_with_every_pair_checked_one_wrong_match_still_finds_both_entities():
    verdicts = {(0, 1): True, (2, 3): True, (1, 2): True, (0, 2): False}
    verdicts |= {(0, 3): False, (1, 3): False}
    labels, _ = settled(4, verdicts, answers={(0, 2): False, (1, 3): False})
    assert labels == [0, 0, 2, 2]


def test_one_match_to_a_cluster_is_confirmed_by_one_more_check():
    # {0, 1, 2} a triangle; 3 matched to 0 only: one check of 3 against another row
    verdicts = {(0, 1): True, (1, 2): True, (0, 2): True, (0, 3): True}
    labels, asked = settled(4, verdicts, answers={(1, 3): True})
    assert asked == [(1, 3)] and labels == [0, 0, 0, 0]


def test_a_refuted_confirmation_leaves_the_row_alone():
    verdicts = {(0, 1): True, (1, 2): True, (0, 2): True, (0, 3): True}
    labels, _ = settled(4, verdicts, answers={(1, 3): False})
    assert labels == [0, 0, 0, 3]


def test_a_lone_pair_is_joined_by_its_one_match():
    labels, asked = settled(2, {(0, 1): True})
    assert labels == [0, 0] and asked == []


def test_a_broken_triangle_is_asked_again_the_other_way_round():
    labels, asked = settled(3, {(0, 1): True, (1, 2): True, (0, 2): False}, {(0, 2): True})
    assert asked == [(2, 0)] and labels == [0, 0, 0]


def test_the_threshold_keeps_every_sampled_match_when_they_are_few():
    pool = {(0, i): i / 10 for i in range(1, 10)}
    assert recall_threshold(pool, [(0, 3), (0, 7), (0, 9)], 0.95) == 0.3


def test_the_sample_is_spread_over_the_similarities_and_seeded():
    pool = {(0, i): i / 100 for i in range(1, 100)}
    sample = stratified_sample(pool, 10, seed=1)
    assert sample == stratified_sample(pool, 10, seed=1)
    assert sorted(pool[p] // 0.1 for p in sample) == sorted({pool[p] // 0.1 for p in sample})


# -- the operator on the simulator ----------------------------------------------------------


def test_rows_of_one_entity_share_an_id(endpoint, names):
    resolved = resolve(endpoint, names)
    assert same_partition(resolved["entity"].to_list(), TRUTH)


def test_the_id_is_the_smallest_row_index_of_the_entity(endpoint, names):
    resolved = resolve(endpoint, names)
    assert resolved["entity"].to_list() == [0, 0, 0, 3, 3, 3, 6, 6, 8, 9, 9, 9]


def test_the_blocked_plan_finds_the_same_entities(endpoint, names):
    resolved = resolve(endpoint, names, plan="blocking", sample=8, neighbours=4)
    assert same_partition(resolved["entity"].to_list(), TRUTH)


def test_the_blocked_plan_asks_fewer_checks_than_every_pair(endpoint, names):
    _, report = resolve(
        endpoint, names, plan="blocking", sample=8, neighbours=4, return_report=True
    )
    assert report.plan == "blocking" and report.requests_sent < 12 * 11 // 2


def test_auto_judges_every_pair_of_a_small_input_and_says_why(endpoint, names):
    _, report = resolve(endpoint, names, return_report=True)
    assert report.plan == "all_pairs" and "pairs" in report.plan_why
    assert report.requests_sent == 12 * 11 // 2 and report.waves == 1


def test_equal_values_are_one_entity_without_a_call(endpoint):
    frame = pl.DataFrame({"name": ["Acme [entity=1]"] * 3})
    resolved = resolve(endpoint, frame)
    assert resolved["entity"].to_list() == [0, 0, 0] and endpoint.stats()["requests"] == 0


def test_a_rerun_is_answered_by_the_cache(endpoint, names, cache):
    resolve(endpoint, names, plan="blocking", sample=8, neighbours=4, cache=cache)
    endpoint.reset()
    resolve(endpoint, names, plan="blocking", sample=8, neighbours=4, cache=cache)
    assert endpoint.stats()["requests"] == 0


def test_a_row_whose_every_check_failed_stays_its_own_entity(endpoint):
    frame = pl.DataFrame({"name": ["Acme [entity=1]", "ACME Inc [entity=1] [[sim:status=400]]"]})
    with pytest.warns(RowsFailedWarning):
        resolved = resolve(endpoint, frame)
    assert resolved["entity"].to_list() == [0, 1]
    assert resolved["entity_status"].cast(pl.String).to_list()[1] == "rejected"
    assert resolved["entity_error"][1] is not None


def test_a_null_value_is_skipped(endpoint):
    resolved = resolve(endpoint, pl.DataFrame({"name": ["Acme [entity=1]", None]}))
    assert resolved["entity"].to_list() == [0, None]
    assert resolved["entity_status"].cast(pl.String).to_list() == ["ok", "skipped"]


def test_an_arrow_table_gives_an_arrow_table(endpoint, names):
    assert isinstance(resolve(endpoint, names.to_arrow()), pa.Table)


def test_a_lazy_frame_gives_a_lazy_frame(endpoint, names):
    assert isinstance(resolve(endpoint, names.lazy()), pl.LazyFrame)


def test_a_missing_column_is_refused_before_any_request(endpoint, names):
    with pytest.raises(ConfigError, match="column"):
        llm_resolve(names, "title", model="sim", embedding_model="sim-embed")
    assert endpoint.stats()["requests"] == 0


def test_an_unknown_plan_is_refused(names):
    with pytest.raises(ConfigError, match="plan"):
        llm_resolve(names, "name", model="sim", embedding_model="sim-embed", plan="greedy")


def test_the_estimate_is_within_a_quarter_of_the_run(endpoint, names, cache):
    arguments = dict(
        model="sim",
        embedding_model="sim-embed",
        plan="blocking",
        sample=8,
        neighbours=4,
        endpoint=endpoint.base_url,
        cache=cache,
    )
    estimate = estimate_set(llm_resolve, names, column="name", **arguments)
    _, report = llm_resolve(names, "name", return_report=True, **arguments)
    assert abs(estimate.calls - report.requests_sent) <= 0.25 * report.requests_sent
    assert abs(estimate.waves - report.waves) <= 0.25 * report.waves


WRONG_ONCE = ["Acme [entity=1]", "Acme Inc [entity=1]", "Globex [entity=2]", "Globex Co [entity=2]"]


def wrong_checks(endpoint, values, truth):
    """The pairs whose check errs on the simulator as configured (asked as resolve asks,
    either way round)."""
    pairs = [(i, j) for i in range(len(values)) for j in range(len(values)) if i != j]
    options = {"endpoint": endpoint.base_url, "cache": False}
    with Waves("test", model="sim", client=None, options=options) as waves:
        prompts = [pair_prompt(values[i], values[j]) for i, j in pairs]
        answers = waves.ask(prompts, schema=VERDICT, max_tokens=16)
    said = [answer["answer"] for answer in answers.values]
    return [p for p, s in zip(pairs, said, strict=True) if s != (truth[p[0]] == truth[p[1]])]


def test_one_wrong_match_merges_no_two_entities_end_to_end(endpoint):
    endpoint.configure(judge_error=0.1, seed=76)  # exactly one check errs: 1 and 2 match
    assert wrong_checks(endpoint, WRONG_ONCE, [1, 1, 2, 2]) == [(1, 2)]
    resolved = resolve(endpoint, pl.DataFrame({"name": WRONG_ONCE}), plan="all_pairs")
    assert resolved["entity"].to_list() == [0, 0, 2, 2]


def test_a_spent_budget_stops_the_checks_and_leaves_unchecked_rows_skipped(endpoint, names):
    budget = Budget(max_requests=3)
    resolved = resolve(endpoint, names, plan="all_pairs", budget=budget)
    assert endpoint.stats()["requests"] <= 3
    assert "skipped" in set(resolved["entity_status"].cast(pl.String))


# -- the expression -------------------------------------------------------------------------


def resolve_expression(endpoint, **options):
    options.setdefault("cache", False)
    return pl.col("name").llm.resolve(
        model="sim", embedding_model="sim-embed", endpoint=endpoint.base_url, **options
    )


def test_the_expression_gives_each_value_its_entity(endpoint, names):
    resolved = names.select(resolve_expression(endpoint).alias("entity"))
    assert resolved["entity"].to_list() == [0, 0, 0, 3, 3, 3, 6, 6, 8, 9, 9, 9]


def test_the_expression_resolves_each_group_on_its_own_under_over(endpoint):
    frame = pl.DataFrame(
        {
            "group": ["a", "a", "b", "b", "b"],
            "name": [
                "A [entity=1]",
                "A Inc [entity=1]",
                "A [entity=1]",
                "B [entity=2]",
                "C [entity=3]",
            ],
        }
    )
    resolved = frame.select(resolve_expression(endpoint).over("group").alias("entity"))
    assert resolved["entity"].to_list() == [0, 0, 0, 1, 2]


def test_the_expression_is_answered_by_the_cache_on_a_rerun(endpoint, names, cache):
    names.select(resolve_expression(endpoint, cache=cache, plan="blocking", sample=8))
    endpoint.reset()
    names.select(resolve_expression(endpoint, cache=cache, plan="blocking", sample=8))
    assert endpoint.stats()["requests"] == 0
