"""Accounting: what a job spent per model, and what each lever saved.

A lever's saving is priced from the tokens of the answers it reused or the requests it spared,
at the price of the model the job would otherwise have sent them to (see
:data:`~llm_ops.LEVERS`). What a job spent bills the input tokens the server read from its
prefix cache (``Counters.cached_tokens``) at the cached-input price. That discount is the
server's, not a lever's: the requests a lever spared are priced at the full input price (which
of their tokens a server would have found in its prefix cache is not known), and so is what the
job spent when a saving is worked out (see :func:`prefix_discount`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from .._options import Job
from .._outcome import Counters
from .._pricing import Price, add_costs, cost_or_none, subtract_costs
from .._report import ModelUsage, RunCosts, RunFacts, RunReport, Saving, make_report
from .._status import ANSWERED


def account(
    job: Job,
    facts: RunFacts,
    *,
    distinct: pl.DataFrame,
    hits: pl.DataFrame,
    results: pl.DataFrame,
) -> RunReport:
    """The report of one model's pass: counts, tokens and cost, per model and per lever.

    ``distinct`` holds the pass's distinct requests, ``hits`` the cache's answers to them (the
    exact cache's, and those another job sharing it sent meanwhile), ``results`` every settled
    request (:data:`~llm_ops._status.RESULTS`)."""
    tallies = tally(distinct, results, cache_hits=hits["key"])
    return usage_report(job, facts, tallies)


def usage_report(job: Job, facts: RunFacts, tallies: dict[str, Tally]) -> RunReport:
    """The report of a run (one model's pass, or a table's chunks) from what it measured and
    the :func:`tally` of its requests: counts, tokens and cost, per model and per lever.

    Everything is priced first, so the report is made once, complete."""
    counters = facts.counters
    completions = completion_cost(job, counters)
    embeddings = embedding_cost(job, counters)
    cost = add_costs(completions, embeddings)
    discount = prefix_discount(job.price, counters.cached_tokens, counters.cache_write_tokens)
    at_full_input_price = add_costs(cost, discount)
    answered_rows = sum(n for status, n in facts.statuses.items() if status in ANSWERED)
    costs = RunCosts(
        cost=cost,
        cost_saved=subtract_costs(tallies["every_row"].cost(job.live_price), at_full_input_price),
        savings=lever_savings(
            job,
            tallies,
            cached=facts.cache is not None,
            counters=counters,
            on_completions=completions,
            on_embeddings=embeddings,
        ),
        models=model_usage(job, counters, answered_rows, completions, embeddings),
        reasoning_cost=reasoning_cost(job, counters),
    )
    return make_report(facts, costs)


def completion_cost(job: Job, counters: Counters) -> float | None:
    """What the completions counted in ``counters`` cost under the price of ``job.model``,
    the input the server read from its prefix cache at the cached-input price."""
    return cost_or_none(
        job.price,
        requests=counters.answered,
        input_tokens=counters.prompt_tokens,
        output_tokens=counters.completion_tokens,
        cached_input_tokens=counters.cached_tokens,
        cache_write_tokens=counters.cache_write_tokens,
        images=counters.images,
    )


def reasoning_cost(job: Job, counters: Counters) -> float | None:
    """What the thinking counted in ``counters`` cost: reasoning tokens are part of the
    completion tokens and billed at the output price, so this is a share of
    :func:`completion_cost`, not an addition to it."""
    return cost_or_none(
        job.price, requests=0, input_tokens=0, output_tokens=counters.reasoning_tokens
    )


def prefix_discount(price: Price | None, cached: int, written: int = 0) -> float:
    """What the ``cached`` input tokens read from the server's prefix cache saved (full input
    price minus the cached-input price), less what the ``written`` ones, written to a
    provider's prompt cache, cost above the input price; 0 when the price is unknown."""
    if price is None or not (cached or written):
        return 0.0
    tokens = cached + written
    full = price.cost(requests=0, input_tokens=tokens, output_tokens=0)
    billed = price.cost(
        requests=0,
        input_tokens=tokens,
        output_tokens=0,
        cached_input_tokens=cached,
        cache_write_tokens=written,
    )
    return round(full - billed, 10)


def embedding_cost(job: Job, counters: Counters) -> float | None:
    """What the semantic cache's embeddings counted in ``counters`` cost."""
    if job.semantic is None:
        return 0.0
    return cost_or_none(
        job.semantic_price,
        requests=counters.embedding_requests,
        input_tokens=counters.embedding_tokens,
        output_tokens=0,
    )


