"""Top-k and rank: the plans on a judge of known truth, and llm_top_k and the .llm expressions
on the simulator's world, whose judge answers comparisons and rankings from ``[score=]``."""

from __future__ import annotations

import random

import polars as pl
import pytest

from llm_ops import Budget, ConfigError, estimate_set, last_report, llm_top_k
from llm_ops._sets._ranking import (
    SAMPLE,
    all_pairs,
    listwise,
    listwise_calls,
    max_waves,
    quickselect,
    seeded_coin,
)

SCORES = [0.31, 0.92, 0.05, 0.77, 0.58, 0.12, 0.85, 0.44, 0.66, 0.23, 0.97, 0.39]


class Truth:
    """A judge of known truth: the item with the higher score wins; ``fails`` answers nothing."""

    def __init__(self, scores, *, fails=False):
        self.scores, self.fails, self.waves, self.asked = scores, fails, 0, 0

    def compare(self, pairs):
        self.waves, self.asked = self.waves + 1, self.asked + len(pairs)
        if self.fails:
            return [None] * len(pairs)
        return [a if self.scores[a] >= self.scores[b] else b for a, b in pairs]

    def rank(self, windows):
        self.waves, self.asked = self.waves + 1, self.asked + len(windows)
        if self.fails:
            return [None] * len(windows)
        return [sorted(w, key=lambda i: -self.scores[i]) for w in windows]


def draws(n, *, seed):
    rng = random.Random(seed)
    return [round(rng.random(), 4) for _ in range(n)]


def best(scores, k):
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:k]


def frame(scores, **columns):
    texts = [f"Review {i} [score={s}]" for i, s in enumerate(scores)]
    return pl.DataFrame({"id": list(range(len(scores))), "text": texts, **columns})


def run(endpoint, df, **arguments):
    arguments.setdefault("k", 3)
    return llm_top_k(
        df,
        "text",
        "the most helpful review",
        model="sim",
        endpoint=endpoint.base_url,
        return_report=True,
        **{"cache": False, **arguments},
    )


# -- the plans, on a judge of known truth --------------------------------------------------


def test_quickselect_finds_the_best_k_in_order():
    scores = draws(300, seed=1)
    ranked = quickselect(
        Truth(scores),
        [list(range(300))],
        5,
        seeded_coin(0),
        by_embedding=False,
        seed=0,
        max_waves=max_waves(300),
    )
    assert ranked.best == [best(scores, 5)]


def test_quickselect_ranks_every_group_in_the_same_waves():
    judge = Truth(SCORES)
    ranked = quickselect(
        judge,
        [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]],
        2,
        seeded_coin(0),
        by_embedding=False,
        seed=0,
        max_waves=20,
    )
    assert ranked.best == [[1, 3], [10, 6]] and judge.waves == 1


def test_random_pivot_quickselect_ranks_only_a_sample_in_its_first_wave():
    class FirstWave(Truth):
        def compare(self, pairs):
            self.first = getattr(self, "first", len(pairs))
            return super().compare(pairs)

    judge = FirstWave(draws(400, seed=8))
    quickselect(
        judge, [list(range(400))], 5, seeded_coin(0), by_embedding=False, seed=0, max_waves=17
    )
    assert judge.first == SAMPLE * (SAMPLE - 1) // 2


def test_quickselect_on_a_judge_that_never_answers_ends_within_its_wave_limit():
    judge = Truth(draws(200, seed=2), fails=True)
    ranked = quickselect(
        judge, [list(range(200))], 5, seeded_coin(0), by_embedding=False, seed=0, max_waves=6
    )
    assert judge.waves <= 6 and len(ranked.best[0]) == 5


def test_listwise_asks_the_calls_it_states():
    judge = Truth(draws(500, seed=3))
    ranked = listwise(judge, [list(range(500))], 10, 20)
    assert (judge.asked, judge.waves) == listwise_calls(500, 10, 20)
    assert ranked.best == [best(judge.scores, 10)]


def test_a_failed_ranking_keeps_its_window_in_the_order_it_came():
    ranked = listwise(Truth(SCORES, fails=True), [list(range(12))], 3, 4)
    assert len(ranked.best[0]) == 3 and ranked.unsettled


def test_all_pairs_compares_every_pair_once_in_one_wave():
    judge = Truth(SCORES)
    ranked = all_pairs(judge, [list(range(12))], 12, seeded_coin(0))
    assert (judge.asked, judge.waves) == (66, 1) and ranked.best == [best(SCORES, 12)]


def test_the_seeded_coin_shows_a_pair_alike_both_ways_round():
    orient = seeded_coin(7)
    assert orient(3, 9) == orient(9, 3)


def test_the_seeded_coin_shows_each_item_first_about_half_the_time():
    orient = seeded_coin(0)
    first = sum(orient(0, j)[0] == 0 for j in range(1, 201))
    assert 70 < first < 130


# -- llm_top_k on the simulator ----------------------------------------------------------


@pytest.mark.parametrize("method", ["all_pairs", "quickselect", "listwise"])
def test_each_method_finds_the_best_rows_ranked(endpoint, method):
    out, _ = run(endpoint, frame(SCORES), method=method, window=6)
    assert out["id"].to_list() == best(SCORES, 3) and out["rank"].to_list() == [1, 2, 3]


