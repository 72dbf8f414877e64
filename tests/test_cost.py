"""Prices, estimates before running, budgets while running, savings after."""

from __future__ import annotations

import functools

import polars as pl
import pytest

from llm_ops import (
    Budget,
    ConfigError,
    Endpoint,
    Packing,
    Price,
    Retries,
    Sampling,
    estimate,
    llm_complete,
)
from llm_ops._pricing import price_hint

DUPLICATED = pl.DataFrame({"text": [f"item {i % 20}" for i in range(60)] + [None]})
LIST_PRICE = Price(0.15, 0.60)  # the simulator is free: tests of amounts give it a price


def test_the_estimate_counts_what_a_run_then_sends(complete, endpoint, cache):
    for k in (1, 8):
        plan = estimate(
            DUPLICATED,
            prompt="{text}",
            model="sim",
            endpoint=endpoint.base_url,
            packing=Packing(rows_per_request=k),
            cache=cache,
        )
        endpoint.reset()
        DUPLICATED.pipe(complete, prompt="{text}", packing=Packing(rows_per_request=k), cache=False)
        assert plan.requests == endpoint.stats()["requests"] == (20 if k == 1 else 3)


def test_the_estimate_counts_cache_hits_and_packing_savings(complete, endpoint, cache):
    DUPLICATED.head(10).pipe(
        complete, prompt="{text}", sampling=Sampling(max_tokens=10)
    )  # same requests
    plan = estimate(
        DUPLICATED,
        prompt="{text}",
        model="sim",
        endpoint=endpoint.base_url,
        packing=Packing(rows_per_request=4),
        sampling=Sampling(max_tokens=10),
        cache=cache,
        pricing=LIST_PRICE,
    )
    assert (plan.distinct_requests, plan.cache_hits, plan.requests_without_packing) == (20, 10, 10)
    assert plan.requests == 3 and plan.output_tokens_max == 100
    assert 0 < plan.cost_min < plan.cost_max


def test_per_request_and_per_token_prices_give_the_documented_figures(complete):
    frame = pl.DataFrame({"text": ["a", "b", "c", "d"]})
    _, flat = frame.pipe(
        complete, prompt="{text}", pricing=Price(per_request=0.5), return_report=True, cache=False
    )
    assert flat.cost == 2.0
    per_token = Price(input_per_million=2.0, output_per_million=8.0)
    _, report = frame.pipe(
        complete, prompt="{text}", pricing=per_token, return_report=True, cache=False
    )
    assert report.cost == pytest.approx(
        (2.0 * report.prompt_tokens + 8.0 * report.completion_tokens) / 1e6
    )


def test_an_unknown_model_has_an_unknown_cost_not_zero(complete, endpoint):
    endpoint.configure(models=("mystery",))
    _, report = pl.DataFrame({"text": ["a"]}).pipe(
        complete, prompt="{text}", model="mystery", return_report=True
    )
    assert report.cost is None and "cost                  unknown" in str(report)


def test_an_unknown_cost_says_how_to_give_a_price(complete, endpoint):
    endpoint.configure(models=("mystery",))
    _, report = pl.DataFrame({"text": ["a"]}).pipe(
        complete, prompt="{text}", model="mystery", return_report=True
    )
    assert price_hint(["mystery"]) in str(report)
    assert "--pricing mystery=IN,OUT on the command line" in price_hint(["mystery"])


def test_a_free_model_costs_nothing_rather_than_an_unknown(complete, endpoint):
    endpoint.configure(models=("my-llama",))
    _, report = pl.DataFrame({"text": ["a"]}).pipe(
        complete, prompt="{text}", model="my-llama", pricing="free", return_report=True
    )
    assert report.cost == 0.0 and "cost unknown" not in str(report)


def test_savings_are_what_the_job_would_have_cost_without_cache_and_dedupe(complete):
    complete = functools.partial(complete, pricing=LIST_PRICE)
    _, no_cache = DUPLICATED.pipe(complete, prompt="{text}", cache=False, return_report=True)
    DUPLICATED.pipe(complete, prompt="{text}")
    _, rerun = DUPLICATED.pipe(complete, prompt="{text}", return_report=True)
    assert rerun.cost == 0
    assert rerun.cost_saved == pytest.approx(no_cache.cost + no_cache.cost_saved)
    assert no_cache.cost_saved == pytest.approx(2 * no_cache.cost)  # each prompt thrice