def spent_by(job: Job, counters: Counters) -> tuple[float, int, int]:
    """Dollars (0 when unknown), requests and tokens that ``counters`` count, embeddings
    included: what a budget shared with later work gives up (see :meth:`Job.after`)."""
    return (
        (completion_cost(job, counters) or 0.0) + (embedding_cost(job, counters) or 0.0),
        counters.sent + counters.embedding_requests,
        counters.prompt_tokens + counters.completion_tokens + counters.embedding_tokens,
    )


def model_usage(
    job: Job,
    counters: Counters,
    answered_rows: int,
    completions: float | None,
    embeddings: float | None,
) -> dict[str, ModelUsage]:
    """Per model: the job's model, and the semantic cache's embedding model when it is on."""
    models = {
        job.spec.model: ModelUsage(
            rows=answered_rows,
            requests=counters.sent,
            prompt_tokens=counters.prompt_tokens,
            completion_tokens=counters.completion_tokens,
            cost=completions,
        )
    }
    if job.semantic is not None:
        models[job.semantic.model] = ModelUsage(
            requests=counters.embedding_requests,
            prompt_tokens=counters.embedding_tokens,
            cost=embeddings,
        )
    return models


@dataclass(frozen=True)
class Tally:
    """Requests and their tokens, priced with :meth:`cost`."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def cost(self, price: Price | None) -> float | None:
        return cost_or_none(
            price,
            requests=self.requests,
            input_tokens=self.prompt_tokens,
            output_tokens=self.completion_tokens,
        )

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.requests + other.requests,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )

    def __sub__(self, other: Tally) -> Tally:
        return Tally(
            self.requests - other.requests,
            self.prompt_tokens - other.prompt_tokens,
            self.completion_tokens - other.completion_tokens,
        )


def tally(
    distinct: pl.DataFrame, results: pl.DataFrame, cache_hits: pl.Series | None = None
) -> dict[str, Tally]:
    """Requests and tokens as if each row were sent (``every_row``), each distinct request
    once (``each_distinct``), and for those answered by the cache tiers (``cache``: the keys
    in ``cache_hits``; ``similar``); a request without an answer counts no tokens."""
    hits = cache_hits if cache_hits is not None else pl.Series([], dtype=pl.String)
    per_key = (
        distinct.select("key", "rows")
        .join(
            results.select("key", "status", "prompt_tokens", "completion_tokens"),
            on="key",
            how="left",
        )
        .with_columns(
            pl.col("prompt_tokens", "completion_tokens").fill_null(0), once=pl.lit(1, pl.Int64)
        )
    )

    def sums(frame: pl.DataFrame, weight: pl.Expr) -> Tally:
        row = frame.select(
            weight.sum().alias("requests"),
            (weight * pl.col("prompt_tokens")).sum().alias("prompt"),
            (weight * pl.col("completion_tokens")).sum().alias("completion"),
        ).row(0)
        return Tally(*(int(value or 0) for value in row))

    once = pl.col("once")
    return {
        "every_row": sums(per_key, pl.col("rows")),
        "each_distinct": sums(per_key, once),
        "cache": sums(per_key.filter(pl.col("key").is_in(hits.implode())), once),
        "similar": sums(per_key.filter(pl.col("status") == "similar"), once),
    }


def lever_savings(
    job: Job,
    tallies: dict[str, Tally],
    *,
    cached: bool,
    counters: Counters,
    on_completions: float | None,
    on_embeddings: float | None,
) -> dict[str, Saving]:
    """Requests and dollars saved by each lever the job used (see :data:`~llm_ops.LEVERS`),
    given what the job spent on completions (its bill, prefix-cache discount included) and on
    embeddings."""
    every_row, each = tallies["every_row"], tallies["each_distinct"]
    cache, similar = tallies["cache"], tallies["similar"]
    savings = {"dedupe": _saving(every_row - each, job.price)}
    if cached:
        savings["cache"] = _saving(cache, job.price)
    if job.packing.rows_per_request > 1:
        sent = each - cache - similar
        discount = prefix_discount(job.price, counters.cached_tokens, counters.cache_write_tokens)
        spent = add_costs(on_completions, discount)
        savings["packing"] = Saving(
            sent.requests - counters.sent, subtract_costs(sent.cost(job.price), spent)
        )
    if job.semantic is not None:
        savings["semantic_cache"] = Saving(
            similar.requests, subtract_costs(similar.cost(job.price), on_embeddings)
        )
    if job.batching is not None:
        live = cost_or_none(
            job.live_price,
            requests=counters.answered,
            input_tokens=counters.prompt_tokens,
            output_tokens=counters.completion_tokens,
            cached_input_tokens=counters.cached_tokens,
            cache_write_tokens=counters.cache_write_tokens,
        )
        savings["batch"] = Saving(0, subtract_costs(live, on_completions))
    return savings


def _saving(counted: Tally, price: Price | None) -> Saving:
    return Saving(counted.requests, counted.cost(price))
