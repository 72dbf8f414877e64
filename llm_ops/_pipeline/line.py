"""One pass of a job over a frame, for one model: the pipeline.

::

    plan ─▶ cache lookup ─▶ dispatch ─▶ persist ─▶ join back ─▶ report
    (_plan)  (_cache)      (_dispatch)  (_persist)  (_join)     (_savings, _report)

Levers sit beside the line: packing shapes the requests (:mod:`llm_ops._pack`), the semantic
cache answers misses by similarity before they are sent (:mod:`llm_ops._pipeline.similar`), a budget
stops sending (:mod:`llm_ops._pricing`), batch mode sends through the provider's Batch API
(:mod:`llm_ops._pipeline.batch`), and a cascade runs passes model after model
(:mod:`llm_ops._pipeline.cascade`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import polars as pl

from .._failures import failure_reasons
from .._options import Job
from .._pricing import SpendingCap
from .._report import RunFacts, RunReport
from .._telemetry import count_cost, record, span
from .backend import Backend
from .dispatch import DispatchResult, dispatch, rows_of
from .join import join, results_frame, status_counts
from .plan import plan
from .savings import account
from .similar import answer_by_similarity


async def answer_misses(
    misses: pl.DataFrame,
    job: Job,
    backend: Backend,
    *,
    rows: int,
    budget: SpendingCap | None = None,
) -> DispatchResult:
    """Answer the cache misses: by similarity where the semantic cache lever is on, which
    hands what it cannot answer back to dispatch, else by sending them; ``rows`` is the job's
    row count, for progress; ``budget`` the job's (else a fresh one)."""
    budget = job.budget() if budget is None else budget
    if job.semantic is None:
        return await dispatch(
            misses, job, backend, rows=rows, rows_settled=rows - rows_of(misses), budget=budget
        )

    async def send(requests: pl.DataFrame, waiting: int) -> DispatchResult:
        settled = rows - rows_of(requests) - waiting
        return await dispatch(
            requests, job, backend, rows=rows, rows_settled=settled, budget=budget
        )

    return await answer_by_similarity(misses, job, backend, send=send, budget=budget)


@dataclass
class ModelPass:
    """One model's pass over (some of) a job's rows: the new columns and what it took."""

    columns: pl.DataFrame
    report: RunReport  # not recorded: the caller records the job's report
    row_keys: pl.DataFrame  # key per row
    results: pl.DataFrame  # RESULTS per distinct request
    stopped: BaseException | None


async def run_once(frame: pl.DataFrame, job: Job, backend: Backend) -> ModelPass:
    """Plan, look up both cache tiers, send the misses and join back, for ``job.spec.model``."""
    started_at, clock = datetime.now(UTC), time.perf_counter()
    with span("llm_ops.plan", {"llm_ops.rows": frame.height}) as planning:
        planned = await plan(frame, job.spec, backend.cache, reasoning=job.columns.reasoning)
        record(
            planning,
            {
                "llm_ops.distinct_requests": planned.distinct.height,
                "llm_ops.cache_hits": planned.hits.height,
                "llm_ops.misses": planned.misses.height,
            },
        )
    with span("llm_ops.dispatch", {"llm_ops.requests": planned.misses.height}) as dispatching:
        done = await answer_misses(planned.misses, job, backend, rows=frame.height)
        record(
            dispatching,
            {
                "llm_ops.requests_sent": done.counters.sent,
                "llm_ops.retries": done.counters.retries,
                "llm_ops.rate_limited": done.counters.rate_limited,
                "llm_ops.concurrency": done.counters.concurrency,
            },
        )
    results = results_frame([planned.hits, done.settled], done.outcomes)
    columns = await join(
        planned.groups, results, job.columns, job.spec.schema, row_group=planned.row_group
    )
    # answers another job sharing the cache sent while this one waited are hits too
    claimed = done.settled.filter(pl.col("status") != "similar")
    hits = pl.concat([planned.hits, claimed])
    facts = RunFacts(
        model=job.spec.model,
        endpoint=job.spec.endpoint,
        started_at=started_at,
        wall_seconds=time.perf_counter() - clock,
        rows=frame.height,
        distinct=planned.distinct.height,
        cache_hits=hits.height,
        refreshed=planned.refreshed,
        claimed=claimed.height,
        counters=done.counters,
        statuses=status_counts(columns, job.columns),
        stopped=done.stopped,
        budget_stop=done.budget_stop,
        cache=backend.cache.path if backend.cache else None,
        mode="live" if job.batching is None else "batch",
    )
    report = account(job, facts, distinct=planned.distinct, hits=hits, results=results)
    report = replace(report, errors=failure_reasons(columns, job.columns.status, job.columns.error))
    # counted per model: a cascade's passes each pay their own model's prices
    count_cost(report.cost, {"gen_ai.request.model": job.spec.model, "llm_ops.mode": report.mode})
    row_keys = planned.groups.select("key").gather(planned.row_group)
    return ModelPass(columns, report, row_keys, results, done.stopped)