def test_quickselect_with_an_embedding_model_finds_the_best_rows(endpoint):
    out, _ = run(endpoint, frame(SCORES), method="quickselect", embedding_model="sim-embed")
    assert out["id"].to_list() == best(SCORES, 3)


def test_the_best_of_each_group_keep_their_group_keys(endpoint):
    df = frame(SCORES, shop=["a", "b"] * 6)
    out, _ = run(endpoint, df, k=2, by="shop")
    assert out.select("shop", "id").rows() == [("a", 10), ("a", 6), ("b", 1), ("b", 3)]


def test_auto_compares_all_pairs_of_a_small_frame_and_says_why(endpoint):
    _, report = run(endpoint, frame(SCORES), k=8)
    assert report.plan == "all_pairs" and "no more than quickselect" in report.plan_why


def test_auto_picks_quickselect_for_a_large_frame(endpoint):
    scores = draws(60, seed=4)
    _, report = run(endpoint, frame(scores))
    assert report.plan == "quickselect"


def test_a_rerun_sends_nothing(endpoint, cache):
    run(endpoint, frame(SCORES), method="quickselect", cache=cache)
    endpoint.reset()
    out, _ = run(endpoint, frame(SCORES), method="quickselect", cache=cache)
    assert endpoint.stats()["requests"] == 0 and set(out["rank_status"]) == {"cached"}


def test_a_row_whose_comparisons_failed_says_so(endpoint):
    df = frame(SCORES).with_columns(
        pl.when(pl.col("id") == 10)
        .then(pl.col("text") + " [[sim:status=400]]")
        .otherwise(pl.col("text"))
    )
    with pytest.warns(Warning):
        out, _ = run(endpoint, df, k=12, method="all_pairs")
    failed = out.filter(pl.col("id") == 10)
    assert failed["rank_status"].to_list() == ["failed"]
    assert "failed judgment" in failed["rank_error"][0]


def test_a_spent_budget_skips_what_is_left(endpoint):
    scores = draws(40, seed=5)
    out, report = run(endpoint, frame(scores), method="quickselect", budget=Budget(max_requests=30))
    assert report.requests_sent <= 30 and "skipped" in set(out["rank_status"])


def test_null_values_are_never_ranked(endpoint):
    df = frame(SCORES).with_columns(
        pl.when(pl.col("id") == 10).then(None).otherwise(pl.col("text")).alias("text")
    )
    out, _ = run(endpoint, df, k=1)
    assert out["id"].to_list() == [1]


def test_each_pair_is_shown_in_its_seeded_order_so_a_biased_judge_is_not_favoured(endpoint):
    endpoint.configure(position_bias=1.0)
    out, _ = run(endpoint, frame(SCORES), k=12, method="all_pairs")
    endpoint.configure()
    assert out["id"].to_list() != list(range(12))


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"method": "heap"}, "method must be one of"),
        ({"method": "listwise", "window": 3}, "window > k"),
        ({"k": 0}, "k must be"),
        ({"by": "nope"}, "no group column"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_sent(endpoint, arguments, says):
    with pytest.raises(ConfigError, match=says):
        run(endpoint, frame(SCORES), **arguments)
    assert endpoint.stats()["requests"] == 0


def test_last_report_names_the_operator_and_its_waves(endpoint):
    run(endpoint, frame(SCORES), method="quickselect")
    report = last_report()
    assert report.operator == "llm_top_k" and report.waves >= 1


# -- the estimate ------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["all_pairs", "listwise", "quickselect"])
def test_the_estimate_is_within_a_quarter_of_the_calls_sent(endpoint, method):
    scores = draws(80, seed=6)
    arguments = {"k": 5, "method": method, "window": 10}
    estimate = estimate_set(
        llm_top_k,
        frame(scores),
        column="text",
        criterion="the most helpful review",
        model="sim",
        **arguments,
    )
    run(endpoint, frame(scores), **arguments)
    sent = endpoint.stats()["requests"]
    assert abs(estimate.calls - sent) <= 0.25 * sent


# -- the expressions -----------------------------------------------------------------------


def test_top_k_in_group_by_agg_lists_each_groups_best(endpoint):
    df = frame(SCORES, shop=["a", "b"] * 6)
    out = df.group_by("shop", maintain_order=True).agg(
        pl.col("text").llm.top_k(
            "the most helpful review", k=1, model="sim", endpoint=endpoint.base_url, cache=False
        )
    )
    assert out.rows() == [("a", ["Review 10 [score=0.97]"]), ("b", ["Review 1 [score=0.92]"])]


def test_rank_over_groups_ranks_each_group(endpoint):
    df = frame(SCORES[:6], shop=["a", "a", "a", "b", "b", "b"])
    out = df.with_columns(
        pl.col("text")
        .llm.rank("the most helpful review", model="sim", endpoint=endpoint.base_url, cache=False)
        .over("shop")
        .alias("rank")
    )
    assert out["rank"].to_list() == [2, 1, 3, 1, 2, 3]