def test_a_budget_stops_sending_and_skips_the_rest(complete, endpoint):
    frame = pl.DataFrame({"text": [f"row {i}" for i in range(50)]})
    out, report = frame.pipe(
        complete,
        prompt="{text}",
        pricing=Price(per_request=0.01),
        budget=Budget(max_cost=0.1),
        concurrency=4,
        return_report=True,
    )
    assert endpoint.stats()["requests"] == 10
    assert report.statuses["ok"] == 10 and report.statuses["skipped"] == 40
    assert report.budget_stop == "max_cost=$0.1 would be exceeded"
    assert out["completion_error"].drop_nulls()[0].startswith("not sent: the budget stopped")
    endpoint.reset()
    frame.pipe(complete, prompt="{text}")
    assert endpoint.stats()["requests"] == 40


def test_request_and_token_budgets(complete, endpoint):
    frame = pl.DataFrame({"text": [f"row {i}" for i in range(30)]})
    frame.pipe(complete, prompt="{text}", budget=Budget(max_requests=7), concurrency=3)
    assert endpoint.stats()["requests"] == 7
    _, report = frame.pipe(
        complete,
        prompt="{text}",
        sampling=Sampling(max_tokens=10),
        budget=Budget(max_tokens_total=100),
        return_report=True,
    )
    assert report.prompt_tokens + report.completion_tokens <= 100


def test_max_cost_needs_a_price(complete):
    with pytest.raises(ConfigError, match="max_cost needs a price"):
        pl.DataFrame({"text": ["a"]}).pipe(
            complete, prompt="{text}", model="mystery", budget=Budget(max_cost=1.0)
        )


def test_estimate_takes_exactly_what_llm_complete_takes(endpoint, cache):
    df = pl.DataFrame({"text": ["a", "b", "a", None]})
    kwargs = dict(
        prompt="Say {text}",
        model="sim",
        endpoint=Endpoint(endpoint.base_url, api_key="sk-test-0123456789"),
        retries=Retries(timeout=30.0),
        sampling=Sampling(seed=7, top_p=0.5, stop=["\n"], max_tokens=20),
        cache=cache,
        concurrency=4,
        progress=False,
    )
    before = estimate(df, **kwargs)
    _, report = df.pipe(llm_complete, return_report=True, **kwargs)
    after = estimate(df, **kwargs)
    assert before.requests == report.requests_sent == 2
    assert (after.cache_hits, after.requests) == (2, 0)


def test_an_estimate_for_an_unpriced_model_says_how_to_price_it():
    plan = estimate(pl.DataFrame({"text": ["a"]}), prompt="{text}", model="gpt4o-mini", cache=False)
    assert "no price for 'gpt4o-mini' (did you mean 'gpt-4o-mini'?)" in str(plan)


def test_an_estimate_and_a_report_give_the_same_price_hint(endpoint):
    endpoint.configure(models=("mystery",))
    options = dict(prompt="{text}", model="mystery", endpoint=endpoint.base_url, cache=False)
    plan = estimate(pl.DataFrame({"text": ["a"]}), **options)
    _, report = pl.DataFrame({"text": ["a"]}).pipe(llm_complete, return_report=True, **options)
    assert price_hint(["mystery"]) in str(plan) and price_hint(["mystery"]) in str(report)


def test_the_estimate_of_a_job_the_cache_answers_costs_nothing(complete, endpoint, cache):
    endpoint.configure(models=("mystery",))
    frame = pl.DataFrame({"text": ["a", "b"]})
    frame.pipe(complete, prompt="{text}", model="mystery")
    plan = estimate(
        frame, prompt="{text}", model="mystery", endpoint=endpoint.base_url, cache=cache
    )
    assert (plan.requests, plan.cost_min, plan.cost_max) == (0, 0.0, 0.0)
    assert "cost                 $0.0000 to $0.0000" in str(plan) and "no price" not in str(plan)


def test_a_job_the_cache_answers_costs_nothing_even_unpriced(complete, endpoint):
    endpoint.configure(models=("mystery",))
    frame = pl.DataFrame({"text": ["a"]})
    frame.pipe(complete, prompt="{text}", model="mystery")
    _, rerun = frame.pipe(complete, prompt="{text}", model="mystery", return_report=True)
    assert rerun.cost == 0.0 and "cost unknown" not in str(rerun)


def test_the_simulators_models_are_free(complete):
    _, report = pl.DataFrame({"text": ["a", "b"]}).pipe(
        complete, prompt="{text}", return_report=True, cache=False
    )
    assert report.requests_sent == 2 and report.cost == 0.0
